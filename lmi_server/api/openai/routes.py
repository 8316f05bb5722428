"""OpenAI's front door: /v1/chat/completions, /v1/completions (through the pipeline) and /v1/models.

Here only what is OpenAI's: the body validated as vLLM's request type (with the checks vLLM's
validators would turn into 500s done first), LMI's `adapters` field read, the OpenAI shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmi_server.admission import BadPriority, body_priority
from lmi_server.api.adapters.routing import adapters_field
from lmi_server.api.context import Shape, begin
from lmi_server.api.errors import APIError, validated
from lmi_server.api.pipeline import Generation, engine_state, serve
from lmi_server.kvcache.blend.settings import prompt_boundaries, request_boundaries, request_mode, request_ratio

router = APIRouter()


def parse_request(model_cls, body):
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    if body.get("priority") is not None:
        try:  # as a bad x-priority header: 400, not the schema's 422
            body_priority(body["priority"])
        except BadPriority as exc:
            raise APIError(400, str(exc)) from None
    try:
        params = body.get("kv_transfer_params")
        request_ratio(params, 0.0)
        request_mode(params, "cacheblend", 0)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_boundaries(params, len(prompt))  # token ids: the offsets are checked here
        else:
            request_boundaries(params)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    return validated(model_cls.model_validate, body)


def chat_request_type():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest


def completion_request_type():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return CompletionRequest


def chat_call(serving: Any):
    return serving.openai_serving_chat.create_chat_completion


def completion_call(serving: Any):
    return serving.openai_serving_completion.create_completion


def generation_parser(request_type: Any, method: Any, stream: str = "sse"):
    """`parse` for the pipeline: vLLM's request type (LMI's `adapters` field, read by the pipeline's
    resolve stage, left out)."""

    def parse(body: Any) -> Generation:
        return Generation(parse_request(request_type, adapters_field(body)), method, stream=stream)

    return parse


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    return await serve(request, generation_parser(chat_request_type(), chat_call), shape=Shape.OPENAI)


@router.post("/v1/completions")
async def create_completion(request: Request):
    return await serve(request, generation_parser(completion_request_type(), completion_call), shape=Shape.OPENAI)


@router.get("/v1/models")
async def list_models(request: Request):
    begin(request, Shape.OPENAI)
    state = engine_state(request)
    models = await state.serving.openai_serving_models.show_available_models()
    return JSONResponse(models.model_dump())
