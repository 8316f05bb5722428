"""Choosing the adapter per request, running its formatters, releasing its lease.

Precedence: header `X-Amzn-SageMaker-Adapter-Identifier`, then the LMI body field `"adapters"`,
then the OpenAI `"model"` field naming an adapter; the base model when none is named.

The resolvers are installed on `app.state.model_resolver` / `app.state.lmi_model_resolver`
(the hooks the routers call before handing a request to vLLM), whether LoRA is on or off: a request
that names an adapter is served by it or refused with a 404 naming what exists, never answered by
the base model instead. A resolver takes a lease on the adapter (loading it on first use);
`AdapterLeaseMiddleware` releases it when the response has been sent completely, streaming
included. An adapter's formatters run where all formatters run
(lmi_server/api/lmi_formatters.py: the body on the way in, vLLM's output on the way out).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lmi_server.adapters.registry import Lease
from lmi_server.adapters.transforms import isolated_cache_salt
from lmi_server.api.errors import APIError, from_adapter_error
from lmi_server.api.standards import SageMakerLoRAApiHeader

log = logging.getLogger(__name__)

ADAPTER_HEADER = SageMakerLoRAApiHeader.ADAPTER_IDENTIFIER.lower()  # x-amzn-sagemaker-adapter-identifier
STATE_KEY = "lmi_adapter_use"
STREAMS_KEY = "lmi_streams"  # the response's async generators, innermost (vLLM's) first


async def close_streams(state: dict) -> None:
    """Close the response's generators, outermost first: vLLM's generator, closed, aborts the
    request in the engine (AsyncLLM.generate catches GeneratorExit and calls abort)."""
    for gen in reversed(state.pop(STREAMS_KEY, [])):
        try:
            await gen.aclose()
        except Exception:  # noqa: BLE001 - closing is best effort; the engine side logs its own
            log.debug("closing a response stream failed", exc_info=True)


@dataclass
class AdapterUse:
    """The adapter one request uses (kept in the ASGI scope's state until its lease is released)."""

    name: str
    lease: Lease | None


def _registry(request: Request):
    return request.app.state.adapters.registry()


def _serving_models(request: Request) -> Any:
    serving = getattr(request.app.state.engine_owner.state, "serving", None)
    return getattr(serving, "openai_serving_models", None)


def base_names(request: Request) -> list[str]:
    models = _serving_models(request)
    return [p.name for p in getattr(models, "base_model_paths", None) or []]


def names_base_model(request: Request, model: str) -> bool:
    models = _serving_models(request)
    return models is not None and bool(models.is_base_model(model))


async def use_adapter(request: Request, name: str, *, lmi: bool) -> AdapterUse:
    """Take a lease on the named adapter, or raise a 404 that says what this server serves: a
    request that names an adapter is never answered by another model."""
    registry = _registry(request)
    param = None if lmi else "model"
    if registry is None:
        served = ", ".join(repr(n) for n in base_names(request)) or "its base model"
        raise APIError(
            404, f"adapter or model {name!r} not found: this server serves {served} only "
            "(LoRA adapters are off: option.enable_lora=false)", param=param, lmi=lmi,
        )
    try:
        registry.get(name)
    except Exception as exc:
        raise (from_adapter_error(exc, lmi=lmi, param=param) or exc) from None
    use = AdapterUse(name=name, lease=None)
    try:
        use.lease = await registry.acquire(name)
    except Exception as exc:
        raise (from_adapter_error(exc, lmi=lmi, param=param) or exc) from None
    request.state.__setattr__(STATE_KEY, use)  # from here the middleware releases the lease
    return use


def adapters_field(request: Request, body: Any, *, lmi: bool) -> Any:
    """LMI's body field `adapters` on a chat or completion body names the adapter as `model` does
    (the header still wins), on /invocations and on the /v1 routes alike; it is not passed on to
    vLLM, which would ignore it and answer with the base model."""
    if not isinstance(body, dict) or "inputs" in body or "adapters" not in body:
        return body
    body = dict(body)
    names = body.pop("adapters")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names) or len(set(names)) > 1:
        message = "adapters must name one adapter (a string, or a list of one name)"
        raise APIError(424, "Input parsing failed: " + message, lmi=True) if lmi else APIError(400, message, param="adapters")
    if names and not request.headers.get(ADAPTER_HEADER):
        body["model"] = names[0]
    return body


async def openai_model_resolver(request: Request, parsed: Any) -> None:
    """OpenAI chat/completion: header, else `model` when it names no base model (an adapter, or
    a 404 naming what is served, LoRA on or off)."""
    name = request.headers.get(ADAPTER_HEADER) or None
    model = getattr(parsed, "model", None)
    if name is None and model and not names_base_model(request, model):
        name = model
    if name is None:
        return None
    await use_adapter(request, name, lmi=False)
    parsed.model = name  # vLLM picks the LoRARequest by this name
    return None


async def lmi_model_resolver(request: Request, req: Any) -> str | None:
    """LMI schema: header, else body `adapters` (one name, or a list naming one adapter), else
    `model` when it names neither LMI's "lmi" nor a base model."""
    name = request.headers.get(ADAPTER_HEADER) or None
    if name is None and req.adapters:
        names = [req.adapters] if isinstance(req.adapters, str) else list(req.adapters)
        distinct = sorted(set(names))
        if len(distinct) > 1:
            raise APIError(424, f"one adapter per request; got {distinct} (send one request per adapter)", lmi=True)
        name = distinct[0] if distinct else None
    model = getattr(req, "model", None)
    if name is None and model and model != "lmi" and not names_base_model(request, model):
        name = model
    if not name:
        return None
    await use_adapter(request, name, lmi=True)
    return name


def apply_cache_salt(request: Request, engine_request: Any) -> None:
    """Set the salt on the vLLM request (chat or completion) about to be sent to the engine:
    KV reuse isolated per adapter and weights (see `isolated_cache_salt`)."""
    use: AdapterUse | None = getattr(request.state, STATE_KEY, None)
    identity = None
    if use is not None and use.lease is not None:
        identity = use.lease.entry.cache_identity()
    engine_request.cache_salt = isolated_cache_salt(identity, getattr(engine_request, "cache_salt", None))


class AdapterLeaseMiddleware:
    """Releases the request's adapter lease once the response has been sent (or has failed)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        try:
            await self.app(scope, receive, send)
        finally:
            use = state.get(STATE_KEY)
            if use is not None and use.lease is not None:
                await use.lease.release()
