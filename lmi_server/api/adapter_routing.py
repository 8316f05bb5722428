"""Choosing the adapter per request, running its formatters, releasing its lease.

Precedence: header `X-Amzn-SageMaker-Adapter-Identifier`, then the LMI body field `"adapters"`,
then the OpenAI `"model"` field naming an adapter; the base model when none is named.

The resolvers are installed on `app.state.model_resolver` / `app.state.lmi_model_resolver`
(the hooks the routers call before handing a request to vLLM). A resolver takes a lease on the
adapter (loading it on first use) and runs the input formatter. The output formatter is applied
where the response is made (`format_json`, `format_stream`, called by the routes on vLLM's result),
and `AdapterLeaseMiddleware` releases the lease when the response has been sent completely,
streaming included.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lmi_server.adapters.formatters import FormatterContext, FormatterError, Formatters
from lmi_server.adapters.registry import Lease
from lmi_server.adapters.transforms import LineFormatter, format_json_body, isolated_cache_salt
from lmi_server.api.errors import APIError, from_adapter_error, stream_error_event
from lmi_server.api.standards import SageMakerLoRAApiHeader

log = logging.getLogger(__name__)

ADAPTER_HEADER = SageMakerLoRAApiHeader.ADAPTER_IDENTIFIER.lower()  # x-amzn-sagemaker-adapter-identifier
STATE_KEY = "lmi_adapter_use"
STREAMS_KEY = "lmi_streams"  # the response's async generators, innermost (vLLM's) first
# Streaming: bytes held back until the output formatter has run once (so that a formatter failing
# on the first text can still turn the response into a 424). Past this, the response starts.
MAX_PENDING_BYTES = 64 * 1024


async def close_streams(state: dict) -> None:
    """Close the response's generators, outermost first: vLLM's generator, closed, aborts the
    request in the engine (AsyncLLM.generate catches GeneratorExit and calls abort)."""
    for gen in reversed(state.pop(STREAMS_KEY, [])):
        try:
            await gen.aclose()
        except Exception:  # noqa: BLE001 - closing is best effort; the engine side logs its own
            log.debug("closing a response stream failed", exc_info=True)


@dataclass
class AdapterUse:
    """What one request does with one adapter (kept in the ASGI scope's state)."""

    name: str
    schema: str  # lmi | chat | completion
    lmi: bool
    lease: Lease | None
    formatters: Formatters
    request: Any
    stream: bool = False

    def format_output(self, text: str, final: bool) -> str:
        ctx = FormatterContext(adapter=self.name, schema=self.schema, stream=self.stream, final=final, request=self.request)
        return self.formatters.format_output(text, ctx)


def _registry(request: Request):
    return request.app.state.adapters.registry()


async def use_adapter(request: Request, name: str, schema: str, parsed: Any, *, lmi: bool) -> AdapterUse:
    registry = _registry(request)
    if registry is None:
        raise APIError(404, f"adapter {name!r} not found: LoRA adapters are disabled (option.enable_lora=false)", lmi=lmi)
    param = None if lmi else "model"
    try:
        entry = registry.get(name)
    except Exception as exc:
        raise (from_adapter_error(exc, lmi=lmi, param=param) or exc) from None
    use = AdapterUse(
        name=name, schema=schema, lmi=lmi, lease=None, formatters=entry.formatters,
        request=parsed, stream=bool(getattr(parsed, "stream", False)),
    )
    try:
        use.lease = await registry.acquire(name)
    except Exception as exc:
        raise (from_adapter_error(exc, lmi=lmi, param=param) or exc) from None
    # From here the middleware releases the lease, whatever happens next.
    request.state.__setattr__(STATE_KEY, use)
    if entry.formatters.input is not None:
        ctx = FormatterContext(adapter=name, schema=schema, stream=use.stream, final=True, request=parsed)
        try:
            result = entry.formatters.format_input(parsed, ctx)
        except FormatterError as exc:
            raise APIError(424, str(exc), lmi=lmi) from None
        if result is not parsed:
            if type(result) is not type(parsed):
                raise APIError(
                    424,
                    f"input_formatter of adapter {name!r} returned {type(result).__name__}; "
                    f"return None or a {type(parsed).__name__}",
                    lmi=lmi,
                )
            parsed.__dict__.update(result.__dict__)
    return use


async def openai_model_resolver(request: Request, parsed: Any) -> None:
    """OpenAI chat/completion: header, else `model` when it names no base model."""
    schema = "chat" if hasattr(parsed, "messages") else "completion"
    name = request.headers.get(ADAPTER_HEADER) or None
    model = getattr(parsed, "model", None)
    registry = _registry(request)
    if name is None and model and registry is not None and not registry.backend.is_base_model(model):
        name = model
    if name is None:
        return None
    await use_adapter(request, name, schema, parsed, lmi=False)
    parsed.model = name  # vLLM picks the LoRARequest by this name
    return None


async def lmi_model_resolver(request: Request, req: Any) -> str | None:
    """LMI schema: header, else body `adapters` (one name, or a list naming one adapter)."""
    name = request.headers.get(ADAPTER_HEADER) or None
    if name is None and req.adapters:
        names = [req.adapters] if isinstance(req.adapters, str) else list(req.adapters)
        distinct = sorted(set(names))
        if len(distinct) > 1:
            raise APIError(424, f"one adapter per request; got {distinct} (send one request per adapter)", lmi=True)
        name = distinct[0] if distinct else None
    model = getattr(req, "model", None)
    registry = _registry(request)
    if name is None and model and model != "lmi" and registry is not None and not registry.backend.is_base_model(model):
        name = model
    if not name:
        return None
    await use_adapter(request, name, "lmi", req, lmi=True)
    return name


def apply_cache_salt(request: Request, engine_request: Any) -> None:
    """Set the salt on the vLLM request (chat or completion) about to be sent to the engine:
    KV reuse isolated per adapter and weights (see `isolated_cache_salt`)."""
    use: AdapterUse | None = getattr(request.state, STATE_KEY, None)
    identity = None
    if use is not None and use.lease is not None:
        identity = use.lease.entry.cache_identity()
    engine_request.cache_salt = isolated_cache_salt(identity, getattr(engine_request, "cache_salt", None))


# ---------------------------------------------------------------------- output formatting


def _formatting_use(request: Request) -> AdapterUse | None:
    use = request.scope.get("state", {}).get(STATE_KEY)
    return use if use is not None and use.formatters.output is not None else None


def format_json(request: Request, obj: Any) -> Any:
    """A non-streaming response body with the adapter's output formatter applied (final=True);
    a formatter that fails makes the response a 424."""
    use = _formatting_use(request)
    if use is None:
        return obj
    try:
        return format_json_body(obj, use.schema, use.format_output)
    except FormatterError as exc:
        log.warning("adapters: %s", exc)
        raise APIError(424, str(exc), lmi=use.lmi) from None


def _encode(chunk: Any) -> bytes:
    return chunk if isinstance(chunk, bytes) else str(chunk).encode("utf-8")


async def format_stream(request: Request, body: AsyncIterator[Any], kind: str) -> AsyncIterator[Any]:
    """A streaming body (kind "sse" or "jsonl") with the adapter's output formatter applied."""
    use = _formatting_use(request)
    if use is None:
        return body
    return await hold_until_formatted(request, body, LineFormatter(kind, use.schema, use.format_output), kind, lmi=use.lmi)


async def hold_until_formatted(
    request: Request, body: AsyncIterator[Any], lines: Any, kind: str, *, lmi: bool, prefix: str = ""
) -> AsyncIterator[bytes]:
    """`body` through `lines` (an object with `feed(data, last) -> bytes` and `called`, e.g. a
    `LineFormatter`). Chunks are held back until the formatter has run once (at most
    MAX_PENDING_BYTES), so that a formatter failing on the first output still makes the whole
    response a 424 (raised here, its message after `prefix`). A formatter failing later ends the
    stream with an error event in its own format and closes the response's generators, which
    aborts the request in the engine."""
    state = request.scope.setdefault("state", {})
    chunks = body.__aiter__()
    pending: list[bytes] = []
    size = 0
    ended = False
    try:
        while not lines.called and size <= MAX_PENDING_BYTES:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                ended = True
                pending.append(lines.feed(b"", last=True))
                break
            out = lines.feed(_encode(chunk), last=False)
            pending.append(out)
            size += len(out)
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        await close_streams(state)  # stop generating: abort the request in the engine
        raise APIError(424, prefix + str(exc), lmi=lmi) from None
    return _formatted_rest(state, lines, chunks, pending, ended, kind, prefix)


async def _formatted_rest(state, lines: Any, chunks, pending: list[bytes], ended: bool, kind: str, prefix: str):
    for out in pending:
        if out:
            yield out
    if ended:
        return
    try:
        async for chunk in chunks:
            out = lines.feed(_encode(chunk), last=False)
            if out:
                yield out
        out = lines.feed(b"", last=True)
    except FormatterError as exc:
        # Mid-stream: end the stream with an error event in its own format.
        log.warning("formatters: %s", exc)
        yield stream_error_event(APIError(424, prefix + str(exc), lmi=kind == "jsonl"), kind)
        await close_streams(state)  # stop generating: abort the request in the engine
        return
    if out:
        yield out


class AdapterLeaseMiddleware:
    """Releases the request's adapter lease once the response has been sent (or has failed)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        try:
            await self.app(scope, receive, send)
        finally:
            use = state.get(STATE_KEY)
            if use is not None and use.lease is not None:
                await use.lease.release()
