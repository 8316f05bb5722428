"""POST /v1/messages and POST /v1/messages/count_tokens.

The work is vLLM's `AnthropicServingMessages` (built by vLLM's `init_app_state` in `engine.py`):
it turns a Messages request into a chat completion and the result back into Anthropic's message or
event stream. This module parses the body, runs it through the steps every generating route takes
(`api/front_door.py`: formatters, model/adapter, media, admission), clamps `max_tokens` to what fits
the context (Claude Code asks 32,000 whatever the model), and answers errors in Anthropic's format.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api import output_budget
from lmi_server.api.anthropic.errors import in_anthropic_format
from lmi_server.api.front_door import check_parts, read_request, resolve_model, take_slot
from lmi_server.api.generation import as_response, call_serving, engine_state

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
PATHS = (MESSAGES, COUNT_TOKENS)
router = APIRouter()


def messages_type():
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

    return AnthropicMessagesRequest


def count_type():
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest

    return AnthropicCountTokensRequest


def _image_url(source: Any) -> str | None:
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    return AnthropicServingMessages._convert_image_source_to_url(source) if isinstance(source, dict) else None


def content_parts(parsed: Any):
    """(where, "image", URL) for each image block, in messages and in tool results."""
    for i, message in enumerate(parsed.messages):
        blocks = message.content if isinstance(message.content, list) else []
        for j, block in enumerate(blocks):
            if block.type == "image":
                yield f"messages[{i}].content[{j}]", "image", _image_url(block.source)
            for k, inner in enumerate(block.content if isinstance(block.content, list) else []):
                if isinstance(inner, dict) and inner.get("type") == "image":
                    yield f"messages[{i}].content[{j}].content[{k}]", "image", _image_url(inner.get("source"))


async def prompt_tokens(serving: Any, parsed: Any) -> int | None:
    """The prompt's length as vLLM renders it (its count_tokens), or None when it cannot be counted."""
    try:
        counted = await serving.count_tokens(count_type().model_validate(parsed.model_dump(exclude={"max_tokens"})))
    except Exception:  # noqa: BLE001 - the real call raises it again, mapped to its 4xx
        return None
    return getattr(counted, "input_tokens", None)


async def clamp(serving: Any, parsed: Any, body_bytes: int) -> dict[str, str] | None:
    """`max_tokens` beyond the context's room lowered to it; the header that says so."""
    limit = serving.model_config.max_model_len
    requested = parsed.max_tokens
    if not output_budget.could_overflow(requested, body_bytes, limit):
        return None
    used = output_budget.fitted(requested, await prompt_tokens(serving, parsed) or limit, limit)
    if used is None:
        return None
    parsed.max_tokens = used
    return output_budget.clamp_header(requested, used)


def dumped(result: Any) -> Any:
    """vLLM's own JSON for a Messages response (unset fields left out, as Anthropic sends it)."""
    return result.model_dump(exclude_none=True) if hasattr(result, "model_dump") else result


@router.post(MESSAGES)
@in_anthropic_format
async def create_message(request: Request):
    parsed, size = await read_request(request, messages_type())
    state = engine_state(request)
    serving = state.serving.anthropic_serving_messages
    await check_parts(request, state, content_parts(parsed))
    await resolve_model(request, state, parsed)
    headers = await clamp(serving, parsed, size)
    await take_slot(request, state, parsed)
    result = await call_serving(serving.create_messages(parsed, request), request)
    return await as_response(result, request, headers, dump=dumped)


@router.post(COUNT_TOKENS)
@in_anthropic_format
async def count_tokens(request: Request):
    parsed, _ = await read_request(request, count_type())
    state = engine_state(request)
    await check_parts(request, state, content_parts(parsed))
    await resolve_model(request, state, parsed)
    result = await call_serving(state.serving.anthropic_serving_messages.count_tokens(parsed, request), request)
    return await as_response(result, request, dump=dumped)
