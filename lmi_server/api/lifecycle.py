"""How the process ends: graceful drain on SIGTERM, and exit when the engine dies.

Drain: on the first SIGTERM/SIGINT the server keeps listening so that `/ping` can answer 503 (load
balancers stop sending) and new requests get 503, while the requests already admitted, streams
included, finish for up to `option.graceful_shutdown_timeout` seconds; then uvicorn stops, and the
app's lifespan stops the engine, the cache server and every child. A second signal stops at once.

Engine death: vLLM marks its client `errored` when the engine core or a worker dies (in-flight
requests then fail with EngineDeadError, mapped to 503). A watchdog notices within a second, turns
`/ping` 503 and ends the process with a non-zero exit code so that Docker's restart policy,
Kubernetes or SageMaker replaces the instance; restarting vLLM inside a process whose workers
died is not something vLLM supports cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

ENGINE_DEAD_EXIT_CODE = 3


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
        admission = self.lmi_app.state.admission
        drained = await admission.wait_idle(self.drain_timeout_s)
        if not drained:
            log.warning("drain timeout: %d requests still in flight are cut off", admission.in_flight)
        else:
            log.info("drained: no request in flight")
        self.should_exit = True


def exit_after_serving(app: Any) -> None:
    """End the process once uvicorn has stopped and the lifespan has stopped the engine, the cache
    server and every child: exit code 0 after a drain, ENGINE_DEAD_EXIT_CODE after engine death.

    os._exit skips interpreter teardown, where vLLM's AsyncLLM finalizer would run against
    half-destroyed modules and print a traceback after a clean shutdown."""
    code = int(getattr(app.state, "exit_code", 0))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def begin_drain(app: Any) -> None:
    app.state.draining = True
    app.state.admission.draining = True


async def engine_watchdog(app: Any, interval_s: float = 1.0) -> None:
    """Once the engine is ready, end the process (non-zero) if it dies."""
    owner = app.state.engine_owner
    while True:
        await asyncio.sleep(interval_s)
        state = owner.state
        if state.status == "ready" and state.engine is not None and getattr(state.engine, "errored", False):
            error = getattr(state.engine, "dead_error", None)
            log.error("the engine has died (%s); exiting with code %d so that the instance is replaced", error, ENGINE_DEAD_EXIT_CODE)
            app.state.exit_code = ENGINE_DEAD_EXIT_CODE
            begin_drain(app)
            server = getattr(app.state, "uvicorn_server", None)
            await asyncio.sleep(interval_s)  # let in-flight requests receive their errors
            if server is not None:
                server.should_exit = True
            return
