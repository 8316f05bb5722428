"""Adapter management, LMI's API: list, describe, register, update, unregister.

    GET    /adapters                    GET    /models/{model}/adapters
    GET    /adapters/{name}             GET    /models/{model}/adapters/{name}
    POST   /adapters                    POST   /models/{model}/adapters
    POST   /adapters/{name}/update      POST   /models/{model}/adapters/{name}/update
    DELETE /adapters/{name}             DELETE /models/{model}/adapters/{name}

Fields (query parameters, LMI's form, or a JSON body): `name`, `src` (a local directory inside the
adapter root, or s3://...: one with a model.py only under option.trust_remote_code), `preload`
(default true, as LMI: load the weights now), `pin` (default false: keep them resident; `pinned`
is accepted as another name). Update takes `preload`, `pin` (and `src`,
which must be unchanged); what it does not name keeps its value. Listing pages as LMI's does
(`limit`, `next_page_token`; `nextPageToken` in the answer while more follow).

This server serves one model, so `{model}` in the path is not checked (LMI's integration client
addresses the model by its directory's name). Invalid input is 400 with the reason, an unknown
adapter 404, a name already registered 409, an adapter whose weights cannot be loaded 424 (the
adapter package's errors are mapped to HTTP in `api/errors.py`). The logic is the registry's.

SageMaker's `X-Amzn-SageMaker-Adapter-Alias` (`alias.py`): registered with the adapter (a second
name requests may use), named instead of the name in the answers and the errors, and sent back.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from lmi_server.adapters.errors import AdapterNotFound
from lmi_server.api.adapters.alias import alias_of, not_found, shown
from lmi_server.api.body import read_json_body
from lmi_server.api.context import app_context
from lmi_server.api.errors import ADAPTER_ERRORS, APIError, from_adapter_error, validation_message
from lmi_server.api.standards import ALIAS_HEADER

router = APIRouter()

LORA_OFF = "LoRA is not enabled; start the server with option.enable_lora=true"


class RegisterAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    src: str
    preload: bool = True
    pin: bool = Field(False, validation_alias=AliasChoices("pin", "pinned"))


class UpdateAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    src: str | None = None
    preload: bool | None = None
    pin: bool | None = Field(None, validation_alias=AliasChoices("pin", "pinned"))


class ListPage(BaseModel):
    limit: int = 100
    next_page_token: int = 0


def _registry(request: Request, *, required: bool):
    registry = app_context(request).adapters.registry()
    if registry is None and required:
        raise APIError(400, LORA_OFF)
    return registry


async def _fields(request: Request, model: type[BaseModel], example: str):
    """Query parameters and a JSON body (the body wins), validated against `model`."""
    raw: dict[str, Any] = dict(request.query_params)
    if (request.headers.get("content-length") or "0") != "0" or request.headers.get("transfer-encoding"):
        data = await read_json_body(request, app_context(request).config.server.max_request_bytes)
        if not isinstance(data, dict):
            raise APIError(400, f"request body must be a JSON object, for example {example}")
        raw.update(data)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise APIError(400, f"{validation_message(exc.errors())} (example: {example})") from None


async def _list(request: Request):
    registry = _registry(request, required=False)
    try:
        page = ListPage.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise APIError(400, validation_message(exc.errors()) + " (example: ?limit=10&next_page_token=0)") from None
    if registry is None:
        return JSONResponse({"adapters": [], "failed": {}})
    items, next_token = registry.page(page.limit, page.next_page_token)
    body: dict[str, Any] = {"adapters": items, "failed": dict(registry.failed)}
    if next_token is not None:
        body["nextPageToken"] = next_token
    return JSONResponse(body)


def _as_alias(request: Request, name: str, exc: Exception) -> Exception:
    """An adapter error as HTTP, worded with SageMaker's alias when the request gives one: "The
    adapter {alias} was not found" for an unknown adapter, the alias before any other reason."""
    mapped = from_adapter_error(exc)
    if mapped is None:
        return exc
    if isinstance(exc, AdapterNotFound):  # LMI's wording, with what is registered
        return APIError(404, not_found(request, name) + str(exc).partition(" not found")[2], headers=_echo(request))
    alias = alias_of(request)
    if alias is not None and alias != name:
        mapped.message = f"adapter {alias}: {mapped.message}"
        mapped.args = (mapped.message,)
    mapped.headers = _echo(request)
    return mapped


def _echo(request: Request) -> dict[str, str] | None:
    """SageMaker's alias header, sent back on the adapter API's answers."""
    alias = alias_of(request)
    return {ALIAS_HEADER: alias} if alias is not None else None


def _answer(request: Request, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=_echo(request))


async def _describe(request: Request, name: str):
    try:
        return _answer(request, _registry(request, required=True).get(name).describe())
    except ADAPTER_ERRORS as exc:
        raise _as_alias(request, name, exc) from None


async def _register(request: Request):
    registry = _registry(request, required=True)
    req = await _fields(request, RegisterAdapter, '{"name": "my-adapter", "src": "my-adapter", "preload": true, "pin": false}')
    try:
        entry = await registry.add(req.name, req.src, preload=req.preload, pin=req.pin, alias=alias_of(request))
    except ADAPTER_ERRORS as exc:
        raise _as_alias(request, req.name, exc) from None
    return _answer(request, {"status": f"Adapter {shown(request, req.name)} registered", "adapter": entry.describe()})


async def _update(request: Request, name: str):
    registry = _registry(request, required=True)
    req = await _fields(request, UpdateAdapter, '{"preload": true, "pin": true}')
    if req.name is not None and req.name != name:
        raise APIError(400, f"name {req.name!r} in the request differs from the adapter {name!r} in the path; renaming is not supported")
    try:
        entry = await registry.update(registry.get(name).name, src=req.src, preload=req.preload, pin=req.pin)
    except ADAPTER_ERRORS as exc:
        raise _as_alias(request, name, exc) from None
    return _answer(request, {"status": f"Adapter {shown(request, name)} updated", "adapter": entry.describe()})


async def _unregister(request: Request, name: str):
    registry = _registry(request, required=True)
    try:
        entry = await registry.remove(name)
    except ADAPTER_ERRORS as exc:
        raise _as_alias(request, name, exc) from None
    return _answer(request, {"status": f"Adapter {shown(request, name)} unregistered", "in_flight": entry.in_flight if entry else 0})


# Both path shapes LMI answers. This server serves one model: `{model}` is not checked.


@router.get("/adapters")
async def list_adapters(request: Request):
    return await _list(request)


@router.post("/adapters")
async def register_adapter(request: Request):
    return await _register(request)


@router.get("/adapters/{name}")
async def describe_adapter(request: Request, name: str):
    return await _describe(request, name)


@router.post("/adapters/{name}/update")
async def update_adapter(request: Request, name: str):
    return await _update(request, name)


@router.delete("/adapters/{name}")
async def unregister_adapter(request: Request, name: str):
    return await _unregister(request, name)


@router.get("/models/{model}/adapters")
async def list_model_adapters(request: Request, model: str):
    return await _list(request)


@router.post("/models/{model}/adapters")
async def register_model_adapter(request: Request, model: str):
    return await _register(request)


@router.get("/models/{model}/adapters/{name}")
async def describe_model_adapter(request: Request, model: str, name: str):
    return await _describe(request, name)


@router.post("/models/{model}/adapters/{name}/update")
async def update_model_adapter(request: Request, model: str, name: str):
    return await _update(request, name)


@router.delete("/models/{model}/adapters/{name}")
async def unregister_model_adapter(request: Request, model: str, name: str):
    return await _unregister(request, name)
