"""Wiring the adapter registry into the app, from the one wiring point (`create_app`): the
adapter routes are installed there (`install`), and the registry is built once, when the engine
becomes ready (an `EngineOwner.on_ready` hook, so no request sees a ready engine without its
registry); an engine rebuilt after it died gets the same registry, re-pointed. Routers and the
pipeline read it from the app's context (`AppContext.adapters`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmi_server.adapters.registry import AdapterRegistry
from lmi_server.adapters.src_paths import sagemaker_roots
from lmi_server.catalogue import example_adapters_dir
from lmi_server.adapters.validation import base_model_info
from lmi_server.adapters.vllm_backend import VLLMBackend, with_adapter_listing
from lmi_server.api.context import AppContext
from lmi_server.api.errors import APIError, engine_unavailable

log = logging.getLogger(__name__)


def lora_enabled(cfg: Any) -> bool:
    return bool(cfg.engine_args.get("enable_lora"))


def adapters_root(cfg: Any) -> Path:
    """option.adapters_path (relative to the model directory), else `adapters/` in the model directory;
    a built-in model (the embedded assistant), with neither, uses the example adapters shipped for it."""
    path = cfg.adapters.adapters_path
    if path is None:
        own = Path(cfg.model_dir) / "adapters"
        shipped = example_adapters_dir(cfg.model.source)  # a built-in model's example adapters
        if shipped is not None and not own.is_dir():
            return shipped
        return own
    path = Path(path).expanduser()
    return path if path.is_absolute() else Path(cfg.model_dir) / path


def registry_capacity(engine_args: dict[str, Any]) -> int:
    """Adapters vLLM keeps loaded: max_cpu_loras, which defaults to max_loras (default 1)."""
    max_loras = engine_args.get("max_loras") or 1
    return int(engine_args.get("max_cpu_loras") or max_loras)


def build_registry(cfg: Any, owner: Any):
    state = owner.state
    models = state.serving.openai_serving_models
    backend = VLLMBackend(models, state.engine)
    engine_args = owner.engine_args
    root = adapters_root(cfg)
    registry = AdapterRegistry(
        backend,
        root=root,
        allowed_roots=[root, *sagemaker_roots()],  # SageMaker's adapter components: their src
        max_rank=int(engine_args.get("max_lora_rank") or 16),
        capacity=registry_capacity(engine_args),
        base=base_model_info(str(engine_args.get("model")), backend.base_names()),
        trust_remote_code=bool(engine_args.get("trust_remote_code")),
    )
    registry.discover()
    with_adapter_listing(models, registry)
    return registry


def rebind_registry(registry: AdapterRegistry, owner: Any) -> None:
    """Point the registry built at start-up at a rebuilt engine and its new serving objects."""
    state = owner.state
    models = state.serving.openai_serving_models
    registry.engine_replaced(VLLMBackend(models, state.engine))
    with_adapter_listing(models, registry)


class AdapterState:
    """The app's adapter registry: None while the engine starts, and always when LoRA is off."""

    def __init__(self, cfg: Any, owner: Any):
        self.cfg = cfg
        self.owner = owner
        self.enabled = lora_enabled(cfg)
        self._registry = None
        self._error: str | None = None

    def build(self) -> None:
        """Engine-ready hook: discover the adapters at start-up (logs them); after the engine was
        rebuilt, keep the registry and its registrations and point it at the new engine."""
        if not self.enabled:
            return
        try:
            if self._registry is None:
                self._registry = build_registry(self.cfg, self.owner)
            else:
                rebind_registry(self._registry, self.owner)
        except Exception as exc:  # noqa: BLE001 - requests get 503 with the reason
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception("adapters: building the registry failed")

    def registry(self):
        """The registry; None when LoRA is off; 503 while the engine is not ready."""
        if not self.enabled or self._registry is not None:
            return self._registry
        state = self.owner.state
        if not state.healthy:
            raise engine_unavailable(state.error or "the model is still loading")
        raise APIError(503, f"adapter registry unavailable: {self._error or 'not built yet'}")


def install(ctx: AppContext) -> None:
    """Adapter state (its routes are mounted from the route table). The pipeline resolves adapters
    whether LoRA is on or off: with it off, a request that names an adapter is a 404, not the base
    model's answer."""
    ctx.adapters = AdapterState(ctx.config, ctx.owner)
    ctx.owner.on_ready.append(ctx.adapters.build)
