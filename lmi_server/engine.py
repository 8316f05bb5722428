"""Builds and owns the vLLM engine and vLLM's own OpenAI serving objects.

The serving objects (chat, completion, Responses, Anthropic Messages, models, tokenization) come from vLLM's `init_app_state`,
fed with a namespace produced by vLLM's own CLI parser, so chat templates, sampling parameters,
validation and SSE streaming behave exactly as in `vllm serve`. vLLM is imported only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import time
from argparse import Namespace
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from lmi_server import bind_shim, engine_launcher, response_store, safe_ports, sagemaker_caches, startup_failure, weights_check
from lmi_server.compat import vllm as compat_vllm
from lmi_server.config import host
from lmi_server.config.model_kind import check_engine_kind
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.cpu_preload import plan_preload
from lmi_server import cpu_quota
from lmi_server.engine_errors import ErrorReports
from lmi_server.host_requirements import vllm_build

log = logging.getLogger(__name__)

# No outbound network from the product: vLLM's and LMCache's usage reporting are off by default.
TELEMETRY_OFF_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "LMCACHE_TRACK_USAGE": "false",
}


# vLLM's CPU linear layers keep their own oneDNN primitives, at most 32 per weight shape. oneDNN's
# process-wide cache (1,024 entries by default) holds a second copy of each, one per batch size
# seen, so the engine worker grew by ~330 MB in a 5-minute 64-client soak; with it off the worker
# grew 52 MB and served as many requests (benchmarks/results/soak_no_lmcache*.json).
CPU_ENGINE_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}


def _world_size(cfg: ServingConfig) -> int:
    args = cfg.engine_args
    return max(1, int(args.get("tensor_parallel_size") or 1)) * max(1, int(args.get("pipeline_parallel_size") or 1))


def engine_environment(
    cfg: ServingConfig, *, gpus: int | None = None, notes: list[str] | None = None
) -> dict[str, str]:
    """Environment the engine processes need, derived from the config and the host (applied by
    `Runtime.apply_environment`, where a variable the user set wins; LD_PRELOAD already holds the
    user's own entries). On CPU hosts: tcmalloc and Intel OpenMP preloaded as vLLM's CPU guide
    says, where found (`cpu_preload`; its one line goes to `notes`)."""
    env = dict(TELEMETRY_OFF_ENV)
    gpus = host.gpu_count() if gpus is None else gpus
    if gpus == 0:
        env.update(CPU_ENGINE_ENV)
        env.update(cpu_quota.omp_environment(_world_size(cfg), notes))
    preload = plan_preload(gpus=gpus)
    env.update(preload.environment())
    if preload.note is not None and notes is not None:
        notes.append(preload.note)
    if cfg.server.cpu_kv_cache_space is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.server.cpu_kv_cache_space)
    env.setdefault("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))
    env.update(sagemaker_caches.cache_environment())  # on SageMaker: caches on /tmp (NVMe)
    env.update(port_environment(env, notes))
    return env


def port_environment(planned: dict[str, str], notes: list[str] | None = None) -> dict[str, str]:
    """Under SAGEMAKER_SAFE_PORT_RANGE: VLLM_PORT inside it (vLLM's own ports), and the bind shim
    preloaded for the ports the kernel would pick (`bind_shim`: torch gloo's listeners), appended to
    the LD_PRELOAD planned so far (or the user's); {} without a range. A malformed range is a
    configuration error naming the variable."""
    try:
        bounds = safe_ports.safe_port_range()
        env = safe_ports.vllm_env()
    except safe_ports.PortRangeError as exc:
        raise ConfigError([str(exc)]) from None
    if bounds is None:
        return env
    shim_env, note = bind_shim.preload_environment(
        safe_ports.parts(bounds)["kernel"], planned.get("LD_PRELOAD", os.environ.get("LD_PRELOAD"))
    )
    env.update(shim_env)
    if notes is not None:
        notes.append(note)
    return env


def build_vllm_namespace(engine_args: dict[str, Any], frontend_args: dict[str, Any] | None = None) -> Namespace:
    """vLLM's `serve` argument namespace with our engine and front-end arguments applied on top of its defaults."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="lmi-server"))
    args = parser.parse_args(["--model", str(engine_args["model"])])
    actions = compat_vllm.cli_actions(parser)
    for key, value in {**(frontend_args or {}), **engine_args}.items():
        action = actions.get(key)
        if isinstance(value, dict) and action is not None and callable(action.type):
            # Structured values take the type vLLM's own CLI gives them (config dataclasses).
            value = action.type(json.dumps(value))
        setattr(args, key, value)
    # Report reused prompt tokens (LMCache / prefix cache) in usage.prompt_tokens_details.
    args.enable_prompt_tokens_details = True
    args.disable_log_stats = False
    return args


@dataclass
class EngineState:
    """What the API layer reads: readiness, the engine client, vLLM's serving objects."""

    status: str = "starting"  # starting | ready | recovering | failed | stopped
    error: str | None = None
    failure: startup_failure.StartupFailure | None = None  # why the last build failed, with the fix
    engine: Any = None
    serving: Any = None  # a namespace holding vLLM's serving objects (vLLM's init_app_state fills it)
    args: Namespace | None = None
    started_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None
    recoveries: int = 0  # engines rebuilt in this process after one died

    @property
    def healthy(self) -> bool:
        if self.status != "ready" or self.engine is None:
            return False
        return not getattr(self.engine, "errored", False)


def freeze_startup_heap() -> None:
    """Move everything allocated up to now (vLLM, torch, the tokenizer, the engine client) out of
    the garbage collector's sight, as vLLM's own API server does at start-up: otherwise each
    oldest-generation collection walks that whole heap on the event loop, and the request that
    happens to trigger it waits (single-client TTFT outliers of 100-450 ms in
    benchmarks/serving_overhead.py)."""
    from vllm.utils.gc_utils import freeze_gc_heap

    freeze_gc_heap()


class EngineOwner:
    """Starts the engine in the background (so /ping can answer 503 meanwhile), rebuilds it when it
    died (asked by `api.lifecycle`, which decides whether that is safe), and stops it."""

    def __init__(
        self,
        cfg: ServingConfig,
        engine_args: dict[str, Any],
        cache_server: Any = None,
        frontend_args: dict[str, Any] | None = None,
    ):
        self.cfg = cfg
        self.engine_args = engine_args
        self.frontend_args = frontend_args if frontend_args is not None else dict(cfg.frontend_args)
        self.cache_server = cache_server  # LMCache MP server supervisor, started before the engine
        self.state = EngineState()
        self._engines: list[Any] = []  # built engines not yet shut down (the running one, a dead one)
        self._errors: ErrorReports | None = None  # what vLLM's engine processes died of
        self._cache_started = False
        self._task: asyncio.Task | None = None
        self._orphans: set[asyncio.Future] = set()  # engine builds abandoned by a timeout/cancel
        # Called each time an engine is built (at start-up and after a rebuild), before it is reported
        # ready (state built once and re-pointed at a new engine, e.g. the adapter registry); a hook
        # that raises is logged and does not fail the start.
        self.on_ready: list[Callable[[], None]] = []

    def start_background(self) -> asyncio.Task:
        self._task = asyncio.create_task(self._start(), name="engine-start")
        return self._task

    def recover_background(self) -> asyncio.Task:
        """Replace the dead engine by a new one, built as at start-up, in this process: what the
        app holds besides the engine (sessions, the adapter registry, the cache server) stays."""
        dead = self.state.engine
        reason = getattr(dead, "dead_error", None) or "engine died"
        self.state.status = "recovering"
        self.state.error = f"the engine died ({reason}) and is being rebuilt"
        self._task = asyncio.create_task(self._recover(dead), name="engine-recover")
        return self._task

    async def _recover(self, dead: Any) -> None:
        started = time.monotonic()
        if dead is not None:
            # Its surviving processes (a worker whose engine core was killed), sockets and threads.
            await asyncio.to_thread(self._shutdown, dead)
        gc.unfreeze()  # the dead engine's objects were frozen at start-up: let the collector have them
        self.state.started_at = started
        await self._start()
        if self.state.status == "ready":
            self.state.recoveries += 1
            log.info("engine rebuilt after it died: serving again after %.1f s (rebuild %d in this process)",
                     time.monotonic() - started, self.state.recoveries)

    async def _start(self) -> None:
        try:
            await asyncio.wait_for(self._build(), timeout=self.cfg.server.model_loading_timeout)
            for hook in self.on_ready:
                try:
                    hook()
                except Exception:  # noqa: BLE001 - the hook's own state reports it
                    log.exception("engine ready hook failed")
            freeze_startup_heap()
            self.state.status = "ready"
            self.state.error = None
            self.state.ready_after_s = time.monotonic() - self.state.started_at
            log.info("engine ready after %.1f s", self.state.ready_after_s)
        except asyncio.CancelledError:
            self.state.status = "stopped"
            raise
        except BaseException as exc:  # noqa: BLE001 - any start failure ends the process (api.lifecycle)
            self.state.failure = self.diagnose(exc)
            self.state.error = self.state.failure.line()
            self.state.status = "failed"
            if not self.state.failure.known:  # the line points at the log above: put this process's part there
                log.warning("engine start-up raised", exc_info=exc)

    def diagnose(self, exc: BaseException) -> startup_failure.StartupFailure:
        ctx = startup_failure.Context(
            build=vllm_build(), model=str(self.engine_args.get("model") or "") or None,
            loading_timeout_s=self.cfg.server.model_loading_timeout,
        )
        reported = self._errors.errors() if self._errors is not None else []
        return startup_failure.diagnose(exc, reported, ctx)

    async def _build(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        # A truncated weights file fails here in a second, not after an engine start bound to fail.
        await asyncio.to_thread(weights_check.check_local_weights, self.engine_args.get("model"))
        if self.cache_server is not None and not self._cache_started:
            # Once: its supervisor restarts it if it dies, and a rebuilt engine reconnects to it.
            await self.cache_server.start_async()
            self._cache_started = True
            log.info("LMCache cache server ready on port %s", self.cache_server.port)
        if self._errors is None:
            self._errors = ErrorReports()
        self._errors.arm()  # before vLLM loads its plugins here and in the engine processes
        args = build_vllm_namespace(self.engine_args, self.frontend_args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        if self.cfg.server.engine_fork_server and self.cfg.server.engine_max_restarts > 0:
            engine_launcher.install(vllm_config)  # rebuilds after a death skip the engine core's imports
        # Engine start-up blocks (process spawn, weight loading, profiling): run it in a thread
        # so that the event loop keeps answering /ping with 503 meanwhile.
        engine = await self.build_in_thread(
            AsyncLLM.from_vllm_config,
            vllm_config=vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
        )
        serving = SimpleNamespace()  # what vLLM's init_app_state fills: attributes only, no HTTP needed
        supported_tasks = await engine.get_supported_tasks()
        check_engine_kind(self.cfg.kind, supported_tasks)  # the routes mounted are the kind's: vLLM must agree
        await init_app_state(engine, serving, args, supported_tasks)  # also the Responses and Messages serving
        if response_store.install(getattr(serving, "openai_serving_responses", None), self.cfg.server.responses_store_size):
            log.info("Responses API: up to %d responses stored for previous_response_id", self.cfg.server.responses_store_size)
        self.state.engine = engine
        self.state.serving = serving
        self.state.args = args

    async def build_in_thread(self, factory, *args, **kwargs):
        """Run a blocking engine factory in a thread; the engine it returns is shut down with this
        owner. A thread cannot be interrupted: when start-up times out or is cancelled while the
        factory runs, the build is kept as an orphan and its engine shut down as soon as it
        exists (and `stop()` waits for that), so no engine processes outlive a failed start."""
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(factory, *args, **kwargs))
        try:
            engine = await asyncio.shield(future)
        except asyncio.CancelledError:
            log.warning("engine start-up abandoned while the engine was being built; it is shut down once built")
            self._orphans.add(future)
            future.add_done_callback(self._reap)
            raise
        self._engines.append(engine)
        return engine

    def _shutdown(self, engine: Any) -> None:
        if engine in self._engines:
            self._engines.remove(engine)
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - a dead engine may fail to shut down cleanly; its processes are gone
            log.exception("shutting down an engine failed")

    def _reap(self, future: asyncio.Future) -> None:
        if future not in self._orphans:
            return
        self._orphans.discard(future)
        if future.cancelled() or future.exception() is not None:
            return
        try:
            future.result().shutdown()
            log.info("an engine built after start-up was abandoned has been shut down")
        except Exception:  # noqa: BLE001
            log.exception("shutting down an abandoned engine failed")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for future in list(self._orphans):  # builds abandoned on timeout/cancel: wait, then shut down
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(future), timeout=self.cfg.server.model_loading_timeout)
            self._reap(future)
        try:
            for engine in reversed(list(self._engines)):
                self._shutdown(engine)
        finally:
            self.state.status = "stopped"
            # Nothing keeps the stopped engine alive: its finalizer runs now, not at interpreter exit.
            self.state.engine = self.state.serving = None
            if self._errors is not None:
                self._errors.close()
            if self.cache_server is not None:
                await self.cache_server.stop_async()
