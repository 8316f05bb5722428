"""The pipeline's last stages, format out and respond: vLLM's result through the output formatter
(LMI's contract, lmi_server/adapters/formatters.py; the input side is api/format_in.py) and the
front door's shape into the HTTP response.

`respond` turns vLLM's result into the HTTP response. The output formatter (if any) gets
vLLM's response object, or each raw stream chunk; what it returns is sent as is, unless it
returned the same kind of thing it got (an edited response object or `data:` chunk): then the
response is still shaped for the request's schema by the route's `shape_json` / `shape_stream`.

Which script applies: the adapter the request resolved to (api/adapters/routing.py: header
`X-Amzn-SageMaker-Adapter-Identifier`, else the body's `adapters`, else a `model` naming an
adapter), per direction, when its model.py has a formatter for that direction; else the model
directory's model.py. A formatter that fails is LMI's 424 (before the response starts; later, an
error event ends the stream and the generation is aborted). Errors take the request's shape (api/errors.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lmi_server.adapters.formatters import FormatterError, Formatters
from lmi_server.api.context import RequestContext, Shape, request_context
from lmi_server.api.errors import APIError, stream_error_event

log = logging.getLogger(__name__)

async def yielding(body: AsyncIterator[Any], ticket: Any = None) -> AsyncIterator[Any]:
    """A response stream passed through, suspending once per chunk. An `await` on something
    already done does not give the event loop a turn, so a stream whose source is always ready
    (a fast engine) could otherwise hold the loop: timers (queue-wait deadlines), other responses
    and new connections would wait for it. The admission ticket hears of the first chunk."""
    async for chunk in body:
        if ticket is not None:
            ticket.first_token()
        yield chunk
        await asyncio.sleep(0)


async def sse_to_jsonl(body: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """vLLM's SSE events as jsonlines (LMI's stream on /invocations): one JSON object per line,
    `[DONE]` dropped, an error event as LMI's flat `{"error": ..., "code": ...}`."""
    async for chunk in body:
        text = chunk.decode("utf-8") if isinstance(chunk, bytes) else str(chunk)
        out = []
        for line in text.splitlines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if not data or data == "[DONE]":
                continue
            try:
                parsed = json.loads(data)
            except ValueError:
                out.append(data)
                continue
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "choices" not in parsed:
                err = parsed["error"]
                data = json.dumps({"error": err.get("message", str(err)), "code": err.get("code", 424)})
            out.append(data)
        if out:
            yield ("\n".join(out) + "\n").encode("utf-8")


async def close_streams(ctx: RequestContext) -> None:
    """Close the response's generators, outermost first: vLLM's generator, closed, aborts the
    request in the engine (AsyncLLM.generate catches GeneratorExit and calls abort)."""
    streams, ctx.streams = ctx.streams, []
    for gen in reversed(streams):
        try:
            await gen.aclose()
        except Exception:  # noqa: BLE001 - closing is best effort; the engine side logs its own
            log.debug("closing a response stream failed", exc_info=True)


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


def _sent_as_is(value: Any, headers: dict[str, str] | None) -> Response:
    """What a formatter returned, as the response: JSON values and models as JSON, text as is."""
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


def _is_error_event(event: str) -> bool:
    try:
        parsed = json.loads(event)
    except ValueError:
        return False
    return isinstance(parsed, dict) and "error" in parsed and "choices" not in parsed


class _ChunkFormatting:
    """Each raw chunk of vLLM's stream through the output formatter, as LMI's handler feeds it:
    the string `'data: {...}\\n\\n'` (on /invocations `'data: [DONE]\\n\\n'` too; the OpenAI
    routes keep that end marker as it is). The first output decides the mode: a `data:` string
    means the formatter edits chunks (the stream is then shaped for its schema), anything else is
    sent as is, one line per chunk (LMI)."""

    def __init__(self, formatters: Formatters, kind: str):
        self.formatters = formatters
        self.kind = kind  # sse | jsonl
        self.mode: str | None = None  # "edit" | "as_is"

    def items(self, chunk: Any) -> list[tuple[str, Any]]:
        """("sse", event string) to pass on, or ("raw", bytes) sent as they are."""
        text = chunk.decode("utf-8") if isinstance(chunk, bytes) else str(chunk)
        out: list[tuple[str, Any]] = []
        for event in _events(text):
            raw_chunk = f"data: {event}\n\n"
            if (event == "[DONE]" and self.kind == "sse") or _is_error_event(event):
                out.append(("sse", raw_chunk))  # not the formatter's: the protocol's end, vLLM's error
                continue
            value = self.formatters.format_response(raw_chunk)
            if value is None:
                continue
            if isinstance(value, str) and value.startswith("data:"):
                self.mode = self.mode or "edit"
                out.append(("sse", value if value.endswith("\n\n") else value.rstrip("\n") + "\n\n"))
            else:
                self.mode = self.mode or "as_is"
                out.append(("raw", _encode(value) or b""))
        return out

    def as_bytes(self, kind: str, item: Any) -> bytes:
        if kind == "sse":
            item = item.encode("utf-8")
            if self.kind == "jsonl":  # LMI sends what the formatter gave, one line per chunk
                return item.rstrip(b"\n") + b"\n"
            return item
        if self.kind == "sse" and not item.startswith(b"data:"):
            return b"data: " + item.rstrip(b"\n") + b"\n\n"
        return item if item.endswith(b"\n") else item + b"\n"


async def _formatted_stream(ctx: RequestContext, source: AsyncIterator[Any], formatters: Formatters, kind: str):
    """(mode, stream): the formatter runs on chunks until its first output is known, so that a
    formatter failing at once makes the whole response a 424; later failures end the stream."""
    fmt = _ChunkFormatting(formatters, kind)
    chunks = source.__aiter__()
    pending: list[tuple[str, Any]] = []
    ended = False
    try:
        while fmt.mode is None:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                ended = True
                break
            pending.extend(fmt.items(chunk))
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        await close_streams(ctx)  # stop generating: abort the request in the engine
        raise APIError(424, f"Custom formatter failed: {exc}") from None
    mode = fmt.mode or "edit"

    async def rest():
        for item in pending:
            yield item
        if ended:
            return
        try:
            async for chunk in chunks:
                for item in fmt.items(chunk):
                    if mode == "edit" and item[0] == "raw":
                        raise FormatterError(f"output formatter of {formatters.owner} returned {item[1][:40]!r} where it "
                                             "returned edited 'data:' chunks before")
                    yield item
        except FormatterError as exc:
            log.warning("formatters: %s", exc)
            error = APIError(424, f"Custom formatter failed: {exc}")
            shape = ctx.shape if kind == "sse" else Shape.LMI  # a jsonlines stream is LMI's
            event = stream_error_event(error, shape, "sse" if mode == "edit" else "jsonl")
            yield ("sse", event.decode()) if mode == "edit" else ("raw", event)
            await close_streams(ctx)

    if mode == "edit":
        async def edited():
            async for kind_, item in rest():
                yield item
        return mode, edited()

    async def as_is():
        async for kind_, item in rest():
            yield fmt.as_bytes(kind_, item)
    return mode, as_is()


@dataclass(frozen=True)
class DoorFormatting:
    """How a front door whose answers are not vLLM's chat or completion objects shows its text to
    an output formatter in their shape and takes the result back (e.g. api/responses/formatting.py):
    `whole(formatters, result)` for a whole answer, `stream(formatters, events)` over the door's
    encoded stream. Doors without one hand the formatter vLLM's own object or chunks."""

    whole: Callable[[Formatters, Any], Any]
    stream: Callable[[Formatters, AsyncIterator[str]], AsyncIterator[str]]


async def _door_formatted(ctx: RequestContext, events: AsyncIterator[str]) -> AsyncIterator[Any]:
    """A door-formatted stream; a formatter failing ends it with an error event in the door's shape."""
    try:
        async for event in events:
            yield event
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        yield stream_error_event(APIError(424, f"Custom formatter failed: {exc}"), ctx.shape, "sse")
        await close_streams(ctx)


async def _encoded(body: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for chunk in body:
        yield chunk if isinstance(chunk, bytes) else str(chunk).encode("utf-8")


def _track(ctx: RequestContext, gen: Any) -> Any:
    ctx.streams.append(gen)
    return gen


async def respond(
    request: Request,
    result: Any,
    *,
    shape_json: Callable[[dict], Any],
    shape_stream: Callable[[AsyncIterator[str]], AsyncIterator[Any]],
    kind: str,
    headers: dict[str, str] | None,
    wrap: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] = lambda body: body,
    dump: Callable[[Any], Any] = lambda value: value.model_dump(exclude_none=False),
    formatting: DoorFormatting | None = None,
    format_out: bool = True,
) -> Response:
    """The one way out: vLLM's result -> output formatter (if any) -> the schema's shape ->
    response. `kind` is the stream's wire format ("sse" or "jsonl"); `wrap` sees the body last
    (the admission ticket's first-token hook); `dump` turns a response object into JSON values;
    `format_out=False`: no output formatter (an answer that holds no generated text)."""
    ctx = request_context(request)
    formatters = ctx.formatters if format_out else None
    media = "text/event-stream" if kind == "sse" else "application/jsonlines"
    if not (isinstance(result, AsyncIterator) or hasattr(result, "__aiter__")):
        value = result
        if formatters is not None:
            try:
                value = formatting.whole(formatters, result) if formatting else formatters.format_response(result)
            except FormatterError as exc:
                log.warning("formatters: %s", exc)
                raise APIError(424, f"Custom formatter failed: {exc}") from None
            if not isinstance(value, type(result)):
                return _sent_as_is(value, headers)
        return JSONResponse(shape_json(dump(value)), headers=headers)
    _track(ctx, result)
    if formatters is None:
        body = _encoded(_track(ctx, shape_stream(result)))
    elif formatting is not None:
        body = _encoded(_track(ctx, _door_formatted(ctx, formatting.stream(formatters, shape_stream(result)))))
    else:
        mode, formatted = await _formatted_stream(ctx, result, formatters, kind)
        body = _encoded(_track(ctx, shape_stream(formatted))) if mode == "edit" else formatted
    return StreamingResponse(wrap(body), media_type=media, headers=headers)
