"""The bounded queue in front of the engine (option.job_queue_size, option.max_queue_wait)."""

from __future__ import annotations

import asyncio
import time

import pytest

from lmi_server.admission import REJECTED, Admission, Rejected

pytestmark = pytest.mark.unit


def rejected(reason: str) -> float:
    return REJECTED.labels(reason=reason)._value.get()


def run(coro):
    return asyncio.run(coro)


def test_slots_then_queue_then_refusal():
    async def scenario():
        adm = Admission(queue_size=2, slots=2)
        t1, t2 = await adm.acquire(), await adm.acquire()
        assert adm.active == 2
        w1 = asyncio.create_task(adm.acquire())
        w2 = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        assert adm.waiting == 2
        before = rejected("queue_full")
        with pytest.raises(Rejected) as info:
            await adm.acquire()
        assert info.value.reason == "queue_full" and "job_queue_size=2" in info.value.message
        assert info.value.retry_after_s >= 1 and rejected("queue_full") == before + 1
        t1.release()
        t3 = await w1  # first come, first served
        assert not w2.done() and adm.active == 2
        t2.release()
        t4 = await w2
        for t in (t3, t4):
            t.release()
            t.release()  # releasing twice is harmless
        assert adm.active == 0 and adm.in_flight == 0

    run(scenario())


def test_waiting_too_long_is_dropped_before_the_engine():
    async def scenario():
        adm = Admission(queue_size=5, slots=1, max_wait_s=0.05)
        held = await adm.acquire()
        with pytest.raises(Rejected) as info:
            await adm.acquire()
        assert info.value.reason == "queue_timeout" and "option.max_queue_wait" in info.value.message
        assert adm.waiting == 0 and adm.active == 1
        held.release()
        (await adm.acquire()).release()

    run(scenario())


def test_cancelled_waiter_gives_its_slot_to_the_next():
    async def scenario():
        adm = Admission(queue_size=5, slots=1)
        held = await adm.acquire()
        gone = asyncio.create_task(adm.acquire())
        nxt = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        gone.cancel()  # the client went away while waiting
        await asyncio.sleep(0)
        held.release()
        ticket = await asyncio.wait_for(nxt, 1)
        assert adm.active == 1
        ticket.release()
        assert adm.active == 0 and adm.in_flight == 0

    run(scenario())


def test_draining_refuses_new_requests_and_waits_for_in_flight():
    async def scenario():
        adm = Admission(queue_size=5, slots=4)
        held = await adm.acquire()
        adm.draining = True
        with pytest.raises(Rejected) as info:
            await adm.acquire()
        assert info.value.reason == "draining"
        assert not await adm.wait_idle(0.1)
        asyncio.get_running_loop().call_later(0.1, held.release)
        assert await adm.wait_idle(2)

    run(scenario())


def test_unknown_slots_admit_until_the_engine_tells():
    async def scenario():
        adm = Admission(queue_size=0)
        tickets = [await adm.acquire() for _ in range(3)]
        adm.set_slots(3)
        with pytest.raises(Rejected):
            await adm.acquire()
        for t in tickets:
            t.release()

    run(scenario())


# ---------------------------------------------------------------- the wait bound under a busy loop


async def hog(seconds: float) -> int:
    """Hold the event loop without ever suspending: `await` on a future that is already done
    returns at once (as a fast engine's outputs do when they are always ready)."""
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        await done
        n += 1
    return n


def test_a_slot_freed_after_the_deadline_does_not_admit_a_late_waiter():
    """The loop was held past the waiter's deadline, then the slot came free: the waiter is dropped
    (queue_timeout), not admitted late because its timer had not run yet."""

    async def scenario():
        adm = Admission(queue_size=5, slots=1, max_wait_s=0.05)
        held = await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)  # queued

        async def busy_then_release():
            await hog(0.3)
            held.release()

        await asyncio.gather(busy_then_release(), asyncio.sleep(0))
        with pytest.raises(Rejected) as info:
            await waiter
        assert info.value.reason == "queue_timeout"
        assert adm.active == 0 and adm.waiting == 0

    run(scenario())


def test_a_stream_that_is_always_ready_still_lets_the_deadline_fire():
    """A response stream whose source never makes it wait, passed through `yielding` as every
    response stream is: the waiter's 503 comes at its deadline, not when the stream ends."""
    from lmi_server.api.respond import yielding

    async def always_ready(seconds: float):
        end = time.monotonic() + seconds
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        while time.monotonic() < end:
            await done
            yield b"data: {}\n\n"

    async def scenario(wrap):
        adm = Admission(queue_size=5, slots=1, max_wait_s=0.1)
        held = await adm.acquire()

        async def stream():
            async for _ in wrap(always_ready(1.0)):
                pass
            held.release()

        streaming = asyncio.create_task(stream())
        t0 = time.monotonic()
        with pytest.raises(Rejected):
            await adm.acquire()
        late = time.monotonic() - t0
        await streaming
        return late

    assert run(scenario(yielding)) < 0.5
    assert run(scenario(lambda body: body)) >= 0.9  # what a stream did before: the timer waited for it


# ---------------------------------------------------------------- tenants


def test_a_flood_from_one_tenant_does_not_hold_back_another():
    async def scenario():
        adm = Admission(queue_size=100, slots=2, policy="fair", reserved_slots=0)
        a = [await adm.acquire("A"), await adm.acquire("A")]
        flood = [asyncio.create_task(adm.acquire("A")) for _ in range(20)]
        await asyncio.sleep(0)
        b = asyncio.create_task(adm.acquire("B"))
        await asyncio.sleep(0)
        a[0].release()
        await asyncio.sleep(0)
        assert flood[0].done() and not b.done()  # A's first waiter came before B
        a[1].release()
        await asyncio.sleep(0)
        assert b.done() and not flood[1].done()  # then B, not the other 19 of A
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)

    run(scenario())


def test_fifo_policy_serves_by_arrival():
    async def scenario():
        adm = Admission(queue_size=100, slots=1, policy="fifo")
        held = await adm.acquire("A")
        flood = [asyncio.create_task(adm.acquire("A")) for _ in range(3)]
        await asyncio.sleep(0)
        b = asyncio.create_task(adm.acquire("B"))
        await asyncio.sleep(0)
        for _ in range(3):
            held.release()
            await asyncio.sleep(0)
            held = next(t.result() for t in flood if t.done() and not t.result().released)
            assert not b.done()
        held.release()
        await asyncio.sleep(0)
        assert b.done()

    run(scenario())


def test_one_tenant_cannot_fill_the_queue():
    async def scenario():
        adm = Admission(queue_size=4, slots=1, tenant_queue_share=0.5)
        held = await adm.acquire("A")
        waiting = [asyncio.create_task(adm.acquire("A")) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Rejected) as info:
            await adm.acquire("A")
        assert info.value.reason == "tenant_queue_full" and info.value.status == 429
        assert info.value.headers["retry-after"] == "1" and "tenant 'A'" in info.value.message
        others = [asyncio.create_task(adm.acquire("B")) for _ in range(2)]  # others still get in
        await asyncio.sleep(0)
        assert adm.waiting == 4
        with pytest.raises(Rejected) as info:
            await adm.acquire("C")
        assert info.value.reason == "queue_full" and info.value.status == 503
        for t in waiting + others:
            t.cancel()
        await asyncio.gather(*waiting, *others, return_exceptions=True)
        held.release()

    run(scenario())


def test_reserved_slots_let_a_newcomer_start_at_once():
    async def scenario():
        adm = Admission(queue_size=100, slots=4, policy="fair", reserved_slots=1)  # A and B present: a share of 2 each
        alone = [await adm.acquire("A") for _ in range(4)]  # alone, A gets every slot
        assert adm.active == 4
        for t in alone:
            t.release()
        adm._seen["B"] = adm.clock()  # B is present (sent a request a moment ago)
        a = [asyncio.create_task(adm.acquire("A")) for _ in range(6)]
        await asyncio.sleep(0)
        assert adm.held("A") == 3 and adm.waiting == 3  # beyond its share, A leaves one slot free
        b = await asyncio.wait_for(adm.acquire("B"), 1)  # starts at once
        assert adm.active == 4
        b.release()
        await asyncio.sleep(0)
        assert adm.held("A") == 3  # the reserved slot is not given back to A while B is present
        for t in a:
            t.cancel()
        await asyncio.gather(*a, return_exceptions=True)

    run(scenario())


def test_a_high_priority_request_goes_first():
    async def scenario():
        adm = Admission(queue_size=100, slots=1)
        held = await adm.acquire("A")
        low = [asyncio.create_task(adm.acquire("A", priority=0)) for _ in range(5)]
        await asyncio.sleep(0)
        high = asyncio.create_task(adm.acquire("A", priority=-1))
        await asyncio.sleep(0)
        held.release()
        await asyncio.sleep(0)
        assert high.done() and not any(t.done() for t in low)
        for t in low:
            t.cancel()
        await asyncio.gather(*low, return_exceptions=True)

    run(scenario())


def test_added_slots_keep_a_lone_tenant_at_the_batch_size_and_start_others_at_once():
    async def scenario():
        # runtime.fair_headroom: batch 4 + 2 reserved slots = an engine of 6; one tenant holds at most 4
        adm = Admission(queue_size=100, slots=6, policy="fair", reserved_slots=2, tenant_cap=4)
        a = [asyncio.create_task(adm.acquire("A")) for _ in range(8)]
        await asyncio.sleep(0)
        assert adm.held("A") == 4 and adm.waiting == 4  # alone: the batch size, as without fair admission
        b = await asyncio.wait_for(adm.acquire("B"), 1)
        c = await asyncio.wait_for(adm.acquire("C"), 1)  # both start at once, in the added slots
        assert adm.active == 6 and adm.held("A") == 4
        b.release()
        await asyncio.sleep(0)
        assert adm.held("A") == 4  # the freed slot is not A's: it is already at its cap
        c.release()
        for t in a:
            t.cancel()
        await asyncio.gather(*a, return_exceptions=True)

    run(scenario())


def test_a_released_ticket_clears_its_first_token_wait():
    async def scenario():
        adm = Admission(queue_size=10, slots=4, policy="fair", reserved_slots=1)
        t = await adm.acquire("B")
        t.expect_first_token()
        assert adm._awaiting_first["B"] == 1
        t.release()  # ended (or failed) before any chunk
        assert not adm._awaiting_first
        t.first_token()
        assert not adm._awaiting_first

    run(scenario())


def test_a_streamed_request_awaits_its_first_token_from_admission():
    """A stream's wait for its first token starts when it is admitted, before its response starts:
    a flood's refill admitted while the newcomer is still being prepared would precede its prefill."""

    async def scenario():
        adm = Admission(queue_size=10, slots=4, policy="fair", reserved_slots=1)
        streamed = await adm.acquire("B", stream=True)
        plain = await adm.acquire("C")
        assert adm._awaiting_first == {"B": 1}
        streamed.expect_first_token()  # the response starting later changes nothing
        assert adm._awaiting_first == {"B": 1}
        streamed.first_token()
        assert not adm._awaiting_first
        streamed.release()
        plain.release()

    run(scenario())


def test_with_others_present_a_flood_enters_one_prefill_at_a_time():
    """With another tenant present, a streaming flood gets a slot only while none of its requests
    awaits its first token, within its share and beyond: its first requests and its refills enter
    the engine one per step, not as one long burst step."""

    async def scenario():
        adm = Admission(queue_size=100, slots=10, policy="fair", reserved_slots=2)
        adm._seen["B"] = adm.clock()
        a = [asyncio.create_task(adm.acquire("A", stream=True)) for _ in range(12)]
        await asyncio.sleep(0)
        assert adm.held("A") == 1  # one prefill, not its share (5 of 10, B present) at once

        def admitted():
            return [t.result() for t in a if t.done()]

        for held in (2, 3, 4, 5, 6, 7, 8):
            for t in admitted():
                t.first_token()
            await asyncio.sleep(0)
            assert adm.held("A") == held  # one more per first token, up to the reserve
        for t in admitted():
            t.first_token()
        await asyncio.sleep(0)
        assert adm.held("A") == 8  # the 2 reserved slots stay free
        running = admitted()
        for t in running[-3:]:
            t.release()  # three slots beyond the share free at once
        await asyncio.sleep(0)
        assert adm.held("A") == 6  # one refill, not three
        refill = [t for t in admitted() if t not in running]
        assert len(refill) == 1 and refill[0].awaiting_first
        refill[0].first_token()
        await asyncio.sleep(0)
        assert adm.held("A") == 7
        adm._seen.clear()  # alone again: every free slot at once
        for t in running[:-3]:
            t.release()
        await asyncio.sleep(0)
        assert all(t.done() for t in a) and adm.held("A") == 4  # both last requests in together
        for t in a:
            t.cancel()
        await asyncio.gather(*a, return_exceptions=True)

    run(scenario())


def test_beyond_its_share_a_flood_yields_to_another_tenants_first_token():
    """While another tenant's stream awaits its first token, a tenant beyond its share takes no
    slot: that newcomer's prefill step holds none of the flood's prefills (adapters as tenants:
    benchmarks/fairness.py --tenants adapters). Within its share the flood still refills."""

    async def scenario():
        adm = Admission(queue_size=100, slots=10, policy="fair", reserved_slots=2, tenant_cap=8)
        a = [asyncio.create_task(adm.acquire("A", stream=True)) for _ in range(14)]
        await asyncio.sleep(0)

        def admitted():
            return [t.result() for t in a if t.done()]

        for _ in range(8):  # alone: up to its cap, one prefill at a time
            for t in admitted():
                t.first_token()
            await asyncio.sleep(0)
        assert adm.held("A") == 8
        b = await asyncio.wait_for(adm.acquire("B", stream=True), 1)  # in a reserved slot, at once
        old = admitted()
        for t in old[:2]:
            t.release()  # two of A's streams end while B awaits its first token
        await asyncio.sleep(0)
        assert adm.held("A") == 6  # beyond its share (5 of 10): no refill before B's first token
        b.first_token()
        await asyncio.sleep(0)
        assert adm.held("A") == 7  # then one refill (2 reserved slots stay free)
        for t in admitted():
            t.first_token()
        b2 = await asyncio.wait_for(adm.acquire("B", stream=True), 1)
        for t in old[2:5]:
            t.release()  # A down to 4 while B's second stream awaits its first token
        await asyncio.sleep(0)
        assert adm.held("A") == 5  # within its share A still refills, and no further
        for t in (b, b2):
            t.release()
        for t in a:
            t.cancel()
        await asyncio.gather(*a, return_exceptions=True)

    run(scenario())
