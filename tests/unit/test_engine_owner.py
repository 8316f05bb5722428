"""An engine whose start-up is abandoned (timeout, cancel) while it is built does not keep running."""

import asyncio
import threading
import time

from lmi_server.config.schema import build_serving_config
from lmi_server.engine import EngineOwner


class FakeEngine:
    def __init__(self):
        self.shut_down = threading.Event()

    def shutdown(self):
        self.shut_down.set()


def slow_factory(made, delay=0.6):
    def build():
        time.sleep(delay)
        engine = FakeEngine()
        made.append(engine)
        return engine
    return build


def owner(tmp_path):
    return EngineOwner(build_serving_config({}, tmp_path), {"model": "x"})


def test_cancelled_build_is_shut_down_when_it_completes(tmp_path):
    made = []

    async def scenario():
        o = owner(tmp_path)
        task = asyncio.create_task(o.build_in_thread(slow_factory(made)))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.sleep(1.0)  # the thread finishes building after the cancel
        return o

    asyncio.run(scenario())
    assert len(made) == 1 and made[0].shut_down.is_set()


def test_timeout_then_stop_waits_for_the_build_and_shuts_it_down(tmp_path):
    made = []

    async def scenario():
        o = owner(tmp_path)
        try:
            await asyncio.wait_for(o.build_in_thread(slow_factory(made)), timeout=0.1)
        except asyncio.TimeoutError:
            pass
        await o.stop()  # returns only after the abandoned engine was shut down

    asyncio.run(scenario())
    assert len(made) == 1 and made[0].shut_down.is_set()


def test_a_completed_build_is_shut_down_by_stop(tmp_path):
    made = []

    async def scenario():
        o = owner(tmp_path)
        await o.build_in_thread(slow_factory(made, 0.0))
        assert not made[0].shut_down.is_set()
        await o.stop()

    asyncio.run(scenario())
    assert made[0].shut_down.is_set()


def test_the_start_up_heap_is_frozen_once_the_engine_is_ready(tmp_path, monkeypatch):
    """Objects from start-up leave the garbage collector's sight when the engine is ready, so an
    oldest-generation collection during serving does not walk them (TTFT outliers otherwise)."""
    import gc

    async def build(self):
        self.state.engine = FakeEngine()

    monkeypatch.setattr(EngineOwner, "_build", build)
    gc.unfreeze()
    try:
        o = owner(tmp_path)
        asyncio.run(o._start())
        assert o.state.status == "ready"
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
