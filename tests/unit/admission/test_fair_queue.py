"""The fair queue and the rate-limit buckets on a fake clock (no asyncio, no HTTP)."""

from __future__ import annotations

import pytest

from lmi_server.admission import FairQueue, Limits, RateLimiter, TokenBucket

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def drain(q: FairQueue, n: int | None = None, eligible=lambda t: True) -> list[str]:
    out = []
    while n is None or len(out) < n:
        e = q.pop(eligible)
        if e is None:
            break
        out.append(e.item)
    return out


def test_a_flood_does_not_put_others_behind_it():
    q = FairQueue("fair")
    for i in range(150):
        q.push("A", f"A{i}")
    q.push("B", "B0")
    q.push("C", "C0")
    assert drain(q, 4) == ["A0", "B0", "C0", "A1"]  # B and C go next, not after 150 of A
    assert drain(q) == [f"A{i}" for i in range(2, 150)]  # FIFO within a tenant


def test_fifo_policy_keeps_arrival_order():
    q = FairQueue("fifo")
    for i in range(3):
        q.push("A", f"A{i}")
    q.push("B", "B0")
    assert drain(q) == ["A0", "A1", "A2", "B0"]


def test_weights_share_slots_in_proportion():
    q = FairQueue("fair", weight={"A": 2.0, "B": 1.0}.get)
    for i in range(30):
        q.push("A", f"A{i}")
        q.push("B", f"B{i}")
    first = drain(q, 30)
    assert sum(x.startswith("A") for x in first) == 20 and sum(x.startswith("B") for x in first) == 10


def test_an_idle_tenant_banks_no_credit():
    q = FairQueue("fair")
    q.push("B", "B0")
    assert drain(q) == ["B0"]
    for i in range(10):  # A alone for a while
        q.push("A", f"A{i}")
    assert drain(q, 5) == [f"A{i}" for i in range(5)]
    for i in range(3):  # B comes back with three: they alternate with A, not all three first
        q.push("B", f"B{i + 1}")
    assert drain(q, 6) == ["B1", "A5", "B2", "A6", "B3", "A7"]


def test_priority_comes_first_across_tenants_and_within_one():
    for policy in ("fair", "fifo"):
        q = FairQueue(policy)
        for i in range(5):
            q.push("low", f"L{i}", priority=0)
        q.push("high", "H0", priority=-1)
        q.push("low", "L-urgent", priority=-5)
        assert drain(q, 3) == ["L-urgent", "H0", "L0"], policy


def test_a_capped_tenant_is_skipped_and_keeps_its_place():
    q = FairQueue("fair")
    for i in range(3):
        q.push("A", f"A{i}")
    q.push("B", "B0")
    assert drain(q, 2, eligible=lambda t: t != "A") == ["B0"]
    assert drain(q) == ["A0", "A1", "A2"]


def test_removed_entries_are_not_handed_out():
    q = FairQueue("fair")
    entries = [q.push("A", f"A{i}") for i in range(3)]
    assert q.remove(entries[0]) and not q.remove(entries[0])
    assert len(q) == 2 and q.waiting("A") == 2
    assert drain(q) == ["A1", "A2"] and len(q) == 0 and q.tenants() == {}


def test_token_bucket_refills_on_the_clock():
    clock = FakeClock()
    b = TokenBucket(rate=2.0, capacity=2.0, clock=clock)
    assert b.wait_s(1) == 0
    b.take(1)
    b.take(1)
    assert b.wait_s(1) == pytest.approx(0.5)
    clock.advance(0.5)
    assert b.wait_s(1) == 0 and b.reset_s() == pytest.approx(0.5)
    clock.advance(10)
    assert b.level() == 2.0  # never above capacity


def test_rate_limiter_requests_and_tokens():
    clock = FakeClock()
    limits = {"alice": Limits(requests_per_second=1), "bob": Limits(tokens_per_minute=600)}
    rl = RateLimiter(lambda t: limits.get(t, Limits()), clock)
    assert rl.check("carol", 10**6).allowed and rl.check("carol").headers == {}  # unlimited: no headers
    first = rl.check("alice")
    assert first.allowed and first.headers["x-ratelimit-limit-requests"] == "1"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    refused = rl.check("alice")
    assert not refused.allowed and refused.exceeded == "requests" and refused.headers["retry-after"] == "1"
    assert refused.headers["x-ratelimit-reset-requests"] == "1s"
    clock.advance(1.0)
    assert rl.check("alice").allowed
    # tokens: 600/min = 10/s, bursts up to 600
    assert rl.check("bob", 500).allowed
    d = rl.check("bob", 200)
    assert not d.allowed and d.exceeded == "tokens" and d.retry_after_s == pytest.approx(10.0)
    assert d.headers["x-ratelimit-remaining-tokens"] == "100" and d.headers["retry-after"] == "10"
    clock.advance(10)
    assert rl.check("bob", 200).allowed
    assert rl.check("bob", 10**6).allowed is False  # more than a minute's worth waits for a full bucket
    clock.advance(60)
    assert rl.check("bob", 10**6).allowed  # ... and then is let through (charged the capacity)
