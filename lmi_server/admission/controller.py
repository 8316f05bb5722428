"""Admission control: a bounded queue in front of the engine, as LMI's `job_queue_size`, shared
fairly between tenants.

Why: vLLM accepts every request and queues it in its scheduler without bound, so under overload
latency grows without limit and a client cannot tell a busy server from a slow one; and one tenant
that sends hundreds of requests at once would put everyone else behind all of them. Here, at most
`slots` requests (the engine's `max_num_seqs`: what it can run at once) are in the engine; up to
`queue_size` more wait here. When a slot frees it goes to the next request in fair order across
tenants (`queue.FairQueue` in the order of the policy named by option.admission_policy,
`policy.py`: "fair" is weighted, priority first, FIFO within a tenant; "fifo" keeps one arrival
order for all). Refusals: the queue full, 503 with Retry-After (LMI's status for
a full job queue); one tenant holding its share of the queue (`tenant_queue_share`), 429; a request
that waited longer than `max_wait_s`, 503, before it reaches the engine; a draining server, 503.

Slot headroom (fair policy): while another tenant is present (has requests in flight or waiting,
or sent one within the last `PRESENCE_S` seconds), a tenant beyond its weighted share of the slots
takes a free slot only if `reserved_slots` slots stay free, so that another tenant's request starts
at once instead of waiting for someone else's stream to end (running streams cannot be preempted).
Alone, a tenant takes any free slot, up to `tenant_cap` when the reserved slots were added to the
engine on top of the batch size (`runtime.fair_headroom`). With others present a tenant also waits
until its last streamed request has its first token (`PREFILLS_WHILE_SHARED`), within its share
or beyond it: a flood's first requests and its refills then enter the engine one prefill per step,
where a batch's worth at once made one long step that a newcomer arriving during it waited behind
(its TTFT doubled; measured, `benchmarks/fairness.py`; a flood's first five prefills in one step
held every probe sent in the next seconds, `benchmarks/fairness.py --tenants adapters`). And beyond
its share a tenant takes no slot at all while another tenant's streamed request awaits its first
token (`YIELD_TO_FIRST_TOKENS`): the newcomer's prefill step then holds none of the flood's
prefills, and the flood's streams that end meanwhile leave that step smaller.

The wait bound holds even when the event loop is late: each waiter carries its own deadline,
enforced by one timer (the earliest deadline) and checked again whenever a slot is handed out or a
request arrives, so a slot freed after a waiter's deadline never admits it. (asyncio.wait_for's
timer alone fired 43 s late under a fast stream; see README, Reliability.)

A ticket is held from admission until the response has been sent (streams included); the HTTP
layer releases it whatever happens (client gone, error, cancellation). No HTTP here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from lmi_server.admission.policy import policy_named
from lmi_server.admission.queue import DEFAULT_TENANT, Entry, FairQueue
from lmi_server.metric_labels import tenant_label  # bounded: option.metrics_max_tenants

log = logging.getLogger(__name__)

QUEUE_DEPTH = Gauge("lmi_queue_depth", "Requests waiting for an engine slot (option.job_queue_size bounds it)")
IN_ENGINE = Gauge("lmi_requests_in_engine", "Requests admitted to the engine and not yet answered")
REJECTED = Counter(
    "lmi_requests_rejected_total", "Requests refused before reaching the engine", ["reason"]
)
TENANT_QUEUE_DEPTH = Gauge("lmi_tenant_queue_depth", "Requests waiting for an engine slot, by tenant", ["tenant"])
TENANT_IN_ENGINE = Gauge("lmi_tenant_requests_in_engine", "Requests in the engine, by tenant", ["tenant"])
TENANT_REQUESTS = Counter(
    "lmi_tenant_requests", "Requests by tenant and admission outcome (admitted or the refusal's reason)",
    ["tenant", "outcome"],
)
TENANT_WAIT = Histogram(
    "lmi_tenant_queue_wait_seconds", "Time admitted requests waited for an engine slot, by tenant", ["tenant"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

PRESENCE_S = 60.0
"""A tenant counts as present this long after its last request (for slot reservation)."""
PREFILLS_WHILE_SHARED = 1
"""Fair policy, others present: a tenant (within its share or beyond) takes a slot only while fewer
of its streamed requests than this await their first token. A flood's requests then enter the
engine one prefill per step instead of a batch's worth in one long step, which a newcomer arriving
meanwhile would wait behind."""

YIELD_TO_FIRST_TOKENS = True
"""Fair policy: a tenant beyond its share takes no slot while another tenant's streamed request
awaits its first token, so that request's prefill step holds none of its prefills. Within its
share a tenant is never held back: a flood keeps at least its share however often others come."""


class Rejected(Exception):
    """Refused before reaching the engine. `reason`: queue_full, queue_timeout, draining (503),
    tenant_queue_full or rate_limited (429). The HTTP layer (api/errors.py) maps it."""

    STATUS = {"tenant_queue_full": 429, "rate_limited": 429}

    def __init__(self, reason: str, message: str, retry_after_s: int, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.headers["retry-after"] = str(retry_after_s)

    @property
    def status(self) -> int:
        return self.STATUS.get(self.reason, 503)


class BadPriority(ValueError):
    """The x-priority header (or the priority field) is not an integer in range; a 400."""


def count(tenant: str, outcome: str) -> None:
    TENANT_REQUESTS.labels(tenant=tenant_label(tenant), outcome=outcome).inc()


@dataclass
class Ticket:
    admission: "Admission"
    admitted_at: float
    tenant: str = DEFAULT_TENANT
    waited_s: float = 0.0
    released: bool = False
    awaiting_first: bool = False

    def expect_first_token(self) -> None:
        """A stream is admitted: until its first chunk its tenant, when beyond its share, takes no
        further slot (`_eligible`). Non-streamed requests are not tracked (their first token is not
        seen here)."""
        if not self.released and not self.awaiting_first:
            self.awaiting_first = True
            self.admission._awaiting_first[self.tenant] += 1

    def first_token(self) -> None:
        if self.awaiting_first:
            self.awaiting_first = False
            self.admission._first_token(self.tenant)

    def release(self) -> None:
        if not self.released:
            self.first_token()
            self.released = True
            self.admission._release(self.tenant)


@dataclass(eq=False)
class _Waiter:
    """What a queued request waits on: the future its ticket arrives in, and whether it streams."""

    future: asyncio.Future
    stream: bool = False

    def done(self) -> bool:
        return self.future.done()


@dataclass
class Admission:
    queue_size: int
    max_wait_s: float | None = None
    slots: int | None = None
    """None until the engine tells its max_num_seqs (`set_slots`)."""
    policy: str = "fair"
    """The name of a registered policy (`policy.POLICIES`): "fair" or "fifo"."""
    tenant_queue_share: float = 1.0
    """Share of queue_size one tenant may fill; its requests past that get 429."""
    reserved_slots: int | None = None
    """Fair policy: slots a tenant beyond its share leaves free while others are present; None: config.options.default_reserved_slots(slots)."""
    weights: dict[str, float] = field(default_factory=dict)
    tenant_cap: int | None = None
    """Most slots one tenant holds, alone or not (the batch size the reserved slots were added to)."""
    clock: Callable[[], float] = time.monotonic
    draining: bool = False
    active: int = 0
    _queue: FairQueue = field(init=False)
    _deadlines: collections.deque = field(default_factory=collections.deque)
    _held: collections.Counter = field(default_factory=collections.Counter)
    _awaiting_first: collections.Counter = field(default_factory=collections.Counter)
    _seen: dict = field(default_factory=dict)
    _timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self._policy = policy_named(self.policy)
        self._queue = FairQueue(self._policy, lambda tenant: self.weights.get(tenant, 1.0))

    # ------------------------------------------------------------------ state
    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return self.active + self.waiting

    def held(self, tenant: str) -> int:
        return self._held[tenant]

    def set_slots(self, slots: int) -> None:
        self.slots = max(1, int(slots))
        self._wake()

    def _has_slot(self) -> bool:
        return self.slots is None or self.active < self.slots

    def _reserve(self) -> int:
        return self._policy.reserve(self.slots, self.reserved_slots)

    def _present(self, now: float) -> list[str]:
        """Tenants with requests in flight or waiting, or one sent within PRESENCE_S."""
        present = []
        for name, seen in list(self._seen.items()):
            if self._held[name] or self._queue.waiting(name) or now - seen < PRESENCE_S:
                present.append(name)
            else:
                del self._seen[name]  # gone: forget it
        return present

    def _eligible(self, tenant: str) -> bool:
        """May `tenant` take a free slot now? Alone, always; with others present, while none of its
        streams awaits its first token: within its weighted share of the slots always, beyond it
        only if `reserved_slots` slots stay free for the others and no other tenant's stream awaits
        its first token; never past `tenant_cap`."""
        if self.tenant_cap is not None and self._held[tenant] >= self.tenant_cap:
            return False
        reserve = self._reserve()
        if not reserve:
            return True
        present = set(self._present(self.clock())) | {tenant}
        if len(present) == 1:
            return True
        if self._awaiting_first[tenant] >= PREFILLS_WHILE_SHARED:
            return False  # its requests trickle in: no long burst step for a newcomer to wait behind
        weight = self.weights.get(tenant, 1.0)
        share = self.slots * weight / sum(self.weights.get(t, 1.0) for t in present)
        if self._held[tenant] + 1 <= share:
            return True
        if YIELD_TO_FIRST_TOKENS and any(n != tenant and k > 0 for n, k in self._awaiting_first.items()):
            return False  # another tenant's prefill step comes first, without this one's
        return self.slots - self.active - 1 >= reserve

    def queue_cap(self) -> int:
        """Waiting requests one tenant may have."""
        return max(1, math.floor(self.tenant_queue_share * self.queue_size))

    # ------------------------------------------------------------------ refusals
    def _reject(self, reason: str, message: str, retry_after_s: int, tenant: str = DEFAULT_TENANT) -> Rejected:
        REJECTED.labels(reason=reason).inc()
        count(tenant, reason)
        return Rejected(reason, message, retry_after_s)

    def _expire(self) -> None:
        """Drop every waiter whose deadline has passed (503 queue_timeout)."""
        now = self.clock()
        while self._deadlines:
            entry: Entry = self._deadlines[0]
            if entry.removed or entry.item.done():
                self._deadlines.popleft()
                continue
            if entry.deadline is None or entry.deadline > now:
                break
            self._deadlines.popleft()
            self._queue.remove(entry)
            self._gauge(entry.tenant)
            entry.item.future.set_exception(
                self._reject(
                    "queue_timeout",
                    f"waited {now - entry.deadline + self.max_wait_s:.1f} s for an engine slot "
                    f"(option.max_queue_wait={self.max_wait_s:g}); retry later",
                    1,
                    entry.tenant,
                )
            )
        QUEUE_DEPTH.set(self.waiting)

    def _arm(self) -> None:
        """One timer, for the earliest deadline still waiting."""
        if self._timer is not None:
            return
        while self._deadlines and (self._deadlines[0].removed or self._deadlines[0].item.done()):
            self._deadlines.popleft()
        if not self._deadlines:
            return
        delay = max(0.0, self._deadlines[0].deadline - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire()
        self._wake()  # a tenant's slot cap may have lifted meanwhile
        self._arm()

    # ------------------------------------------------------------------ admission
    async def acquire(self, tenant: str = DEFAULT_TENANT, priority: int = 0, *, stream: bool = False) -> Ticket:
        """An engine slot for `tenant`, now or after waiting in fair order. `stream`: the response
        streams, so the ticket awaits its first token from admission on (`Ticket.expect_first_token`)."""
        if self.draining:
            raise self._reject("draining", "the server is shutting down; send the request to another instance", 5, tenant)
        now = self.clock()
        self._seen[tenant] = now
        self._wake()  # expired waiters out; anyone a freed slot or a lifted cap lets in
        if self._has_slot() and self._eligible(tenant):
            return self._admitted(self._hand(tenant, stream), 0.0)
        if self._queue.waiting(tenant) >= self.queue_cap() and self.queue_cap() < self.queue_size:
            raise self._reject(
                "tenant_queue_full",
                f"too many requests waiting for tenant {tenant!r}: {self._queue.waiting(tenant)} "
                f"(option.tenant_queue_share={self.tenant_queue_share:g} of option.job_queue_size={self.queue_size}); "
                "retry later",
                1,
                tenant,
            )
        if self.waiting >= self.queue_size:
            raise self._reject(
                "queue_full",
                f"server busy: {self.active} requests in the engine and {self.waiting} waiting "
                f"(option.job_queue_size={self.queue_size}); retry later",
                1,
                tenant,
            )
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        deadline = now + self.max_wait_s if self.max_wait_s is not None else None
        entry = self._queue.push(tenant, _Waiter(waiter, stream), priority, deadline)
        if deadline is not None:
            self._deadlines.append(entry)  # deadlines come in arrival order (one max_wait_s)
            self._arm()
        self._gauge(tenant)
        try:
            ticket: Ticket = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().release()  # the slot handed to us goes to the next waiter
            elif not waiter.done():
                waiter.cancel()
            if self._queue.remove(entry):
                self._gauge(tenant)
            raise
        return self._admitted(ticket, self.clock() - now)

    def _admitted(self, ticket: Ticket, waited_s: float) -> Ticket:
        ticket.waited_s = waited_s
        TENANT_WAIT.labels(tenant=tenant_label(ticket.tenant)).observe(waited_s)
        count(ticket.tenant, "admitted")
        return ticket

    def _hand(self, tenant: str, stream: bool) -> Ticket:
        """The slot is the ticket's from here on (counted before the waiter runs again)."""
        self.active += 1
        self._held[tenant] += 1
        IN_ENGINE.set(self.active)
        TENANT_IN_ENGINE.labels(tenant=tenant_label(tenant)).set(self._held[tenant])
        ticket = Ticket(self, self.clock(), tenant)
        if stream:
            ticket.expect_first_token()
        return ticket

    def _release(self, tenant: str = DEFAULT_TENANT) -> None:
        self.active = max(0, self.active - 1)
        self._held[tenant] = max(0, self._held[tenant] - 1)
        TENANT_IN_ENGINE.labels(tenant=tenant_label(tenant)).set(self._held[tenant])
        if not self._held[tenant]:
            del self._held[tenant]
        IN_ENGINE.set(self.active)
        self._wake()

    def _first_token(self, tenant: str) -> None:
        self._awaiting_first[tenant] -= 1
        if self._awaiting_first[tenant] <= 0:
            del self._awaiting_first[tenant]
        self._wake()

    def _gauge(self, tenant: str) -> None:
        QUEUE_DEPTH.set(self.waiting)
        TENANT_QUEUE_DEPTH.labels(tenant=tenant_label(tenant)).set(self._queue.waiting(tenant))

    def _wake(self) -> None:
        """Hand free slots to waiters in fair order; an expired waiter never gets one."""
        self._expire()
        while self._has_slot():
            entry = self._queue.pop(self._eligible)
            if entry is None:
                break
            self._gauge(entry.tenant)
            if entry.item.done():
                continue
            entry.item.future.set_result(self._hand(entry.tenant, entry.item.stream))
        QUEUE_DEPTH.set(self.waiting)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; False when the timeout came first."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return not self.in_flight
