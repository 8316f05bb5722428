"""Choosing the adapter per request (the pipeline's "resolve" stage).

Precedence: header `X-Amzn-SageMaker-Adapter-Identifier`, then the LMI body field `"adapters"`,
then the `"model"` field naming an adapter; the base model when none is named. Whether LoRA is on
or off, a request that names an adapter is served by it or refused with a 404 naming what exists,
never answered by the base model instead. Resolving takes a lease on the adapter (loading it on
first use), kept in the request's context; `api/admit.RequestScopeMiddleware` releases it when the
response has been sent completely, streaming included. An adapter's formatters run where all
formatters run (api/formatting.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lmi_server.adapters.registry import Lease
from lmi_server.adapters.transforms import isolated_cache_salt
from lmi_server.api.context import app_context, request_context
from lmi_server.api.errors import APIError, from_adapter_error
from lmi_server.api.standards import ADAPTER_HEADER

log = logging.getLogger(__name__)

__all__ = ["ADAPTER_HEADER", "AdapterUse", "adapters_field", "apply_cache_salt", "lmi_adapter_name", "resolve_adapter"]


@dataclass
class AdapterUse:
    """The adapter one request uses (kept in its context until its lease is released)."""

    name: str
    lease: Lease | None


def _serving_models(request: Request) -> Any:
    serving = getattr(app_context(request).owner.state, "serving", None)
    return getattr(serving, "openai_serving_models", None)


def base_names(request: Request) -> list[str]:
    models = _serving_models(request)
    return [p.name for p in getattr(models, "base_model_paths", None) or []]


def names_base_model(request: Request, model: str) -> bool:
    models = _serving_models(request)
    return models is not None and bool(models.is_base_model(model))


async def use_adapter(request: Request, name: str) -> AdapterUse:
    """Take a lease on the named adapter, or raise a 404 that says what this server serves: a
    request that names an adapter is never answered by another model."""
    registry = app_context(request).adapters.registry()
    if registry is None:
        served = ", ".join(repr(n) for n in base_names(request)) or "its base model"
        raise APIError(
            404, f"adapter or model {name!r} not found: this server serves {served} only "
            "(LoRA adapters are off: option.enable_lora=false)", param="model",
        )
    try:
        registry.get(name)
    except Exception as exc:
        raise (from_adapter_error(exc, param="model") or exc) from None
    use = AdapterUse(name=name, lease=None)
    try:
        use.lease = await registry.acquire(name)
    except Exception as exc:
        raise (from_adapter_error(exc, param="model") or exc) from None
    request_context(request).adapter = use  # from here the request's scope releases the lease
    return use


def adapters_field(request: Request, body: Any) -> Any:
    """LMI's body field `adapters` on a chat or completion body names the adapter as `model` does
    (the header still wins), on /invocations and on the /v1 routes alike; it is not passed on to
    vLLM, which would ignore it and answer with the base model."""
    if not isinstance(body, dict) or "inputs" in body or "adapters" not in body:
        return body
    body = dict(body)
    names = body.pop("adapters")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names) or len(set(names)) > 1:
        raise APIError(400, "adapters must name one adapter (a string, or a list of one name)", param="adapters", lmi_status=424)
    if names and not request.headers.get(ADAPTER_HEADER):
        body["model"] = names[0]
    return body


def lmi_adapter_name(req: Any) -> str | None:
    """LMI schema: the adapter its body names: `adapters` (one name, or a list naming one
    adapter), else `model`; None when it names none (the header is read by `resolve_adapter`)."""
    if req.adapters:
        names = [req.adapters] if isinstance(req.adapters, str) else list(req.adapters)
        distinct = sorted(set(names))
        if len(distinct) > 1:
            raise APIError(424, f"one adapter per request; got {distinct} (send one request per adapter)")
        if distinct:
            return distinct[0]
    return getattr(req, "model", None) or None


async def resolve_adapter(request: Request, parsed: Any) -> str | None:
    """The vLLM request's adapter: the header, else its `model` when that names no base model (an
    adapter, or a 404 naming what is served, LoRA on or off). The lease is taken and
    `parsed.model` set to the adapter's name (vLLM picks the LoRARequest by it)."""
    name = request.headers.get(ADAPTER_HEADER) or None
    model = getattr(parsed, "model", None)
    if name is None and model and not names_base_model(request, model):
        name = model
    if name is None:
        return None
    await use_adapter(request, name)
    parsed.model = name
    return name


def apply_cache_salt(request: Request, engine_request: Any) -> None:
    """With LoRA on, set the salt on the vLLM request about to be sent to the engine: KV reuse
    isolated per adapter and weights (see `isolated_cache_salt`). With it off, the client's own
    `cache_salt`, if any, is used as sent."""
    if not app_context(request).lora:
        return
    use: AdapterUse | None = request_context(request).adapter
    identity = None
    if use is not None and use.lease is not None:
        identity = use.lease.entry.cache_identity()
    engine_request.cache_salt = isolated_cache_salt(identity, getattr(engine_request, "cache_salt", None))
