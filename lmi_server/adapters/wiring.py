"""Wiring the adapter registry into the app: one call from the app factory (`install`), one task
from its lifespan (`build_when_ready`). Kept out of `lmi_server.adapters.__init__` so that the
config package (which imports `adapters.options`) never pulls in FastAPI or vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from lmi_server.api.errors import APIError

log = logging.getLogger(__name__)


def lora_enabled(cfg: Any) -> bool:
    return bool(cfg.engine_args.get("enable_lora"))


def adapters_root(cfg: Any) -> Path:
    """option.adapters_path (relative to the model directory), else `adapters/` in the model directory."""
    path = cfg.adapters.adapters_path
    if path is None:
        return Path(cfg.model_dir) / "adapters"
    path = Path(path).expanduser()
    return path if path.is_absolute() else Path(cfg.model_dir) / path


def registry_capacity(engine_args: dict[str, Any]) -> int:
    """Adapters vLLM keeps loaded: max_cpu_loras, which defaults to max_loras (default 1)."""
    max_loras = engine_args.get("max_loras") or 1
    return int(engine_args.get("max_cpu_loras") or max_loras)


def build_registry(app: FastAPI):
    from lmi_server.adapters.registry import AdapterRegistry, VLLMBackend, with_adapter_listing
    from lmi_server.adapters.validation import base_model_info

    owner = app.state.engine_owner
    state = owner.state
    models = state.serving.openai_serving_models
    backend = VLLMBackend(models, state.engine)
    engine_args = owner.engine_args
    root = adapters_root(app.state.config)
    registry = AdapterRegistry(
        backend,
        root=root,
        max_rank=int(engine_args.get("max_lora_rank") or 16),
        capacity=registry_capacity(engine_args),
        base=base_model_info(str(engine_args.get("model")), backend.base_names()),
    )
    registry.discover()
    with_adapter_listing(models, registry)
    return registry


def ensure_registry(app: FastAPI):
    """The registry (built once, as soon as the engine is ready); None when LoRA is off."""
    registry = getattr(app.state, "adapter_registry", None)
    if registry is not None or not lora_enabled(app.state.config):
        return registry
    state = app.state.engine_owner.state
    if not state.healthy:
        raise APIError(503, f"engine not ready: {state.error or 'the model is still loading'}; retry when GET /ping returns 200")
    registry = build_registry(app)
    app.state.adapter_registry = registry
    return registry


async def build_when_ready(app: FastAPI) -> None:
    """Lifespan task: discover adapters right after the engine becomes ready (logs at start-up)."""
    if not lora_enabled(app.state.config):
        return
    task = app.state.engine_owner._task
    if task is not None and not task.done():
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)
    if app.state.engine_owner.state.healthy:
        try:
            ensure_registry(app)
        except Exception:  # noqa: BLE001 - the first request retries and reports
            log.exception("adapters: building the registry failed")


def install(app: FastAPI) -> None:
    """Adapter routes, resolvers and middleware. Resolvers only when option.enable_lora=true."""
    from lmi_server.adapters.routing import (
        AdapterMiddleware,
        apply_cache_salt,
        lmi_model_resolver,
        openai_model_resolver,
    )
    from lmi_server.api import adapters as adapter_routes

    app.state.adapter_registry = None
    if lora_enabled(app.state.config):
        app.state.model_resolver = openai_model_resolver
        app.state.lmi_model_resolver = lmi_model_resolver
        app.state.cache_salter = apply_cache_salt  # KV reuse isolated per adapter and weights
    app.add_middleware(AdapterMiddleware)
    app.include_router(adapter_routes.router)
