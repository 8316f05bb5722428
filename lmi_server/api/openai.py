"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from lmi_server.api.body import read_json_body
from lmi_server.api.errors import APIError, validation_message
from lmi_server.api.generation import as_response, call_serving, engine_state

router = APIRouter()


def parse_request(model_cls, body):
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise APIError(422, validation_message(exc.errors())) from None
    except Exception as exc:  # noqa: BLE001 - vLLM's own request validators raise client errors
        raise APIError(422, str(exc)) from None


async def chat_completion(request: Request, body: dict, headers: dict[str, str] | None = None):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    state = engine_state(request)
    parsed = parse_request(ChatCompletionRequest, body)
    await request.app.state.model_resolver(request, parsed)
    result = await call_serving(state.serving.openai_serving_chat.create_chat_completion(parsed, request), request)
    return as_response(result, headers)


async def completion(request: Request, body: dict, headers: dict[str, str] | None = None):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    state = engine_state(request)
    parsed = parse_request(CompletionRequest, body)
    await request.app.state.model_resolver(request, parsed)
    result = await call_serving(state.serving.openai_serving_completion.create_completion(parsed, request), request)
    return as_response(result, headers)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    body = await read_json_body(request, request.app.state.config.server.max_request_bytes)
    return await chat_completion(request, body)


@router.post("/v1/completions")
async def create_completion(request: Request):
    body = await read_json_body(request, request.app.state.config.server.max_request_bytes)
    return await completion(request, body)


@router.get("/v1/models")
async def list_models(request: Request):
    state = engine_state(request)
    models = await state.serving.openai_serving_models.show_available_models()
    return JSONResponse(models.model_dump())
