"""vLLM's scheduler with one change: the first prefill of a tenant running less than its share
gets an engine step of its own.

Why: fair admission (`admission/controller.py`) lets another tenant's request into the engine at
once, but vLLM then runs its prefill in the same step as every running request's decode. Under a
flood of one tenant that step holds the flood's whole batch of decodes, so the other tenant's first
token waits for them: its TTFT was 1.6-2.3x its solo TTFT (benchmarks/fairness.py --tenants
adapters). Here, when a request waits for its first prefill and its tenant runs fewer than an equal
share of the running requests (none at all, or one probe beside a flood of eight), the running
requests skip one decode step (vLLM's own `next_decode_eligible_step`, the cadence pipeline
parallelism uses) and other waiting requests wait one step more: the step holds those prefills
alone, as vLLM's first scheduler did for every prefill.

Invariants kept: vLLM admits a waiting request only if its LoRA fits beside the LoRAs of the
requests it scheduled this step, which in vLLM's own steps are all the running ones. In a cleared
step the running requests are not scheduled, so vLLM's check alone would let in adapters beyond
`max_loras` beside the running set, and the next step, which schedules everyone, breaks vLLM's
`len(scheduled_loras) <= max_loras` (the engine dies). So a cleared step takes only newcomers
whose adapters fit, counted with every running request's adapter (`fitting`), and none while
requests holding KV blocks wait (vLLM drains those first, whatever their adapter).

An adapter slot for a newcomer: with more busy adapters than `max_loras`, vLLM admits a waiting
request only when its adapter fits, and a flood keeps its adapter running by its refills, so a
newcomer on another adapter would wait for the whole flood. While a newcomer's adapter does not
fit, the waiting requests of the running adapter with the fewest running requests are held back
(`drained_adapter`): its running ones end, its slot frees, and the newcomer's adapter is admitted
(in a cleared step, or by vLLM). The held requests keep their place in the queue. Token budget,
encoder budget and slots stay vLLM's to enforce: the cleared step is vLLM's own `schedule`.

Bounds: never two such steps in a row (however many tenants arrive, the running requests lose at
most every other step); only when the engine has a free sequence slot; never for a tenant that
runs its share or more (a flood's refills mix with its decodes as before, and tenants running alike
clear no step for each other). Each such step is logged. The tenant is what the server's admission
named (`TENANT_ARG` in the request's `extra_args`, set by `api/pipeline.py`), else the request's
LoRA adapter.

`option.tenant_prefill_step` (on under the fair policy) makes the runtime name this class as vLLM's
`scheduler_cls` (`runtime/fair_slots.py`); the engine process imports it from there.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from lmi_server.compat import vllm as compat_vllm
from lmi_server.engine_log import engine_logger

log = engine_logger(__name__)

TENANT_ARG = "lmi_tenant"
"""The key of SamplingParams.extra_args (a body's `vllm_xargs`) that names a request's tenant."""
CLEARED = "prefill step of its own for a tenant under its share"
"""The start of each cleared step's log line."""
DRAINING = "adapter slot for a newcomer"
"""The start of the log line when an adapter is drained for a newcomer's adapter."""
WAITING_LOOKED_AT = 64
"""Waiting requests looked at per step: the server's admission keeps vLLM's queue short."""


def tenant_of(request: Any) -> tuple[str, Any]:
    """The tenant the server's admission named for `request`, else its adapter (0: base model)."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
    if TENANT_ARG in extra:
        return ("tenant", str(extra[TENANT_ARG]))
    lora = getattr(request, "lora_request", None)
    return ("adapter", lora.lora_int_id if lora is not None else 0)


def is_first_prefill(request: Any) -> bool:
    """Waiting for its first step: nothing generated, never preempted, ready to run."""
    return request.status == RequestStatus.WAITING and request.num_output_tokens == 0 and not request.num_preemptions


def newcomers(waiting: Iterable[Any], running: list[Any]) -> list[Any]:
    """The waiting requests, in queue order, that await their first prefill and whose tenant runs
    less than an equal share of the running requests (none at all, or fewer than the others), while
    running requests decode (else none: nothing to keep them from)."""
    if not any(not getattr(r, "is_prefill_chunk", False) for r in running):
        return []
    counts = collections.Counter(tenant_of(r) for r in running)
    found = []
    for i, request in enumerate(waiting):
        if i >= WAITING_LOOKED_AT:
            break
        tenant = tenant_of(request)
        share = len(running) / (len(counts) + (tenant not in counts))
        if is_first_prefill(request) and counts[tenant] < share:
            found.append(request)
    return found


def lora_id(request: Any) -> int:
    lora = getattr(request, "lora_request", None)
    return lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else 0


def fitting(due: list[Any], running: list[Any], max_loras: int | None) -> list[Any]:
    """The newcomers, in order, whose adapters fit with those of every running request within
    `max_loras` distinct adapters (None: LoRA off, all fit); the base model always fits."""
    if max_loras is None:
        return due
    loras = {lora_id(r) for r in running} - {0}
    found = []
    for request in due:
        lora = lora_id(request)
        if lora and lora not in loras:
            if len(loras) >= max_loras:
                continue
            loras.add(lora)
        found.append(request)
    return found


def drained_adapter(blocked: list[Any], running: list[Any]) -> int | None:
    """The running adapter whose waiting requests wait for its running ones to end, while a
    newcomer's adapter does not fit within max_loras (`blocked`): the one running the fewest
    requests (the quickest to free its slot; lowest id on a tie). None: nothing blocked."""
    if not any(lora_id(r) for r in blocked):
        return None
    counts = collections.Counter(lora_id(r) for r in running if lora_id(r))
    return min(counts, key=lambda lora: (counts[lora], lora)) if counts else None


class TenantPrefillScheduler(Scheduler):
    """vLLM's Scheduler (or AsyncScheduler, where vLLM runs asynchronous scheduling) that clears a
    step for the first prefill of a tenant under its share (see the module docstring)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        config = kwargs.get("vllm_config", args[0] if args else None)
        asynchronous = bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))
        if cls is TenantPrefillScheduler and asynchronous:
            cls = AsyncTenantPrefillScheduler
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cleared_steps = 0
        """Steps cleared so far."""
        self._cleared_step = -1
        self._drained: int | None = None  # the adapter last drained (for the log)

    def _newcomers(self) -> tuple[list[Any], list[Any]]:
        """(due, blocked): newcomers that get a cleared step, and newcomers whose adapter does not
        fit beside the running ones (see `drained_adapter`)."""
        if not self.waiting or len(self.running) >= self.max_num_running_reqs:
            return [], []  # nobody waits (most steps); no slot for a newcomer
        if compat_vllm.kv_holding_waiting(self):
            return [], []  # vLLM admits these first in any step, whatever their adapter
        found = newcomers(self.waiting, self.running)
        max_loras = self.lora_config.max_loras if self.lora_config else None
        due = fitting(found, self.running, max_loras)
        blocked = [r for r in found if r not in due]
        if self._cleared_step == self.current_step:
            return [], blocked  # never two cleared steps in a row
        return due, blocked

    def schedule(self, *args: Any, **kwargs: Any):
        due, blocked = self._newcomers()
        if due:
            return self._cleared(due, *args, **kwargs)
        drained = drained_adapter(blocked, self.running)
        held = [r for r in self.waiting if lora_id(r) == drained] if drained else []
        if not held:
            return super().schedule(*args, **kwargs)
        if drained != self._drained:
            log.info("%s: adapter %d's waiting requests wait until its %d running ones end, so that a newcomer's adapter fits "
                     "within max_loras", DRAINING, drained, sum(lora_id(r) == drained for r in self.running))
        self._drained = drained
        order = {id(r): i for i, r in enumerate(self.waiting)}
        self.waiting.remove_requests(held)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            rest = list(self.waiting)  # what vLLM left (and put back: requests it preempted, in front)
            self.waiting.remove_requests(rest)
            for request in sorted(rest + held, key=lambda r: order.get(id(r), -1)):
                self.waiting.add_request(request)

    def _cleared(self, due: list[Any], *args: Any, **kwargs: Any):
        # schedule() advances current_step, then skips a running request while
        # current_step < next_decode_eligible_step: +2 skips the coming step alone.
        for request in self.running:
            compat_vllm.defer_decode(request, self.current_step + 2)
        self._cleared_step = self.current_step + 1
        self.cleared_steps += 1
        log.info("%s: step %d holds %d first prefill(s) alone, %d running requests skip it (steps cleared so far: %d)",
                 CLEARED, self._cleared_step, len(due), len(self.running), self.cleared_steps)
        # The step sees those prefills alone: other waiting requests (a flood's refills) wait one step.
        # Newcomers it does not schedule go back in front of the queue, in their order.
        with compat_vllm.waiting_swapped(self, due):
            return super().schedule(*args, **kwargs)


class AsyncTenantPrefillScheduler(TenantPrefillScheduler, AsyncScheduler):
    """The same over vLLM's AsyncScheduler (GPU hosts with asynchronous scheduling)."""
