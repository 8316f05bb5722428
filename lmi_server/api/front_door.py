"""Steps that the Responses and Anthropic Messages front doors share with /v1/chat/completions:
read and validate the body, resolve the model (an adapter by name, LMI's "lmi" alias), check
content parts against the model and the media policy, take an admission slot. Each front door
only says how its body carries content parts and how its result is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from fastapi import Request

from lmi_server.api.adapter_routing import adapters_field
from lmi_server.api.body import read_json_body
from lmi_server.api.errors import APIError, validated
from lmi_server.api.generation import admit, engine_state
from lmi_server.api.lmi_formatters import apply_payload_formatter
from lmi_server.api.media import check_messages
from lmi_server.api.openai import lmi_model_alias

TEXT_KINDS = {"text", "input_text", "output_text", "refusal", "thinking", "redacted_thinking"}


async def read_request(request: Request, request_type: Any) -> tuple[Any, int]:
    """Body -> vLLM's request type (400 not an object, 422 invalid), after the size limit, the
    engine's readiness (503) and the input formatter; also the body's size in bytes."""
    body = await read_json_body(request, request.app.state.config.server.max_request_bytes)
    engine_state(request)
    body = apply_payload_formatter(request, body, lmi=False)
    body = adapters_field(request, body, lmi=False)
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    size = len(json.dumps(body))  # an upper bound of the prompt's bytes, whatever the transfer encoding
    return validated(request_type.model_validate, body), size


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
        await asyncio.to_thread(check_messages, [{"role": "user", "content": images}], request.app.state.media_policy)


async def resolve_model(request: Request, state: Any, parsed: Any) -> None:
    """As on /v1/chat/completions: "lmi" names the base model, a `model` naming an adapter is served
    by it (404 naming what exists otherwise), and the adapter's cache salt is set."""
    lmi_model_alias(parsed, state)
    await request.app.state.model_resolver(request, parsed)
    if "cache_salt" in type(parsed).model_fields:  # count/tokenize requests reach no KV cache
        request.app.state.cache_salter(request, parsed)


async def take_slot(request: Request, state: Any, parsed: Any) -> None:
    """An admission slot for the request's tenant (429/503 in the caller's error format)."""
    await admit(request, state, parsed=parsed)
