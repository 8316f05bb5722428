"""How the process ends: graceful drain on SIGTERM, fail fast when the engine cannot start, and
what happens when the engine dies.

Drain: on the first SIGTERM/SIGINT the server keeps listening so that `/ping` can answer 503 (load
balancers stop sending) and new requests get 503, while the requests already admitted, streams
included, finish for up to `option.graceful_shutdown_timeout` seconds; then uvicorn stops, and the
app's lifespan stops the engine, the cache server and every child. A second signal stops at once.

Failed start: a server that stays up answering 503 after its engine failed to start makes Docker's
restart policy, Kubernetes and SageMaker wait instead of acting. The watchdog logs one line with
the cause and its fix (`startup_failure`) and ends the process with START_FAILED_EXIT_CODE.

Engine death: vLLM marks its client `errored` when the engine core or a worker dies (in-flight
requests then fail with EngineDeadError, mapped to 503 with Retry-After). The watchdog notices
within a second and has the engine rebuilt in this process (`EngineOwner.recover_background`;
`/ping` answers 503 meanwhile), which is much faster than a new process: the server's imports, the
cache server, sessions and adapter registrations stay. An engine that dies more than
`option.engine_max_restarts` times within `option.engine_restart_window` seconds is not rebuilt:
the process ends with ENGINE_DEAD_EXIT_CODE so that the orchestrator replaces the instance.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import uvicorn

from lmi_server.restart_budget import RestartBudget

log = logging.getLogger(__name__)

ENGINE_DEAD_EXIT_CODE = 3
START_FAILED_EXIT_CODE = 4


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains instead of closing the listener at once."""

    def __init__(self, config: uvicorn.Config, app: Any, drain_timeout_s: float):
        super().__init__(config)
        self.lmi_app = app
        self.drain_timeout_s = drain_timeout_s
        self._drain_task: Any = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._drain_task is not None or self.should_exit:
            super().handle_exit(sig, frame)  # second signal: stop now
            return
        log.info("signal %s: draining (up to %.0f s for in-flight requests), /ping answers 503", sig, self.drain_timeout_s)
        begin_drain(self.lmi_app)
        loop = asyncio.get_event_loop()
        self._drain_task = loop  # marks the drain as started; the task itself is made on the loop
        loop.call_soon_threadsafe(lambda: setattr(self, "_drain_task", loop.create_task(self._drain_then_exit())))

    async def _drain_then_exit(self) -> None:
        admission = self.lmi_app.state.ctx.admission
        drained = await admission.wait_idle(self.drain_timeout_s)
        if not drained:
            log.warning("drain timeout: %d requests still in flight are cut off", admission.in_flight)
        else:
            log.info("drained: no request in flight")
        self.should_exit = True


def exit_after_serving(app: Any) -> None:
    """End the process once uvicorn has stopped and the lifespan has stopped the engine, the cache
    server and every child: exit code 0 after a drain, ENGINE_DEAD_EXIT_CODE after engine deaths
    past the restart budget, START_FAILED_EXIT_CODE when the engine could not be built.

    os._exit skips interpreter teardown, where vLLM's AsyncLLM finalizer would run against
    half-destroyed modules and print a traceback after a clean shutdown."""
    code = int(getattr(app.state, "exit_code", 0))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def begin_drain(app: Any) -> None:
    app.state.draining = True
    app.state.ctx.admission.draining = True


def restart_budget(cfg: Any) -> RestartBudget:
    server = getattr(cfg, "server", None)
    return RestartBudget(getattr(server, "engine_max_restarts", 2), getattr(server, "engine_restart_window", 600))


async def end_process(app: Any, code: int, settle_s: float = 0.0) -> None:
    """Have uvicorn stop (the lifespan then stops the engine and every child) and the process exit
    with `code`; `settle_s` lets requests in flight receive their errors first."""
    app.state.exit_code = code
    begin_drain(app)
    if settle_s:
        await asyncio.sleep(settle_s)
    server = getattr(app.state, "uvicorn_server", None)
    if server is not None:
        server.should_exit = True


async def engine_watchdog(
    app: Any, interval_s: float = 0.25, budget: RestartBudget | None = None, settle_s: float = 1.0
) -> None:
    """End the process when the engine could not be built; rebuild an engine that died while
    serving, within the restart budget, else end the process (non-zero). Checking costs an
    attribute read, so it checks often: each check saved is time back in service."""
    owner = app.state.ctx.owner
    budget = budget if budget is not None else restart_budget(getattr(getattr(app.state, "ctx", None), "config", None))
    while True:
        await asyncio.sleep(interval_s)
        state = owner.state
        if state.status == "failed" and state.failure is not None:
            log.error("%s; exiting with code %d", state.failure.line(), START_FAILED_EXIT_CODE)
            await end_process(app, START_FAILED_EXIT_CODE)
            return
        if state.status == "ready" and state.engine is not None and getattr(state.engine, "errored", False):
            error = getattr(state.engine, "dead_error", None)
            if getattr(app.state, "draining", False):
                continue  # stopping anyway: the lifespan shuts the dead engine down
            if budget.take():
                log.warning(
                    "the engine has died (%s); rebuilding it in this process (%d of %d rebuilds allowed within %.0f s)",
                    error, budget.used(), budget.max_restarts, budget.window_s,
                )
                owner.recover_background()
                continue
            log.error(
                "the engine has died (%s) with its %d rebuilds within %.0f s used up (option.engine_max_restarts); "
                "exiting with code %d so that the instance is replaced",
                error, budget.max_restarts, budget.window_s, ENGINE_DEAD_EXIT_CODE,
            )
            await end_process(app, ENGINE_DEAD_EXIT_CODE, settle_s=settle_s)
            return
