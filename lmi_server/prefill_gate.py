"""With LoRA on, a request that asks for prompt log-probabilities prefills alone in the engine.

Why: vLLM 0.32 computes prompt log-probabilities by passing one request's prompt rows (one per
token) through the LoRA logits processor, whose adapter indices are one per request of the whole
step. With two or more requests in that step the sizes differ and the CPU kernel
(`punica_cpu.add_lora_logits` -> `bgmv_shrink`) raises, which kills the engine; with one request
the single index broadcasts and the result is right. A request with `n > 1` (its `n` sequences
prefill in one step) no ordering can make safe: `engine_limits` refuses it.

How: the engine's own `generate` is replaced on the engine object itself (`install`, through
`compat.vllm.wrap_engine_generate`), so every
generation passes the gate whichever front door or serving object calls it (chat, completions,
LMI's /invocations, Responses, Anthropic Messages, and any door added later): one place, not a
list of serving objects. Ordinary generations hold the gate shared for as long as they run; one that computes
prompt log-probabilities takes it exclusively, so it enters the engine only when nothing else is
there and nothing else enters until its first output (its prefill, prompt log-probabilities
included, is then done), after which it runs on as a shared holder. Waiters are served in arrival
order, so neither kind starves the other. The price is a drain of the engine per such request; a
non-streamed one sees only its final output (vLLM hands it over once), so it stays alone to its end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from lmi_server.compat import vllm as compat_vllm


def wants_exclusive(sampling_params: Any) -> bool:
    """vLLM computes prompt log-probabilities for it (the request's final sampling parameters)."""
    return getattr(sampling_params, "prompt_logprobs", None) is not None


class PrefillGate:
    """A shared/exclusive gate in strict arrival order. Holders are generations in the engine; an
    exclusive holder turns shared (`Hold.started`) once its prefill is done. Every state change is
    synchronous (one event loop), so a cancelled waiter or holder can never leave it inconsistent."""

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[bool, asyncio.Future]] = collections.deque()
        self._exclusive_active = False
        self.running = 0
        self.exclusive_served = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _may_enter(self, exclusive: bool) -> bool:
        if self._exclusive_active:
            return False
        return self.running == 0 if exclusive else True

    def _enter(self, exclusive: bool) -> None:
        self.running += 1
        if exclusive:
            self._exclusive_active = True
            self.exclusive_served += 1

    def _wake(self) -> None:
        while self._queue:
            exclusive, future = self._queue[0]
            if future.done():
                self._queue.popleft()
                continue
            if not self._may_enter(exclusive):
                return
            self._queue.popleft()
            self._enter(exclusive)
            future.set_result(None)

    async def _acquire(self, exclusive: bool) -> None:
        if not self._queue and self._may_enter(exclusive):
            self._enter(exclusive)
            return
        entry = (exclusive, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        try:
            await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self._end(exclusive)  # let in just as it was cancelled: give the place back
            else:
                with contextlib.suppress(ValueError):
                    self._queue.remove(entry)
                self._wake()
            raise

    def _end_exclusive(self) -> None:
        self._exclusive_active = False
        self._wake()

    def _end(self, exclusive: bool) -> None:
        self.running -= 1
        if exclusive:
            self._exclusive_active = False
        self._wake()

    @contextlib.asynccontextmanager
    async def hold(self, exclusive: bool) -> AsyncIterator["Hold"]:
        await self._acquire(exclusive)
        hold = Hold(self, exclusive)
        try:
            yield hold
        finally:
            hold.release()


class Hold:
    """One generation's place in the gate."""

    def __init__(self, gate: PrefillGate, exclusive: bool):
        self.gate = gate
        self.exclusive = exclusive
        self.released = False

    def started(self) -> None:
        """The first output arrived: an exclusive holder's prefill is over, others may enter."""
        if self.exclusive and not self.released:
            self.exclusive = False
            self.gate._end_exclusive()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._end(self.exclusive)


def _sampling_params(args: tuple, kwargs: dict) -> Any:
    """The sampling parameters of an `AsyncLLM.generate(prompt, sampling_params, request_id, ...)` call."""
    return kwargs["sampling_params"] if "sampling_params" in kwargs else (args[1] if len(args) > 1 else None)


def gated(generate: Callable[..., AsyncIterator[Any]], gate: PrefillGate) -> Callable[..., AsyncIterator[Any]]:
    """`generate` (the engine's bound method) passed through the gate."""

    async def gated_generate(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with gate.hold(wants_exclusive(_sampling_params(args, kwargs))) as hold:
            async for output in generate(*args, **kwargs):
                hold.started()
                yield output

    gated_generate.lmi_gate = gate  # type: ignore[attr-defined]
    gated_generate.__wrapped__ = generate  # type: ignore[attr-defined]
    return gated_generate


def install(engine: Any, gate: PrefillGate) -> bool:
    """Put the gate in the engine's own `generate` (an attribute of the engine object, which the
    class's method stands behind); False when this engine already has it. Run on every engine build
    (a rebuilt engine is a new object)."""
    return compat_vllm.wrap_engine_generate(engine, lambda generate: gated(generate, gate), "lmi_gate")
