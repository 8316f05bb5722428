"""LMI's formatter contract on the request path: the payload formatter where the body is read,
the response formatter where the response is made (see lmi_server/adapters/formatters.py).

Which script applies: the adapter named by the request (header `X-Amzn-SageMaker-Adapter-Identifier`,
else the body's `adapters`, else an OpenAI `model` naming an adapter), per direction, when its
model.py has a formatter for that direction; else the model directory's model.py. A formatter
that fails is LMI's 424. The text contract of adapters (`adapter_routing.py`) runs after the body
is parsed and is untouched by this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from lmi_server.adapters.formatters import FormatterError, Formatters
from lmi_server.api.adapter_routing import ADAPTER_HEADER, hold_until_formatted
from lmi_server.api.errors import APIError

log = logging.getLogger(__name__)

STATE_KEY = "lmi_response_formatter"
NO_FORMATTERS = Formatters(owner="the model")


def _adapter_named(request: Request, body: Any) -> str | None:
    name = request.headers.get(ADAPTER_HEADER)
    if name:
        return name
    if not isinstance(body, dict):
        return None
    adapters = body.get("adapters")
    if isinstance(adapters, str) and adapters:
        return adapters
    if isinstance(adapters, list) and len(set(map(str, adapters))) == 1:
        return str(adapters[0])
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def _adapter_formatters(request: Request, name: str | None) -> Formatters | None:
    if name is None:
        return None
    manager = getattr(request.app.state, "adapters", None)
    try:
        registry = manager.registry() if manager is not None else None
        return registry.get(name).formatters if registry is not None else None
    except Exception:  # noqa: BLE001 - not an adapter (a base model name) or not ready: the resolver says so later
        return None


def _tokenizer(request: Request) -> Any:
    engine = getattr(request.app.state.engine_owner.state, "engine", None)
    try:
        return engine.get_tokenizer() if engine is not None else None
    except Exception:  # noqa: BLE001 - a formatter that needs it will say so itself
        return None


def apply_payload_formatter(request: Request, body: Any, *, lmi: bool) -> Any:
    """The body as the payload formatter returns it; records which response formatter applies."""
    model_level: Formatters = getattr(request.app.state, "model_formatters", None) or NO_FORMATTERS
    adapter = _adapter_formatters(request, _adapter_named(request, body))
    source_in = adapter if adapter is not None and adapter.has_input else model_level
    source_out = adapter if adapter is not None and adapter.has_output else model_level
    if source_out.response_output is not None:
        request.scope.setdefault("state", {})[STATE_KEY] = (source_out, lmi)
    if source_in.payload_input is None:
        return body
    try:
        return source_in.format_payload(body, tokenizer=_tokenizer(request))
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        raise APIError(424, f"Custom formatter failed: {exc}", lmi=lmi) from None


def response_formatter(request: Request) -> tuple[Formatters, bool] | None:
    return request.scope.get("state", {}).get(STATE_KEY)


def _encode(value: Any) -> bytes | None:
    """What a formatter returned, as bytes to send: models and JSON values as JSON, text as is."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json().encode("utf-8")
    return json.dumps(value, default=str).encode("utf-8")


def formatted_response(request: Request, result: Any, headers: dict[str, str] | None) -> Response:
    """A non-streaming response: the formatter's return value on vLLM's response object."""
    formatters, lmi = response_formatter(request)  # type: ignore[misc]
    try:
        value = formatters.format_response(result)
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        raise APIError(424, f"Custom formatter failed: {exc}", lmi=lmi) from None
    if isinstance(value, (dict, list)) or hasattr(value, "model_dump_json"):
        return Response(_encode(value), media_type="application/json", headers=headers)
    if value is None:
        return JSONResponse(None, headers=headers)
    content = _encode(value) or b""
    try:
        json.loads(content)
        media = "application/json"
    except ValueError:
        media = "text/plain; charset=utf-8"
    return Response(content, media_type=media, headers=headers)


def _events(text: str) -> list[str]:
    return [line[len("data:"):].strip() for line in text.splitlines() if line.startswith("data:")]


class _ChunkFormatter:
    """Feeds each streamed event to the formatter as LMI's handler does: the raw chunk string
    vLLM yields (`'data: {...}\\n\\n'`; on /invocations `'data: [DONE]\\n\\n'` too, while the
    OpenAI routes keep that end marker as it is); what it returns is one line of the response (the interface of `hold_until_formatted`: `feed(data, last)` and `called`)."""

    def __init__(self, formatters: Formatters, kind: str):
        self.formatters = formatters
        self.kind = kind  # sse | jsonl
        self.called = False

    def _line(self, raw: bytes) -> bytes:
        if self.kind == "sse" and not raw.startswith(b"data:"):
            return b"data: " + raw.rstrip(b"\n") + b"\n\n"
        return raw if raw.endswith(b"\n") else raw + b"\n"

    def feed(self, data: bytes, last: bool) -> bytes:
        out: list[bytes] = []
        for event in _events(data.decode("utf-8")):
            chunk = f"data: {event}\n\n"
            if event == "[DONE]" and self.kind == "sse":
                out.append(b"data: [DONE]\n\n")  # the OpenAI routes keep the protocol's end marker
                continue
            if event != "[DONE]":
                try:
                    parsed = json.loads(event)
                except json.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict) and "error" in parsed and "choices" not in parsed:
                    out.append(self._line(json.dumps(parsed).encode()))  # vLLM's own mid-stream error, as it is
                    continue
            self.called = True
            raw = _encode(self.formatters.format_response(chunk))
            if raw:
                out.append(self._line(raw))
        return b"".join(out)


async def formatted_stream(request: Request, body: AsyncIterator[Any], kind: str) -> AsyncIterator[bytes]:
    """A streaming body with the formatter applied to each chunk object: a formatter that fails on
    the first chunk makes the response a 424; later, the stream ends with an error event."""
    formatters, lmi = response_formatter(request)  # type: ignore[misc]
    return await hold_until_formatted(
        request, body, _ChunkFormatter(formatters, kind), kind, lmi=lmi, prefix="Custom formatter failed: "
    )
