"""FastAPI app factory. The lifespan owns the engine (and, when configured, the cache server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from fastapi import FastAPI

from lmi_server import metric_labels, prefill_gate
from lmi_server.adapters.formatters import FormatterError, load_model_formatters
from lmi_server.admission import Admission, Tenants
from lmi_server.api import kinds
from lmi_server.api import routes as route_table
from lmi_server.api.adapters import wiring as adapter_wiring
from lmi_server.api.request_scope import RequestScopeMiddleware
from lmi_server.api.anthropic import error_body_for
from lmi_server.api.auth import APIKeyMiddleware, load_api_key_entries
from lmi_server.api.context import AppContext
from lmi_server.api.errors import install_error_handlers
from lmi_server.api.lifecycle import engine_watchdog
from lmi_server.api.media import MediaPolicy
from lmi_server.api.openapi import install_openapi
from lmi_server.api.sagemaker.custom_handler import handler_properties
from lmi_server.api.sessions import SessionHook, SessionStore
from lmi_server.api.sessions_redis import build_session_store
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.engine import EngineOwner
from lmi_server.engine_limits import EngineLimits
from lmi_server.model_requirements import RequirementsError, install_requirements
from lmi_server.metrics import MetricsMiddleware, register_blend_collector, register_lmcache_collector, unregister_collector
from lmi_server.redact import install_log_redaction, register_secret

log = logging.getLogger(__name__)


async def _sweep_sessions(store: SessionStore, interval_s: int) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            if asyncio.iscoroutinefunction(store.sweep):
                await store.sweep()  # the shared store (Redis) sweeps over the network
            else:
                await asyncio.to_thread(store.sweep)
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.exception("sessions: sweep failed")


def install_engine_guards(ctx: AppContext) -> None:
    """On every engine built (start-up and rebuilds): what it cannot serve is read from its own
    configuration (`AppContext.engine_limits`, refused with a 400), and with LoRA on a request
    asking for prompt log-probabilities prefills alone (`prefill_gate`)."""
    owner = ctx.owner
    ctx.engine_limits = None
    gate = prefill_gate.PrefillGate() if adapter_wiring.lora_enabled(ctx.config) else None
    ctx.prefill_gate = gate

    def guard_engine() -> None:
        ctx.engine_limits = EngineLimits.of_engine(owner.state.engine)
        if gate is not None and prefill_gate.install(owner.state.engine, gate):
            log.info("LoRA on: a request asking for prompt log-probabilities prefills alone in the engine")

    owner.on_ready.append(guard_engine)


def _lifespan(kv_plan: Any, cache_server: Any, start_engine: bool):
    """The app's lifespan: the engine (and the cache server's metrics, the blend store, the session
    sweeper, the engine watchdog) up at start, down at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx: AppContext = app.state.ctx
        install_log_redaction()  # uvicorn's and vLLM's handlers exist by now
        collector = register_lmcache_collector(kv_plan, cache_server)
        blend = getattr(ctx.runtime, "blend", None)
        blend_collector = register_blend_collector(blend)
        store_dir = (blend or {}).get("store_dir")
        if store_dir:
            from lmi_server.kvcache.blend.store import remove_stale_stores

            for path in remove_stale_stores(os.path.dirname(store_dir)):
                log.info("removed the blend store of a server that is gone: %s", path)
        if start_engine:
            ctx.owner.start_background()
        session_store = ctx.sessions.store
        if hasattr(session_store, "startup_check"):
            await session_store.startup_check()
        sweeper = asyncio.create_task(_sweep_sessions(session_store, ctx.config.sessions.sessions_sweep_interval))
        watchdog = asyncio.create_task(engine_watchdog(app))
        try:
            yield
        finally:
            sweeper.cancel()
            watchdog.cancel()
            if hasattr(session_store, "aclose"):
                await session_store.aclose()
            log.info("shutting down: stopping the engine")
            await ctx.owner.stop()
            unregister_collector(collector)
            unregister_collector(blend_collector)
            if store_dir:
                from lmi_server.kvcache.blend.store import remove_store

                remove_store(store_dir)  # this server's segment KV (tmpfs) goes with it

    return lifespan


def _cache_server(cfg: ServingConfig, kv_plan: Any) -> Any:
    """The LMCache MP server's supervisor when the KV plan runs one; None otherwise."""
    for secret in getattr(kv_plan, "secret_env", {}).values():
        register_secret(secret)
    if kv_plan is None or kv_plan.mode != "mp":
        return None
    from lmi_server.kvcache.mp_server import supervisor_for_plan

    return supervisor_for_plan(
        kv_plan, max_restarts=cfg.lmcache.lmcache_max_restarts, restart_window_s=cfg.lmcache.lmcache_restart_window,
    )


def create_app(
    cfg: ServingConfig,
    engine_args: dict[str, Any] | None = None,
    *,
    runtime: Any = None,
    start_engine: bool = True,
) -> FastAPI:
    api_keys = load_api_key_entries(cfg.security, cfg.model_dir)
    kv_plan = getattr(runtime, "kv_plan", None)
    cache_server = _cache_server(cfg, kv_plan)
    try:
        install_requirements(cfg.model_dir)  # the model directory's requirements.txt, before its model.py
        model_formatters = load_model_formatters(cfg.model_dir)
    except (FormatterError, RequirementsError) as exc:
        raise ConfigError([str(exc)]) from None
    frontend_args = getattr(runtime, "frontend_args", None)
    owner = EngineOwner(
        cfg, engine_args if engine_args is not None else dict(cfg.engine_args), cache_server, frontend_args
    )
    app = FastAPI(title="lmi_server", lifespan=_lifespan(kv_plan, cache_server, start_engine))
    ctx = build_context(cfg, runtime, owner, api_keys, model_formatters)
    app.state.ctx = ctx
    if ctx.media_policy.allowed_domains:
        # an allowed host must not redirect vLLM's fetch to one that is not
        os.environ.setdefault("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0")
    app.state.draining = False
    app.state.exit_code = 0
    install_error_handlers(app)
    app.add_middleware(
        APIKeyMiddleware, keys=api_keys, metrics_public=cfg.security.metrics_public, error_body=error_body_for
    )
    app.add_middleware(MetricsMiddleware, label=route_table.label_for)  # each route under its own label
    if owner.frontend_args.get("enable_request_id_headers"):
        from vllm.entrypoints.serve.middleware.x_request_id import XRequestIdMiddleware

        app.add_middleware(XRequestIdMiddleware)
    kinds.install(app, cfg.kind)  # the route table's rows of the model's kind (api/routes.py), chosen once here
    install_engine_guards(ctx)
    adapter_wiring.install(ctx)  # LoRA adapters: the registry, built once the engine is ready
    install_openapi(app)  # the request bodies the routes read themselves
    app.add_middleware(RequestScopeMiddleware)  # outermost: the request's context, released at the end
    return app


def build_context(cfg: ServingConfig, runtime: Any, owner: EngineOwner, api_keys: list, model_formatters: Any) -> AppContext:
    """The app's typed context: everything the routers and the pipeline read, built once."""
    tenants = Tenants.from_config(cfg, api_keys)
    metric_labels.configure(cfg.tenants.metrics_max_tenants, cfg.tenants.metrics_max_adapters)
    fair_slots = getattr(runtime, "fair_slots", None)  # reserved slots added on top of the batch size
    admission = Admission(
        queue_size=cfg.server.job_queue_size,
        max_wait_s=cfg.server.max_queue_wait,
        policy=cfg.tenants.admission_policy,
        tenant_queue_share=cfg.tenants.tenant_queue_share,
        reserved_slots=fair_slots["reserved_slots"] if fair_slots else cfg.tenants.reserved_slots,
        tenant_cap=fair_slots["batch_size"] if fair_slots else None,
        weights=tenants.weights,
    )
    media_policy = MediaPolicy.from_options(
        allowed_domains=cfg.engine_args.get("allowed_media_domains"), max_image_bytes=cfg.server.max_image_bytes,
        max_image_pixels=cfg.server.max_image_pixels, limit_mm_per_prompt=cfg.engine_args.get("limit_mm_per_prompt"),
    )
    sessions = SessionHook(
        cfg.sessions.enable_stateful_sessions,
        build_session_store(cfg.sessions),  # this replica's own, or shared in Redis (option.sessions_redis_url)
    )
    return AppContext(
        config=cfg, owner=owner, admission=admission, tenants=tenants, sessions=sessions,
        model_formatters=model_formatters,  # the model directory's model.py (LMI's contract)
        handler_properties=handler_properties(cfg),  # what a custom handle() gets as properties
        media_policy=media_policy, runtime=runtime,
    )
