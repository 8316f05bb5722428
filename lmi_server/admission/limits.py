"""Per-tenant rate limits as token buckets; no asyncio, no HTTP. They take a clock (a function
returning seconds) so that unit tests run them on a fake one."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


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
