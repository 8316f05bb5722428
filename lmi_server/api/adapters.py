"""Adapter management (LMI-compatible): list, describe, register, unregister.

    GET    /adapters                    GET    /models/{model}/adapters
    GET    /adapters/{name}             GET    /models/{model}/adapters/{name}
    POST   /adapters                    POST   /models/{model}/adapters
    DELETE /adapters/{name}             DELETE /models/{model}/adapters/{name}

POST takes `name`, `src` (a local directory inside the adapter root), optional `preload` and
`pin`, as a JSON body or as query parameters (LMI's form). Validation failures are 400 with the
reason; an unknown name is 404; a name already registered is 409 (the adapter package's errors
are mapped to HTTP in `api/errors.py`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from lmi_server.api.body import read_json_body
from lmi_server.api.errors import APIError, validation_message

router = APIRouter()


class RegisterAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    src: str
    preload: bool = False
    pin: bool = False


def _registry(request: Request, *, required: bool):
    registry = request.app.state.adapters.registry()
    if registry is None and required:
        raise APIError(400, "LoRA adapters are disabled; start the server with option.enable_lora=true")
    return registry


def _check_model(request: Request, model: str | None) -> None:
    if model is None:
        return
    names = request.app.state.config.model.served_names
    if model not in names:
        raise APIError(404, f"model {model!r} not found; this server serves {names}")


async def _list(request: Request, model: str | None = None):
    _check_model(request, model)
    registry = _registry(request, required=False)
    if registry is None:
        return JSONResponse({"adapters": [], "failed": {}})
    return JSONResponse({"adapters": registry.describe(), "failed": dict(registry.failed)})


async def _describe(request: Request, name: str, model: str | None = None):
    _check_model(request, model)
    registry = _registry(request, required=True)
    return JSONResponse(registry.get(name).describe())


async def _register(request: Request, model: str | None = None):
    _check_model(request, model)
    registry = _registry(request, required=True)
    raw: dict[str, Any] = dict(request.query_params)
    if (request.headers.get("content-length") or "0") != "0" or request.headers.get("transfer-encoding"):
        data = await read_json_body(request, request.app.state.config.server.max_request_bytes)
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object: {\"name\": \"...\", \"src\": \"...\"}")
        raw.update(data)
    try:
        req = RegisterAdapter.model_validate(raw)
    except ValidationError as exc:
        raise APIError(400, validation_message(exc.errors()) + ' (example: {"name": "my-adapter", "src": "my-adapter"})') from None
    entry = await registry.add(req.name, req.src, preload=req.preload, pin=req.pin)
    return JSONResponse({"status": f"Adapter {req.name} registered", "adapter": entry.describe()})


async def _unregister(request: Request, name: str, model: str | None = None):
    _check_model(request, model)
    registry = _registry(request, required=True)
    entry = await registry.remove(name)
    return JSONResponse({"status": f"Adapter {name} unregistered", "in_flight": entry.in_flight if entry else 0})


@router.get("/adapters")
async def list_adapters(request: Request):
    return await _list(request)


@router.get("/adapters/{name}")
async def describe_adapter(request: Request, name: str):
    return await _describe(request, name)


@router.post("/adapters")
async def register_adapter(request: Request):
    return await _register(request)


@router.delete("/adapters/{name}")
async def unregister_adapter(request: Request, name: str):
    return await _unregister(request, name)


@router.get("/models/{model}/adapters")
async def list_model_adapters(request: Request, model: str):
    return await _list(request, model)


@router.get("/models/{model}/adapters/{name}")
async def describe_model_adapter(request: Request, model: str, name: str):
    return await _describe(request, name, model)


@router.post("/models/{model}/adapters")
async def register_model_adapter(request: Request, model: str):
    return await _register(request, model)


@router.delete("/models/{model}/adapters/{name}")
async def unregister_model_adapter(request: Request, model: str, name: str):
    return await _unregister(request, name, model)
