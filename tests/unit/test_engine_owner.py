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


def test_a_dead_engine_is_replaced_and_the_ready_hooks_run_again(tmp_path, monkeypatch):
    """recover_background shuts the dead engine down, builds a new one the way start-up did and
    runs the ready hooks again (state built once is re-pointed at the new engine)."""
    import gc

    built: list[FakeEngine] = []

    async def build(self):
        engine = await self.build_in_thread(FakeEngine)
        built.append(engine)
        self.state.engine = engine

    monkeypatch.setattr(EngineOwner, "_build", build)
    hooks: list[object] = []

    async def scenario():
        o = owner(tmp_path)
        o.on_ready.append(lambda: hooks.append(o.state.engine))
        await o._start()
        dead = o.state.engine
        dead.errored, dead.dead_error = True, "EngineCore died"
        await o.recover_background()
        assert o.state.status == "ready" and o.state.recoveries == 1 and o.state.error is None
        await o.stop()
        return dead

    try:
        dead = asyncio.run(scenario())
    finally:
        gc.unfreeze()
    assert len(built) == 2 and built[0] is dead
    assert hooks == built  # the hooks saw each engine once
    assert all(e.shut_down.is_set() for e in built)


def test_a_failed_start_is_diagnosed_with_the_cause_and_its_fix(tmp_path, monkeypatch):
    async def build(self):
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': -9}")

    monkeypatch.setattr(EngineOwner, "_build", build)
    o = owner(tmp_path)
    asyncio.run(o._start())
    assert o.state.status == "failed"
    assert o.state.failure.name == "killed"
    assert o.state.error == o.state.failure.line() and "out-of-memory killer" in o.state.error
