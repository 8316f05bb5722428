"""What the Responses and Anthropic Messages front doors add to the pipeline's body checks
(`api/pipeline.check_request` reads chat `messages` only): their content parts checked against the
model (a non-text part for a text-only model is a 400) and images against the media policy; and
the answer sent outside `serve` for their routes that do not generate (count, retrieve, cancel)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Request

from lmi_server.api.context import app_context
from lmi_server.api.errors import APIError
from lmi_server.api.respond import respond
from lmi_server.api.media import check_messages

TEXT_KINDS = {"text", "input_text", "output_text", "refusal", "thinking", "redacted_thinking"}


def body_bytes(body: Any) -> int:
    """An upper bound of the prompt's bytes, whatever the transfer encoding was."""
    return len(json.dumps(body, default=str))


def is_multimodal(state: Any) -> bool:
    return bool(getattr(getattr(state.engine, "model_config", None), "is_multimodal_model", False))


async def check_parts(request: Request, state: Any, parts: Iterable[tuple[str, str, str | None]]) -> None:
    """`parts`: (where, kind, image URL or None) for each content part of the request. A non-text
    part for a text-only model is a 400; images for a multimodal model pass the media policy."""
    parts = list(parts)
    if not is_multimodal(state):
        for where, kind, _ in parts:
            if kind not in TEXT_KINDS:
                raise APIError(400, f"{where}: content of type {kind!r} needs a multimodal model; this model reads text")
        return
    images = [{"type": "image_url", "image_url": {"url": url}} for _, kind, url in parts if url is not None]
    if images:
        await asyncio.to_thread(check_messages, [{"role": "user", "content": images}], app_context(request).media_policy)


async def send(request: Request, result: Any, dump: Callable[[Any], Any], shape_stream: Any = None):
    """A non-generating route's answer (tokens, a count, a stored response): no output formatter,
    which is written for generated text (an adapter's formatter on /tokenize was a 424)."""
    return await respond(
        request, result, shape_json=lambda body: body, shape_stream=shape_stream or (lambda events: events),
        kind="sse", headers=None, dump=dump, format_out=False,
    )


def request_bodies(components: dict[str, Any]) -> dict[str, Any]:
    """The bodies the Responses, Messages and tokenizer routes read themselves (for /openapi.json)."""
    from pydantic import TypeAdapter
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest

    from lmi_server.api.openapi import REF, _schema_of

    tokenize = TypeAdapter(TokenizeRequest).json_schema(ref_template=REF)
    components.update(tokenize.pop("$defs", {}))
    return {
        "/v1/responses": _schema_of(ResponsesRequest, components),
        "/v1/messages": _schema_of(AnthropicMessagesRequest, components),
        "/v1/messages/count_tokens": _schema_of(AnthropicCountTokensRequest, components),
        "/tokenize": tokenize,
        "/detokenize": _schema_of(DetokenizeRequest, components),
    }
