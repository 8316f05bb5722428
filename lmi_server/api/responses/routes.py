"""POST /v1/responses, GET /v1/responses/{response_id}, POST /v1/responses/{response_id}/cancel.

The work is vLLM's `OpenAIServingResponses` (built by vLLM's `init_app_state` in `engine.py`, its
store bounded by `option.responses_store_size`). POST goes through the pipeline (`api/pipeline.serve`);
here only what is the Responses API's: the body as vLLM's `ResponsesRequest`, its content parts
checked, `max_output_tokens` clamped to what fits the context (`x-lmi-max-tokens-clamped`), vLLM's
own JSON and SSE event encoding, OpenAI's error shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api import output_budget
from lmi_server.api.adapters.routing import adapters_field
from lmi_server.api.context import Shape, begin
from lmi_server.api.front_door import body_bytes, check_parts, send
from lmi_server.api.openai.routes import parse_request
from lmi_server.api.pipeline import Generation, call_serving, engine_state, serve
from lmi_server.api.respond import DoorFormatting
from lmi_server.api.responses.formatting import format_stream, format_whole
from lmi_server.compat import vllm as compat_vllm

FORMATTING = DoorFormatting(whole=format_whole, stream=format_stream)
"""An adapter's output formatter sees the text as a chat answer (api/responses/formatting.py)."""
CREATE = "/v1/responses"
PATHS = (CREATE,)
router = APIRouter()


def request_type():
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return ResponsesRequest


def responses_call(serving: Any):
    return serving.openai_serving_responses.create_responses


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
        previous = compat_vllm.stored_response(serving, parsed.previous_response_id)
        if previous is None:
            return None
    probe = parsed.model_copy(update={"max_output_tokens": None})
    try:
        return await compat_vllm.responses_prompt_len(serving, probe, previous)
    except Exception:  # noqa: BLE001 - the real call raises it again, mapped to its 4xx
        return None


async def sse_events(events):
    """vLLM's Responses stream events, encoded as its own server sends them."""
    async for text in compat_vllm.responses_sse(events):
        yield text


def dumped(result: Any) -> Any:
    """vLLM's own JSON for its response objects (field aliases, JSON types)."""
    return result.model_dump(mode="json", by_alias=True)


NULL_MEANS_DEFAULT = ("background", "truncation")
"""Fields vLLM's ResponsesRequest accepts as null but copies into its ResponsesResponse, where null
is invalid: a body sending `"background": null` made vLLM fail building the answer (a 500, found by
the fuzzer). Null there means what leaving the field out means."""


def defaults_for_nulls(parsed: Any) -> Any:
    for name in NULL_MEANS_DEFAULT:
        if getattr(parsed, name, 0) is None:
            setattr(parsed, name, type(parsed).model_fields[name].default)
    return parsed


def parser(request: Request, headers: dict[str, str]):
    async def parse(body: Any) -> Generation:
        size = body_bytes(body)  # before validation, which may put objects in the body
        parsed = defaults_for_nulls(parse_request(request_type(), adapters_field(body)))
        state = engine_state(request)
        await check_parts(request, state, content_parts(parsed))
        headers.update(await output_budget.clamp(state.serving.openai_serving_responses, parsed, size, "max_output_tokens", prompt_tokens))
        return Generation(parsed, responses_call, shape_stream=sse_events, dump=dumped, formatting=FORMATTING)

    return parse


@router.post(CREATE)
async def create_response(request: Request):
    headers: dict[str, str] = {}
    return await serve(request, parser(request, headers), shape=Shape.OPENAI, headers=headers)


@router.get(CREATE + "/{response_id}")
async def retrieve_response(request: Request, response_id: str, starting_after: int | None = None, stream: bool = False):
    begin(request, Shape.OPENAI)
    serving = engine_state(request).serving.openai_serving_responses
    result = await call_serving(serving.retrieve_responses(response_id, starting_after=starting_after, stream=stream), request)
    return await send(request, result, dumped, sse_events)


@router.post(CREATE + "/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str):
    begin(request, Shape.OPENAI)
    serving = engine_state(request).serving.openai_serving_responses
    return await send(request, await call_serving(serving.cancel_responses(response_id), request), dumped)
