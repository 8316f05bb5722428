"""SageMaker's contract: GET /ping and POST /invocations.

/invocations picks its handler by validating the body against each request type in priority
order (LMI `inputs`, OpenAI chat `messages`, OpenAI completion `prompt`); the first that
validates wins. When none validates, the errors of the schema the body was closest to are shown.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from lmi_server.api import openai as openai_routes
from lmi_server.api.adapter_routing import adapters_field
from lmi_server.api.body import RAW_BODY_KEY, read_json_body
from lmi_server.api.custom_handler import run_custom_handler
from lmi_server.api.errors import APIError, validation_message
from lmi_server.api.generation import admission_ticket, admit, call_serving, engine_state, served_name, yielding
from lmi_server.api.lmi_formatters import apply_payload_formatter, respond
from lmi_server.api.lmi_protocol import (
    LMIRequest,
    ParameterError,
    as_sse,
    format_response,
    stream_jsonlines,
    tgi_list,
    to_completion_body,
)

router = APIRouter()


@router.get("/ping")
@router.get("/health", include_in_schema=False)  # the name routers and load balancers probe
async def ping(request: Request):
    owner = request.app.state.engine_owner
    state = owner.state
    if getattr(request.app.state, "draining", False):  # load balancers stop sending; in-flight finish
        return JSONResponse({"status": "draining", "detail": "shutting down"}, status_code=503)
    if state.healthy:
        degraded = getattr(owner.cache_server, "degraded", None)
        if degraded:  # the engine serves (recomputing KV); the cache tier is being restarted
            return JSONResponse({"status": "healthy", "degraded": degraded})
        return JSONResponse({"status": "healthy"})
    detail = {"starting": "loading the model", "recovering": state.error, "failed": state.error, "stopped": "shutting down"}.get(
        state.status, "engine not healthy"
    )
    if state.status == "ready":
        detail = "the engine has died: " + str(getattr(state.engine, "dead_error", "unknown error"))
    return JSONResponse({"status": state.status if state.status != "ready" else "unhealthy", "detail": detail}, status_code=503)


@router.get("/live", include_in_schema=False)
async def live():
    """Liveness for orchestrators: 200 while the process serves HTTP, starting, draining and
    rebuilding a dead engine included (/ping's 503 then means "send no new work", not "restart
    me"). A failed start, or an engine that keeps dying, ends the process itself
    (lifecycle.engine_watchdog)."""
    return JSONResponse({"status": "alive"})


def _schemas():
    return [
        ("lmi", LMIRequest, "inputs"),
        ("chat", openai_routes.chat_request_type(), "messages"),
        ("completion", openai_routes.completion_request_type(), "prompt"),
    ]


def _parameter_errors(exc: ValidationError) -> list[dict]:
    return [e for e in exc.errors() if tuple(e.get("loc", ()))[:1] == ("parameters",)]


def detect_schema(body: Any) -> tuple[str, Any]:
    """The first request type the body validates as. A body that fails the schema its marker
    names is LMI's 424 ("Input parsing failed"), except a bad generation parameter: a 400 that
    names it."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", lmi=True)
    failures: dict[str, str] = {}
    bad_parameters: dict[str, list[dict]] = {}
    for name, model, _ in _schemas():
        try:
            return name, model.model_validate(body)
        except ValidationError as exc:
            failures[name] = validation_message(exc.errors())
            bad_parameters[name] = _parameter_errors(exc) if len(_parameter_errors(exc)) == len(exc.errors()) else []
        except Exception as exc:  # noqa: BLE001 - vLLM's validators raise their own client errors
            failures[name] = str(exc)
    for name, _, marker in _schemas():
        if marker in body:
            if bad_parameters.get(name):
                raise APIError(400, f"invalid parameters: {failures[name]}", lmi=True)
            raise APIError(424, f"Input parsing failed: invalid {name} request: {failures[name]}", lmi=True)
    raise APIError(
        424,
        "Input parsing failed: the body matches none of the accepted schemas: LMI {\"inputs\": \"...\", "
        "\"parameters\": {...}}, OpenAI chat {\"messages\": [...]} or OpenAI completion {\"prompt\": \"...\"}",
        lmi=True,
    )


@router.post("/invocations")
async def invocations(request: Request):
    """parse -> session -> custom handler -> format in -> schema -> serve (adapter, admission,
    format out) -> respond; every error in LMI's flat body."""
    try:
        body = await read_json_body(request, request.app.state.config.server.max_request_bytes)
        session_headers = await request.app.state.session_hook(request, body)
        if isinstance(session_headers, Response):
            return session_headers
        handler = getattr(request.app.state.model_formatters, "handler", None)
        if handler is not None:
            handled = await run_custom_handler(request, handler, request.scope["state"].get(RAW_BODY_KEY, b""))
            if handled is not None:
                return handled
        body = apply_payload_formatter(request, body, lmi=True)  # LMI's input formatter: any body shape in
        schema, parsed = detect_schema(adapters_field(request, body, lmi=True))
        if schema == "chat":
            return await openai_routes.chat_completion(request, parsed, session_headers, stream_kind="jsonl")
        if schema == "completion":
            return await openai_routes.completion(request, parsed, session_headers, stream_kind="jsonl")
        return await lmi_generate(request, parsed, session_headers)
    except APIError as exc:
        exc.lmi = True  # /invocations answers errors as LMI does: {"error": ..., "code": ...}
        raise


@functools.cache
def _completion_fields() -> frozenset[str]:
    """The names vLLM's CompletionRequest takes (read once, not per request)."""
    return frozenset(openai_routes.completion_request_type().model_fields)


async def lmi_generate(request: Request, req: LMIRequest, headers: dict[str, str] | None):
    state = engine_state(request)
    if req.stream and isinstance(req.inputs, list) and len(req.inputs) != 1:
        raise APIError(424, "streaming takes a single input; send one request per input", lmi=True)
    model = await request.app.state.lmi_model_resolver(request, req)
    try:
        completion_body = to_completion_body(req, model or served_name(state), _completion_fields())
        completion_req = openai_routes.completion_request_type().model_validate(completion_body)
    except ParameterError as exc:
        raise APIError(400, str(exc), param=exc.param, lmi=True) from None
    except ValidationError as exc:
        raise APIError(400, f"invalid parameters: {validation_message(exc.errors())}", lmi=True) from None
    except Exception as exc:  # noqa: BLE001 - vLLM's own request validators
        raise APIError(400, f"invalid parameters: {exc}", lmi=True) from None
    request.app.state.cache_salter(request, completion_req)
    await admit(request, state, lmi=True, parsed=completion_req)
    result = await call_serving(
        state.serving.openai_serving_completion.create_completion(completion_req, request), request, lmi=True
    )
    tgi = request.app.state.config.server.tgi_compat  # TGI's shape: a list, or server-sent events
    return await respond(
        request, result,
        shape_json=lambda body: tgi_list(format_response(req, body)) if tgi else format_response(req, body),
        shape_stream=lambda events: as_sse(stream_jsonlines(req, events)) if tgi else stream_jsonlines(req, events),
        kind="sse" if tgi else "jsonl", headers=headers, wrap=lambda body: yielding(body, admission_ticket(request)),
    )
