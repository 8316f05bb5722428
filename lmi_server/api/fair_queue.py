"""The pieces of multi-tenant admission that know nothing of asyncio or HTTP: the waiting queue
that hands engine slots to tenants in weighted fair order, and the token buckets of per-tenant
rate limits. Both take a clock (a function returning seconds) so that unit tests run them on a fake
one.

Fair order: every tenant has its own queue (FIFO within a priority); a tenant with requests
waiting carries a virtual time tag, and the next slot goes to the waiting tenant with the lowest
(head priority, tag). Serving a tenant advances its tag by 1/weight; a tenant that starts waiting
again gets the current virtual time (the tag of the tenant served last), so an idle tenant neither
banks credit nor falls behind a busy one. That is start-time fair queuing with one unit of cost per
request: with weights 2 and 1 and both tenants backlogged, slots go 2:1. Priority comes first
(lower value = earlier, as vLLM's `priority`), across tenants too. The "fifo" policy keeps one
arrival order for all (priority still first): the behaviour before tenants existed.

A tenant may be at its slot cap (see `Admission`): the queue then skips it for that slot, and its
requests keep their place.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Clock = Callable[[], float]
Policy = Literal["fair", "fifo"]

DEFAULT_TENANT = "default"


@dataclass(eq=False)
class Entry:
    """One waiting request; `item` is whatever the caller queues (the admission's future)."""

    tenant: str
    priority: int
    seq: int
    item: Any
    deadline: float | None = None
    removed: bool = False


@dataclass(eq=False)
class _Tenant:
    weight: float
    tag: float = 0.0
    heap: list = field(default_factory=list)  # (priority, seq, entry)
    live: int = 0


class FairQueue:
    """Waiting requests by tenant; `pop` hands out the next one in fair (or FIFO) order."""

    def __init__(self, policy: Policy = "fair", weight: Callable[[str], float] = lambda tenant: 1.0):
        if policy not in ("fair", "fifo"):
            raise ValueError(f"unknown policy {policy!r}: fair or fifo")
        self.policy = policy
        self._weight = weight
        self._tenants: dict[str, _Tenant] = {}
        self._seq = itertools.count()
        self._vtime = 0.0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def waiting(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return t.live if t else 0

    def tenants(self) -> dict[str, int]:
        """Waiting requests per tenant (tenants with none left out)."""
        return {name: t.live for name, t in self._tenants.items() if t.live}

    def push(self, tenant: str, item: Any, priority: int = 0, deadline: float | None = None) -> Entry:
        t = self._tenants.get(tenant)
        if t is None:
            if len(self._tenants) >= 64:  # forget idle tenants that are owed nothing
                for name in [n for n, x in self._tenants.items() if not x.live and x.tag <= self._vtime]:
                    del self._tenants[name]
            t = self._tenants[tenant] = _Tenant(weight=max(1e-6, float(self._weight(tenant))))
        if t.live == 0:  # starts waiting (again): no banked credit, no debt
            t.tag = max(t.tag, self._vtime)
        entry = Entry(tenant, int(priority), next(self._seq), item, deadline)
        heapq.heappush(t.heap, (entry.priority, entry.seq, entry))
        t.live += 1
        self._live += 1
        return entry

    def remove(self, entry: Entry) -> bool:
        """Take a waiting entry out (cancelled, expired); False when it was no longer waiting."""
        if entry.removed:
            return False
        entry.removed = True
        t = self._tenants[entry.tenant]
        t.live -= 1
        self._live -= 1
        self._trim(entry.tenant, t)
        return True

    def _head(self, t: _Tenant) -> Entry | None:
        while t.heap and t.heap[0][2].removed:
            heapq.heappop(t.heap)
        return t.heap[0][2] if t.heap else None

    def _trim(self, name: str, t: _Tenant) -> None:
        self._head(t)
        if not t.live and t.tag <= self._vtime:  # nothing to remember: forget the tenant
            del self._tenants[name]

    def peek(self, eligible: Callable[[str], bool] = lambda tenant: True) -> Entry | None:
        """The entry `pop` would hand out, among tenants for which `eligible(tenant)` holds."""
        best, best_key = None, None
        for name, t in self._tenants.items():
            if not t.live or not eligible(name):
                continue
            head = self._head(t)
            assert head is not None
            key = (head.priority, t.tag, head.seq) if self.policy == "fair" else (head.priority, head.seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def pop(self, eligible: Callable[[str], bool] = lambda tenant: True) -> Entry | None:
        entry = self.peek(eligible)
        if entry is None:
            return None
        t = self._tenants[entry.tenant]
        heapq.heappop(t.heap)
        entry.removed = True
        t.live -= 1
        self._live -= 1
        self._vtime = max(self._vtime, t.tag)
        t.tag += 1.0 / t.weight
        self._trim(entry.tenant, t)
        return entry


class TokenBucket:
    """`rate` units per second up to `capacity`; starts full."""

    def __init__(self, rate: float, capacity: float, clock: Clock):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be positive")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._clock = clock
        self._level = self.capacity
        self._at = clock()

    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` (at most the capacity) can be taken; 0 when it can now."""
        need = min(float(amount), self.capacity) - self.level()
        return max(0.0, need / self.rate)

    def take(self, amount: float) -> None:
        self.level()
        self._level -= min(float(amount), self.capacity)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level()) / self.rate)


@dataclass(frozen=True)
class Limits:
    """A tenant's rate limits; None: unlimited."""

    requests_per_second: float | None = None
    tokens_per_minute: float | None = None


@dataclass
class Decision:
    allowed: bool
    retry_after_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    exceeded: str = ""  # "requests" or "tokens" when refused


def _duration(seconds: float) -> str:
    """OpenAI's reset format: 1s, 6m0s, 250ms."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    seconds = math.ceil(seconds * 10) / 10
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.1f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class RateLimiter:
    """Per-tenant request and token buckets. Requests: `requests_per_second`, bursts of up to one
    second's worth (at least 1). Tokens: `tokens_per_minute`, bursts of up to a minute's worth.
    A request is charged only when both buckets have room; refused, it takes nothing."""

    def __init__(self, limits: Callable[[str], Limits], clock: Clock, max_tenants: int = 10000):
        self._limits = limits
        self._clock = clock
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}
        self.max_tenants = max_tenants

    def _for(self, tenant: str) -> tuple[TokenBucket | None, TokenBucket | None]:
        buckets = self._buckets.get(tenant)
        if buckets is None:
            lim = self._limits(tenant)
            req = tok = None
            if lim.requests_per_second:
                req = TokenBucket(lim.requests_per_second, max(1.0, lim.requests_per_second), self._clock)
            if lim.tokens_per_minute:
                tok = TokenBucket(lim.tokens_per_minute / 60.0, lim.tokens_per_minute, self._clock)
            if len(self._buckets) >= self.max_tenants:
                self._forget_full()
            buckets = self._buckets[tenant] = (req, tok)
        return buckets

    def _forget_full(self) -> None:
        """Drop the buckets that are full again (they hold no state worth keeping)."""
        for name in [n for n, (r, t) in self._buckets.items() if all(b is None or b.reset_s() == 0 for b in (r, t))]:
            del self._buckets[name]

    def check(self, tenant: str, tokens: int = 0) -> Decision:
        req, tok = self._for(tenant)
        if req is None and tok is None:
            return Decision(True)
        waits = {}
        if req is not None:
            waits["requests"] = req.wait_s(1)
        if tok is not None:
            waits["tokens"] = tok.wait_s(tokens)
        refused = {k: v for k, v in waits.items() if v > 0}
        if not refused:
            if req is not None:
                req.take(1)
            if tok is not None:
                tok.take(tokens)
        headers: dict[str, str] = {}
        for name, bucket in (("requests", req), ("tokens", tok)):
            if bucket is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.capacity) if bucket.capacity.is_integer() else bucket.capacity)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(bucket.level())))
            headers[f"x-ratelimit-reset-{name}"] = _duration(bucket.reset_s())
        if refused:
            worst = max(refused, key=refused.get)
            retry = refused[worst]
            headers["retry-after"] = str(max(1, math.ceil(retry)))
            return Decision(False, retry, headers, exceeded=worst)
        return Decision(True, 0.0, headers)
