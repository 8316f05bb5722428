"""POST /v1/responses, GET /v1/responses/{response_id}, POST /v1/responses/{response_id}/cancel.

The work is vLLM's `OpenAIServingResponses` (built by vLLM's `init_app_state` in `engine.py`, its
store bounded by `option.responses_store_size`); this module parses the body, runs it through the
steps every generating route takes (`api/front_door.py`: formatters, model/adapter, media, admission),
clamps `max_output_tokens` to what fits the context, and sends vLLM's result as JSON or SSE events
(vLLM's own event encoding). Errors are OpenAI's envelope, as on /v1/chat/completions.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api import output_budget
from lmi_server.api.adapter_routing import STREAMS_KEY
from lmi_server.api.front_door import check_parts, read_request, resolve_model, take_slot
from lmi_server.api.generation import as_response, call_serving, engine_state

CREATE = "/v1/responses"
PATHS = (CREATE,)
router = APIRouter()


def request_type():
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return ResponsesRequest


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def content_parts(parsed: Any):
    """(where, kind, image URL) for each content part of the request's input items."""
    if isinstance(parsed.input, str):
        return
    for i, item in enumerate(parsed.input):
        content = _field(item, "content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = _field(part, "type")
            if kind is not None:
                url = _field(part, "image_url") if kind == "input_image" else None
                yield f"input[{i}].content[{j}]", kind, url if isinstance(url, str) else None


async def prompt_tokens(serving: Any, parsed: Any) -> int | None:
    """The prompt's length as vLLM renders it (previous response included), or None when it
    cannot be rendered: vLLM's own call then reports why."""
    previous = None
    if parsed.previous_response_id is not None:
        previous = serving.response_store.get(parsed.previous_response_id)
        if previous is None:
            return None
    probe = parsed.model_copy(update={"max_output_tokens": None})
    try:
        rendered = await serving._render_resolved_response_inputs(probe, previous)
    except Exception:  # noqa: BLE001 - the real call raises it again, mapped to its 4xx
        return None
    if type(rendered).__name__ == "ErrorResponse":
        return None
    return serving._extract_prompt_len(rendered.engine_input)


async def clamp(request: Request, serving: Any, parsed: Any, body_bytes: int) -> dict[str, str] | None:
    """`max_output_tokens` beyond the context's room lowered to it; the header that says so."""
    limit = serving.model_config.max_model_len
    requested = parsed.max_output_tokens
    if not output_budget.could_overflow(requested, body_bytes, limit):
        return None
    used = output_budget.fitted(requested, await prompt_tokens(serving, parsed) or limit, limit)
    if used is None:
        return None
    parsed.max_output_tokens = used
    return output_budget.clamp_header(requested, used)


async def sse_events(events):
    """vLLM's Responses stream events, encoded as its own server sends them."""
    from vllm.entrypoints.openai.responses.api_router import _convert_stream_to_sse_events

    async for text in _convert_stream_to_sse_events(events):
        yield text


def dumped(result: Any) -> Any:
    """vLLM's own JSON for its response objects (field aliases, JSON types)."""
    return result.model_dump(mode="json", by_alias=True) if hasattr(result, "model_dump") else result


async def send(result: Any, request: Request, headers: dict[str, str] | None = None):
    if hasattr(result, "__aiter__"):
        # vLLM's generator itself is closed (the request aborted) when the client goes away
        request.scope.setdefault("state", {}).setdefault(STREAMS_KEY, []).append(result)
        result = sse_events(result)
    return await as_response(result, request, headers, dump=dumped)


@router.post(CREATE)
async def create_response(request: Request):
    parsed, size = await read_request(request, request_type())
    state = engine_state(request)
    serving = state.serving.openai_serving_responses
    await check_parts(request, state, content_parts(parsed))
    await resolve_model(request, state, parsed)
    headers = await clamp(request, serving, parsed, size)
    await take_slot(request, state, parsed)
    result = await call_serving(serving.create_responses(parsed, request), request)
    return await send(result, request, headers)


@router.get(CREATE + "/{response_id}")
async def retrieve_response(request: Request, response_id: str, starting_after: int | None = None, stream: bool = False):
    serving = engine_state(request).serving.openai_serving_responses
    result = await call_serving(
        serving.retrieve_responses(response_id, starting_after=starting_after, stream=stream), request
    )
    return await send(result, request)


@router.post(CREATE + "/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str):
    serving = engine_state(request).serving.openai_serving_responses
    return await send(await call_serving(serving.cancel_responses(response_id), request), request)
