"""The watchdog: a failed start ends the process with one line; a dead engine is rebuilt within the
restart budget, and past it the process ends as before."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from lmi_server.api.lifecycle import ENGINE_DEAD_EXIT_CODE, START_FAILED_EXIT_CODE, engine_watchdog
from lmi_server.engine import EngineState
from lmi_server.restart_budget import RestartBudget
from lmi_server.startup_failure import diagnose


class FakeOwner:
    def __init__(self):
        self.state = EngineState(status="ready", engine=SimpleNamespace(errored=False))
        self.recoveries = 0

    def recover_background(self):
        self.recoveries += 1
        self.state.status = "recovering"

        async def rebuilt():
            await asyncio.sleep(0.01)
            self.state.engine = SimpleNamespace(errored=False)
            self.state.status = "ready"

        return asyncio.get_running_loop().create_task(rebuilt())

    def kill(self):
        self.state.engine = SimpleNamespace(errored=True, dead_error="EngineDeadError: EngineCore died")


def app_with(owner):
    server = SimpleNamespace(should_exit=False)
    ctx = SimpleNamespace(owner=owner, admission=SimpleNamespace(draining=False), config=None)
    state = SimpleNamespace(ctx=ctx, uvicorn_server=server, exit_code=0, draining=False)
    return SimpleNamespace(state=state)


async def _wait(predicate, timeout=2.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_restart_budget_is_a_sliding_window():
    now = [0.0]
    budget = RestartBudget(2, 600, clock=lambda: now[0])
    assert budget.take()
    now[0] = 100.0
    assert budget.take()
    assert not budget.take()  # a third within 10 minutes
    now[0] = 599.0
    assert not budget.take()
    now[0] = 600.0  # the first left the window
    assert budget.take() and budget.used() == 2
    assert not RestartBudget(0, 600).take()


def test_a_dead_engine_is_rebuilt_and_a_third_death_in_the_window_ends_the_process(caplog):
    async def scenario():
        owner = FakeOwner()
        app = app_with(owner)
        watchdog = asyncio.create_task(engine_watchdog(app, interval_s=0.01, budget=RestartBudget(2, 600), settle_s=0.01))
        for expected in (1, 2):
            owner.kill()
            await _wait(lambda: owner.recoveries == expected and owner.state.status == "ready")
            assert not app.state.uvicorn_server.should_exit and app.state.exit_code == 0
        owner.kill()
        await asyncio.wait_for(watchdog, 2)
        return owner, app

    with caplog.at_level(logging.INFO, logger="lmi_server.api.lifecycle"):
        owner, app = asyncio.run(scenario())
    assert owner.recoveries == 2
    assert app.state.exit_code == ENGINE_DEAD_EXIT_CODE and app.state.uvicorn_server.should_exit
    assert app.state.draining
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "the engine has died" in errors[0].getMessage()


def test_a_failed_start_ends_the_process_with_one_line_naming_the_cause(caplog):
    async def scenario():
        owner = FakeOwner()
        owner.state.status = "failed"
        owner.state.failure = diagnose(RuntimeError("Failed core proc(s)"), ["SafetensorError: file not fully covered"])
        app = app_with(owner)
        await asyncio.wait_for(engine_watchdog(app, interval_s=0.01, budget=RestartBudget(2, 600), settle_s=0.01), 2)
        return app

    with caplog.at_level(logging.INFO, logger="lmi_server.api.lifecycle"):
        app = asyncio.run(scenario())
    assert app.state.exit_code == START_FAILED_EXIT_CODE and app.state.uvicorn_server.should_exit
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "corrupt or truncated" in errors[0] and "fix: " in errors[0] and f"exiting with code {START_FAILED_EXIT_CODE}" in errors[0]


def test_a_draining_server_does_not_rebuild_its_engine():
    async def scenario():
        owner = FakeOwner()
        app = app_with(owner)
        app.state.draining = True
        owner.kill()
        watchdog = asyncio.create_task(engine_watchdog(app, interval_s=0.01, budget=RestartBudget(2, 600), settle_s=0.01))
        await asyncio.sleep(0.1)
        watchdog.cancel()
        return owner

    assert asyncio.run(scenario()).recoveries == 0
