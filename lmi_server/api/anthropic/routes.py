"""POST /v1/messages and POST /v1/messages/count_tokens.

The work is vLLM's `AnthropicServingMessages` (built by vLLM's `init_app_state` in `engine.py`): it
turns a Messages request into a chat completion and the result back into Anthropic's message or
event stream. POST /v1/messages goes through the pipeline (`api/pipeline.serve`); here only what is
Anthropic's: the body as vLLM's request type, its image blocks checked, `max_tokens` clamped to what
fits the context (Claude Code asks 32,000 whatever the model; `x-lmi-max-tokens-clamped`), the
answer as vLLM encodes it, errors in Anthropic's shape. Counting tokens takes no engine slot.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api import output_budget
from lmi_server.api.context import Shape, begin
from lmi_server.api.front_door import body_bytes, check_parts, send
from lmi_server.api.openai.routes import parse_request
from lmi_server.api.pipeline import Generation, call_serving, check_request, engine_state, read_checked, serve
from lmi_server.compat import vllm as compat_vllm

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


def messages_call(serving: Any):
    """vLLM's `create_messages` in its two halves: the chat completion here, so that an output
    formatter sees the chat answer or chunks it sees on /v1/chat/completions; vLLM's converters
    (`rendering`) make the Messages answer of what the formatter returned."""
    messages = serving.anthropic_serving_messages

    async def call(request: Any, raw_request: Any) -> Any:
        chat = await compat_vllm.anthropic_chat_request(messages, request)
        return await messages.create_chat_completion(chat, raw_request)

    return call


def rendering(serving: Any) -> dict[str, Any]:
    """The Generation's shaping: vLLM's chat answer (after the formatter) as a Messages answer or
    Anthropic's event stream, as vLLM's own create_messages would have returned it."""
    messages = serving.anthropic_serving_messages
    return {"dump": lambda chat: dumped(messages.messages_full_converter(chat)),
            "shape_stream": messages.message_stream_converter}


def _image_url(source: Any) -> str | None:
    return compat_vllm.anthropic_image_url(source) if isinstance(source, dict) else None


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
    """The prompt's length as vLLM counts it (its count_tokens), or None when it cannot be counted."""
    try:
        counted = await serving.count_tokens(count_type().model_validate(parsed.model_dump(exclude={"max_tokens"})))
    except Exception:  # noqa: BLE001 - the real call raises it again, mapped to its 4xx
        return None
    return getattr(counted, "input_tokens", None)


def dumped(result: Any) -> Any:
    """vLLM's own JSON for a Messages response (unset fields left out, as Anthropic sends it)."""
    return result.model_dump(exclude_none=True)


def parser(request: Request, headers: dict[str, str]):
    async def parse(body: Any) -> Generation:
        size = body_bytes(body)  # before validation, which may put objects in the body
        parsed = parse_request(messages_type(), body)
        state = engine_state(request)
        await check_parts(request, state, content_parts(parsed))
        headers.update(await output_budget.clamp(state.serving.anthropic_serving_messages, parsed, size, "max_tokens", prompt_tokens))
        return Generation(parsed, messages_call, **rendering(state.serving))

    return parse


@router.post(MESSAGES)
async def create_message(request: Request):
    headers: dict[str, str] = {}
    return await serve(request, parser(request, headers), shape=Shape.ANTHROPIC, headers=headers)


@router.post(COUNT_TOKENS)
async def count_tokens(request: Request):
    begin(request, Shape.ANTHROPIC)
    body, state = await read_checked(request)  # a `model` naming an adapter: leased, or a 404
    parsed = parse_request(count_type(), body)
    await check_request(request, parsed, state, generates=False)
    await check_parts(request, state, content_parts(parsed))
    result = await call_serving(state.serving.anthropic_serving_messages.count_tokens(parsed, request), request)
    return await send(request, result, dumped)
