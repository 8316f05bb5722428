"""The bounded queue in front of the engine (option.job_queue_size, option.max_queue_wait)."""

from __future__ import annotations

import asyncio

import pytest

from lmi_server.api.admission import REJECTED, Admission, Rejected

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
