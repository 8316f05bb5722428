"""The OpenAPI document with the request bodies the routes really take.

Why: the generation routes read their bodies themselves (schema detection, size limits, vLLM's own
request models), so FastAPI cannot see them and `/openapi.json` would show no body at all. Clients,
generated SDKs and the fuzzing tests (schemathesis) need them: this adds vLLM's chat and completion
request schemas, LMI's schema and the session and adapter bodies, built once on first request.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

REF = "#/components/schemas/{model}"
SESSION_REQUEST = {
    "title": "SessionRequest",
    "type": "object",
    "properties": {"requestType": {"type": "string", "enum": ["NEW_SESSION", "CLOSE"]}},
    "required": ["requestType"],
    "additionalProperties": False,
}


def _schema_of(model: Any, components: dict[str, Any]) -> dict[str, Any]:
    """`model`'s JSON schema with its definitions hoisted into the document's components."""
    schema = model.model_json_schema(ref_template=REF)
    components.update(schema.pop("$defs", {}))
    name = model.__name__
    components[name] = schema
    return {"$ref": REF.format(model=name)}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    from lmi_server.api.adapters.routes import RegisterAdapter, UpdateAdapter
    from lmi_server.api.openai.routes import chat_request_type, completion_request_type
    from lmi_server.api.sagemaker.lmi_protocol import LMIRequest

    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    chat = _schema_of(chat_request_type(), components)
    completion = _schema_of(completion_request_type(), components)
    lmi = _schema_of(LMIRequest, components)
    adapter = _schema_of(RegisterAdapter, components)
    adapter_update = _schema_of(UpdateAdapter, components)
    components["SessionRequest"] = SESSION_REQUEST
    session = {"$ref": REF.format(model="SessionRequest")}
    bodies = {
        "/v1/chat/completions": chat,
        "/v1/completions": completion,
        "/invocations": {"anyOf": [lmi, chat, completion, session]},
        "/adapters": adapter,
        "/models/{model}/adapters": adapter,
        "/adapters/{name}/update": adapter_update,
        "/models/{model}/adapters/{name}/update": adapter_update,
    }
    kind_bodies = app.state.ctx.request_bodies  # the model kind's own routes (api/kinds.py)
    if kind_bodies is not None:
        bodies.update(kind_bodies(components))
    for path, schema in bodies.items():
        post = doc.get("paths", {}).get(path, {}).get("post")
        if post is not None:
            post["requestBody"] = _json_body(schema)
    return doc


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
