"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmi_server.api.adapter_routing import adapters_field
from lmi_server.api.body import read_json_body
from lmi_server.api.errors import APIError, validated
from lmi_server.api.generation import admit, as_response, call_serving, engine_state, served_name
from lmi_server.api.lmi_formatters import apply_payload_formatter
from lmi_server.api.media import check_messages
from lmi_server.api.admission import BadPriority
from lmi_server.api.tenants import body_priority
from lmi_server.kvcache.blend.settings import prompt_boundaries, request_boundaries, request_ratio

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


TEXT_PART_TYPES = {"text", "input_text", "output_text", "refusal", "thinking"}


def reject_foreign_messages(parsed, state) -> None:
    """Image/audio/video parts for a text-only model are a 400 (vLLM raises a ValueError that would be
    a 500). vLLM's chat request type also validates OpenAI-Harmony `Message` objects (author, channel,
    recipient), which only gpt-oss models render; any other model would fail inside vLLM with a 500."""
    messages = getattr(parsed, "messages", None) or []
    model_config = getattr(state.engine, "model_config", None)
    if not getattr(model_config, "is_multimodal_model", False):
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            for part in content if isinstance(content, list) else []:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind is not None and kind not in TEXT_PART_TYPES:
                    raise APIError(400, f"messages[{i}]: content of type {kind!r} needs a multimodal model; this model reads text")
    foreign = [i for i, m in enumerate(messages) if not isinstance(m, dict)]
    if not foreign:
        return
    hf_config = getattr(model_config, "hf_config", None)
    if getattr(hf_config, "model_type", None) == "gpt_oss":
        return
    raise APIError(
        400,
        f"messages[{foreign[0]}]: a Harmony-format message (author/channel/recipient) is only accepted by "
        "gpt-oss models; send {\"role\": ..., \"content\": ...}",
    )


LMI_MODEL_NAME = "lmi"  # LMI's served name when none is set: LMI clients send it


def lmi_model_alias(parsed, state) -> None:
    """`"model": "lmi"` names the base model, as in LMI (unless a model is really served as "lmi")."""
    if getattr(parsed, "model", None) == LMI_MODEL_NAME:
        name = served_name(state)
        if name is not None and name != LMI_MODEL_NAME:
            parsed.model = name


async def check_messages_and_model(request: Request, parsed, state) -> None:
    """What every route that hands a chat or completion body to vLLM checks first: content parts
    the model cannot read and foreign message formats (400), images against the media policy
    (multimodal models), and LMI's `"model": "lmi"` alias."""
    reject_foreign_messages(parsed, state)
    if getattr(getattr(state.engine, "model_config", None), "is_multimodal_model", False):
        await asyncio.to_thread(check_messages, getattr(parsed, "messages", None) or [], request.app.state.media_policy)
    lmi_model_alias(parsed, state)


async def _generate(request: Request, parsed, headers: dict[str, str] | None, create, stream_kind: str = "sse"):
    """Resolve the model/adapter, call one of vLLM's serving methods, shape the response."""
    state = engine_state(request)
    await check_messages_and_model(request, parsed, state)
    await request.app.state.model_resolver(request, parsed)
    request.app.state.cache_salter(request, parsed)
    await admit(request, state, parsed=parsed)
    result = await call_serving(create(state.serving)(parsed, request), request, lmi=stream_kind == "jsonl")
    return await as_response(result, request, headers, stream_kind)


async def chat_completion(request: Request, parsed, headers: dict[str, str] | None = None, stream_kind: str = "sse"):
    return await _generate(request, parsed, headers, lambda serving: serving.openai_serving_chat.create_chat_completion, stream_kind)


async def completion(request: Request, parsed, headers: dict[str, str] | None = None, stream_kind: str = "sse"):
    return await _generate(request, parsed, headers, lambda serving: serving.openai_serving_completion.create_completion, stream_kind)


async def _read_and_parse(request: Request, request_type, *, generating: bool = False):
    """Body -> vLLM's request type. `generating`: LMI's `adapters` field names the adapter, as on
    /invocations (the render routes only tokenize: there vLLM ignores it)."""
    body = await read_json_body(request, request.app.state.config.server.max_request_bytes)
    engine_state(request)  # 503 first: nothing can run before the engine is ready
    body = apply_payload_formatter(request, body, lmi=False)  # LMI's input formatter, before parsing
    if generating:
        body = adapters_field(request, body, lmi=False)
    return parse_request(request_type, body)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    return await chat_completion(request, await _read_and_parse(request, chat_request_type(), generating=True))


@router.post("/v1/completions")
async def create_completion(request: Request):
    return await completion(request, await _read_and_parse(request, completion_request_type(), generating=True))


@router.get("/v1/models")
async def list_models(request: Request):
    state = engine_state(request)
    models = await state.serving.openai_serving_models.show_available_models()
    return JSONResponse(models.model_dump())
