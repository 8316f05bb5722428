"""Admission control: a bounded queue in front of the engine, as LMI's `job_queue_size`.

Why: vLLM accepts every request and queues it in its scheduler without bound, so under overload
latency grows without limit and a client cannot tell a busy server from a slow one. Here, at most
`slots` requests (the engine's `max_num_seqs`: what it can run at once) are in the engine; up to
`queue_size` more wait here, first come first served; past that a request is refused at once
(503 with Retry-After, LMI's status for a full job queue), and a request that waited longer than
`max_wait_s` is dropped before it reaches the engine. A draining server refuses new requests.

A ticket is held from admission until the response has been sent (streams included); the app's
`AdmissionReleaseMiddleware` releases it whatever happens (client gone, error, cancellation).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

QUEUE_DEPTH = Gauge("lmi_queue_depth", "Requests waiting for an engine slot (option.job_queue_size bounds it)")
IN_ENGINE = Gauge("lmi_requests_in_engine", "Requests admitted to the engine and not yet answered")
REJECTED = Counter(
    "lmi_requests_rejected_total", "Requests refused before reaching the engine", ["reason"]
)

TICKET_KEY = "lmi_admission_ticket"


class Rejected(Exception):
    """Refused before reaching the engine; `reason` is queue_full, queue_timeout or draining."""

    def __init__(self, reason: str, message: str, retry_after_s: int):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass
class Ticket:
    admission: "Admission"
    admitted_at: float
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release()


@dataclass
class Admission:
    queue_size: int
    max_wait_s: float | None = None
    slots: int | None = None
    """None until the engine tells its max_num_seqs (`set_slots`)."""
    draining: bool = False
    active: int = 0
    _waiters: collections.deque = field(default_factory=collections.deque)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    @property
    def in_flight(self) -> int:
        return self.active + self.waiting

    def set_slots(self, slots: int) -> None:
        self.slots = max(1, int(slots))
        self._wake()

    def _has_slot(self) -> bool:
        return self.slots is None or self.active < self.slots

    def _reject(self, reason: str, message: str, retry_after_s: int) -> Rejected:
        REJECTED.labels(reason=reason).inc()
        return Rejected(reason, message, retry_after_s)

    async def acquire(self) -> Ticket:
        if self.draining:
            raise self._reject("draining", "the server is shutting down; send the request to another instance", 5)
        if self._has_slot() and not self.waiting:
            return self._admit()
        if self.waiting >= self.queue_size:
            raise self._reject(
                "queue_full",
                f"server busy: {self.active} requests in the engine and {self.waiting} waiting "
                f"(option.job_queue_size={self.queue_size}); retry later",
                1,
            )
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        QUEUE_DEPTH.set(self.waiting)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=self.max_wait_s)
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():  # a slot arrived at the last moment
                return self._take(waiter)
            waiter.cancel()
            raise self._reject(
                "queue_timeout",
                f"waited {self.max_wait_s:g} s for an engine slot (option.max_queue_wait); retry later",
                1,
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot handed to us goes to the next waiter
            waiter.cancel()
            raise
        finally:
            QUEUE_DEPTH.set(self.waiting)
        return self._take(waiter)

    def _take(self, waiter: asyncio.Future) -> Ticket:
        # _wake() already counted this request as active when it handed over the slot.
        return Ticket(self, time.monotonic())

    def _admit(self) -> Ticket:
        self.active += 1
        IN_ENGINE.set(self.active)
        return Ticket(self, time.monotonic())

    def _release(self) -> None:
        self.active = max(0, self.active - 1)
        IN_ENGINE.set(self.active)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._has_slot():
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.active += 1  # the slot is handed over before the waiter runs again
            IN_ENGINE.set(self.active)
            waiter.set_result(None)
        QUEUE_DEPTH.set(self.waiting)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; False when the timeout came first."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return not self.in_flight


class AdmissionReleaseMiddleware:
    """Releases the request's admission ticket once the response is over, however it ended."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            ticket = scope.get("state", {}).get(TICKET_KEY)
            if ticket is not None:
                ticket.release()
