"""Choosing the adapter per request (the pipeline's "resolve" stage), from the body as it came.

Precedence: header `X-Amzn-SageMaker-Adapter-Identifier`, then the body field `"adapters"` (LMI's;
on chat and completion bodies too), then the `"model"` field naming an adapter; the base model when
none is named. Each may name an adapter by its name or by the alias SageMaker registered it with
(`X-Amzn-SageMaker-Adapter-Alias`, which also names the adapter in the errors). The adapter's input formatter then runs on the body (api/format_in.py). Whether LoRA is on
or off, a request that names an adapter is served by it or refused with a 404 naming what exists,
never answered by the base model instead. Resolving takes a lease on the adapter (loading it on
first use), kept in the request's context; `api/request_scope.RequestScopeMiddleware` releases it when the
response has been sent completely, streaming included. An adapter's formatters run where all
formatters run (api/format_in.py, api/respond.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lmi_server.adapters.registry import AdapterNotFound, Lease
from lmi_server.api.adapters.alias import alias_of
from lmi_server.api.context import app_context, request_context
from lmi_server.api.errors import APIError, from_adapter_error
from lmi_server.api.standards import ADAPTER_HEADER

log = logging.getLogger(__name__)

__all__ = ["ADAPTER_HEADER", "AdapterUse", "adapter_named", "adapters_field", "resolve_adapter"]

LMI_MODEL_NAME = "lmi"  # LMI's served name when none is set: LMI clients send it for the base model


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
    shown = alias_of(request) or name  # SageMaker's alias names the adapter in its errors
    if registry is None:
        served = ", ".join(repr(n) for n in base_names(request)) or "its base model"
        raise APIError(
            404, f"adapter or model {shown!r} not found: this server serves {served} only "
            "(LoRA adapters are off: option.enable_lora=false)", param="model",
        )
    try:
        name = registry.get(name).name  # an alias names its adapter
    except AdapterNotFound as exc:
        served = ", ".join(repr(n) for n in base_names(request)) or "its base model"
        raise APIError(404, f"model {shown!r} not found: this server serves {served}{str(exc).partition(' not found')[2]}",
                       param="model") from None
    except Exception as exc:
        raise (from_adapter_error(exc, param="model") or exc) from None
    use = AdapterUse(name=name, lease=None)
    try:
        use.lease = await registry.acquire(name)
    except Exception as exc:
        raise (from_adapter_error(exc, param="model") or exc) from None
    request_context(request).adapter = use  # from here the request's scope releases the lease
    return use


def adapter_named(request: Request, body: Any) -> str | None:
    """The adapter a request names: the header, else the body's `adapters` (one name, or a list
    naming one adapter: else 400, LMI's 424), else its `model` when that names neither LMI's "lmi"
    nor a base model; None for the base model."""
    name = request.headers.get(ADAPTER_HEADER)
    if name:
        return name
    if not isinstance(body, dict):
        return None
    names = body.get("adapters")
    if names is not None:
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise APIError(400, "adapters must name one adapter (a string, or a list of one name)", param="adapters", lmi_status=424)
        distinct = sorted(set(names))
        if len(distinct) > 1:
            raise APIError(400, f"one adapter per request; got {distinct} (send one request per adapter)",
                           param="adapters", lmi_status=424)
        if distinct:
            return distinct[0]
    model = body.get("model")
    if isinstance(model, str) and model and model != LMI_MODEL_NAME and not names_base_model(request, model):
        return model
    return None


async def resolve_adapter(request: Request, body: Any) -> AdapterUse | None:
    """The pipeline's "resolve" stage: the adapter the body names, leased (a 404 naming what is
    served when there is none such, LoRA on or off), kept in the request's context."""
    name = adapter_named(request, body)
    return await use_adapter(request, name) if name is not None else None


def adapters_field(body: Any) -> Any:
    """A chat or completion body without LMI's `adapters` field (read by `resolve_adapter`; vLLM
    would ignore it and answer with the base model)."""
    if not isinstance(body, dict) or "inputs" in body or "adapters" not in body:
        return body
    return {k: v for k, v in body.items() if k != "adapters"}
