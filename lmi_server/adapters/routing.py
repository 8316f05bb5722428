"""Choosing the adapter per request, running its formatters, releasing its lease.

Precedence: header `X-Amzn-SageMaker-Adapter-Identifier`, then the LMI body field `"adapters"`,
then the OpenAI `"model"` field naming an adapter; the base model when none is named.

The resolvers are installed on `app.state.model_resolver` / `app.state.lmi_model_resolver`
(the hooks the routers call before handing a request to vLLM). A resolver takes a lease on the
adapter (loading it on first use) and runs the input formatter; `AdapterMiddleware` runs the
output formatter on the response bytes on the way back (JSON, SSE, jsonlines) and releases the
lease when the response has been sent completely, streaming included.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import Request

from lmi_server.adapters.formatters import FormatterContext, FormatterError, Formatters
from lmi_server.adapters.registry import AdapterNotFound, AdapterUnavailable, Lease
from lmi_server.adapters.validation import AdapterInvalid
from lmi_server.api.errors import APIError

log = logging.getLogger(__name__)

ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"
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


def _registry(request: Request):
    from lmi_server.adapters.wiring import ensure_registry

    return ensure_registry(request.app)


def _as_api_error(exc: Exception, lmi: bool) -> APIError:
    if isinstance(exc, AdapterNotFound):
        return APIError(404, str(exc), param="model" if not lmi else None, lmi=lmi)
    if isinstance(exc, (AdapterUnavailable, FormatterError)):
        return APIError(424, str(exc), lmi=lmi)
    if isinstance(exc, AdapterInvalid):
        return APIError(400, str(exc), lmi=lmi)
    raise exc


async def use_adapter(request: Request, name: str, schema: str, parsed: Any, *, lmi: bool) -> AdapterUse:
    registry = _registry(request)
    if registry is None:
        raise APIError(404, f"adapter {name!r} not found: LoRA adapters are disabled (option.enable_lora=false)", lmi=lmi)
    try:
        entry = registry.get(name)
    except (AdapterNotFound, AdapterUnavailable) as exc:
        raise _as_api_error(exc, lmi) from None
    use = AdapterUse(
        name=name, schema=schema, lmi=lmi, lease=None, formatters=entry.formatters,
        request=parsed, stream=bool(getattr(parsed, "stream", False)),
    )
    try:
        use.lease = await registry.acquire(name)
    except (AdapterNotFound, AdapterUnavailable) as exc:
        raise _as_api_error(exc, lmi) from None
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
    if not name:
        return None
    await use_adapter(request, name, "lmi", req, lmi=True)
    return name


# ---------------------------------------------------------------------- KV isolation between adapters


def isolated_cache_salt(identity: str | None, client_salt: str | None) -> str | None:
    """The `cache_salt` vLLM and LMCache key reused KV by (LMCache keys chunks by token ids and
    salt only). KV computed under an adapter carries its identity (name + weight fingerprint),
    so only requests through the same adapter with the same weights reuse it; base requests
    without a salt stay unsalted. A client's own salt is folded in (never passed through as is,
    so no client can pick another namespace's salt)."""
    if identity is None and not client_salt:
        return None
    digest = hashlib.sha256()
    digest.update((identity or "base").encode())
    digest.update(b"\0")
    digest.update((client_salt or "").encode())
    return digest.hexdigest()


def apply_cache_salt(request: Request, engine_request: Any) -> None:
    """Set the salt on the vLLM request (chat or completion) about to be sent to the engine."""
    use: AdapterUse | None = getattr(request.state, STATE_KEY, None)
    identity = None
    if use is not None and use.lease is not None:
        identity = use.lease.entry.cache_identity()
    engine_request.cache_salt = isolated_cache_salt(identity, getattr(engine_request, "cache_salt", None))


# ---------------------------------------------------------------------- output transforms (pure)


def format_json_body(obj: Any, schema: str, fmt: Callable[[str, bool], str]) -> Any:
    """Apply fmt(text, final=True) to the generated text of a non-streaming response."""
    if schema == "lmi":
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("generated_text"), str):
                item["generated_text"] = fmt(item["generated_text"], True)
        return obj
    for choice in obj.get("choices", []) if isinstance(obj, dict) else []:
        if schema == "chat":
            msg = choice.get("message") or {}
            if isinstance(msg.get("content"), str):
                msg["content"] = fmt(msg["content"], True)
        elif isinstance(choice.get("text"), str):
            choice["text"] = fmt(choice["text"], True)
    return obj


def format_sse_line(line: str, schema: str, fmt: Callable[[str, bool], str]) -> str:
    if not line.startswith("data: "):
        return line
    data = line[len("data: "):].strip()
    if not data or data == "[DONE]":
        return line
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return line
    changed = False
    for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
        if schema == "chat":
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                delta["content"] = fmt(delta["content"], False)
                changed = True
        elif isinstance(choice.get("text"), str) and choice["text"]:
            choice["text"] = fmt(choice["text"], False)
            changed = True
    return "data: " + json.dumps(chunk) if changed else line


def format_jsonl_line(line: str, fmt: Callable[[str, bool], str]) -> str:
    if not line.strip():
        return line
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(obj, dict):
        return line
    token = obj.get("token")
    if isinstance(token, dict) and isinstance(token.get("text"), str) and token["text"]:
        token["text"] = fmt(token["text"], False)
    if isinstance(obj.get("generated_text"), str):
        obj["generated_text"] = fmt(obj["generated_text"], True)
    return json.dumps(obj)


class LineFormatter:
    """Streaming: split body chunks into lines, format complete lines, keep the partial tail."""

    def __init__(self, kind: str, schema: str, fmt: Callable[[str, bool], str]):
        self.kind = kind
        self.schema = schema
        self.called = False  # whether the formatter has run yet (the response start waits for it)
        self._tail = ""

        def counted(text: str, final: bool) -> str:
            self.called = True
            return fmt(text, final)

        self.fmt = counted

    def feed(self, data: bytes, last: bool) -> bytes:
        text = self._tail + data.decode("utf-8", errors="surrogateescape")
        lines = text.split("\n")
        self._tail = "" if last else lines.pop()
        out = []
        for line in lines:
            if self.kind == "sse":
                out.append(format_sse_line(line, self.schema, self.fmt))
            else:
                out.append(format_jsonl_line(line, self.fmt))
        result = "\n".join(out)
        if not last and lines:
            result += "\n"
        elif last and self._tail:
            result += self._tail
        return result.encode("utf-8", errors="surrogateescape")


# ---------------------------------------------------------------------- middleware


def _error_bytes(use: AdapterUse, message: str, kind: str | None) -> bytes:
    if kind == "sse":
        return ("data: " + json.dumps({"error": {"message": message, "type": "FailedDependencyError", "code": 424}}) + "\n\n").encode()
    if kind == "jsonl":
        return (json.dumps({"error": message, "code": 424}) + "\n").encode()
    return json.dumps(APIError(424, message, lmi=use.lmi).body()).encode()


class AdapterMiddleware:
    """Runs the output formatter of the request's adapter and releases its lease at the end."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        ctl = {"mode": None, "start": None, "kind": None, "buf": [], "lines": None, "failed": False, "started": False, "pending": b""}

        def use_now() -> AdapterUse | None:
            return state.get(STATE_KEY)

        def fmt_for(use: AdapterUse):
            def fmt(text: str, final: bool) -> str:
                ctx = FormatterContext(adapter=use.name, schema=use.schema, stream=use.stream, final=final, request=use.request)
                return use.formatters.format_output(text, ctx)
            return fmt

        async def send_error(use: AdapterUse, message: str) -> None:
            log.warning("adapters: %s", message)
            body = _error_bytes(use, message, None)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 424, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        async def send_wrapper(message):
            if ctl["failed"]:
                return  # the response was already replaced by an error
            if message["type"] == "http.response.start":
                use = use_now()
                if use is None or use.formatters.output is None or message["status"] != 200:
                    ctl["mode"] = "pass"
                    return await send(message)
                ctype = b""
                for k, v in message.get("headers", []):
                    if k.lower() == b"content-type":
                        ctype = v.lower()
                kind = "sse" if b"event-stream" in ctype else "jsonl" if b"jsonlines" in ctype else "json" if b"json" in ctype else None
                if kind is None:
                    ctl["mode"] = "pass"
                    return await send(message)
                ctl.update(mode="format", start=message, kind=kind)
                if kind != "json":
                    ctl["lines"] = LineFormatter(kind, use.schema, fmt_for(use))
                return
            if message["type"] != "http.response.body" or ctl["mode"] != "format":
                return await send(message)
            use = use_now()
            more = message.get("more_body", False)
            if ctl["kind"] == "json":
                ctl["buf"].append(message.get("body", b""))
                if more:
                    return
                try:
                    obj = json.loads(b"".join(ctl["buf"]))
                    body = json.dumps(format_json_body(obj, use.schema, fmt_for(use))).encode()
                except FormatterError as exc:
                    ctl["failed"] = True
                    return await send_error(use, str(exc))
                start = dict(ctl["start"])
                start["headers"] = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                start["headers"].append((b"content-length", str(len(body)).encode()))
                await send(start)
                return await send({"type": "http.response.body", "body": body, "more_body": False})
            try:
                body = ctl["lines"].feed(message.get("body", b""), last=not more)
            except FormatterError as exc:
                ctl["failed"] = True
                if not ctl["started"]:
                    await send_error(use, str(exc))
                else:
                    # Mid-stream: end the stream with an error event in its own format.
                    log.warning("adapters: %s", exc)
                    await send({"type": "http.response.body", "body": _error_bytes(use, str(exc), ctl["kind"]), "more_body": False})
                if more:
                    await close_streams(state)  # stop generating: abort the request in the engine
                return
            if not ctl["started"]:
                if more and not ctl["lines"].called and len(ctl["pending"]) + len(body) <= MAX_PENDING_BYTES:
                    # Hold the status line until the formatter has run once, so that a formatter
                    # failing on the first text still turns the whole response into a 424.
                    ctl["pending"] += body
                    return
                ctl["started"] = True
                await send(ctl["start"])
                body, ctl["pending"] = ctl["pending"] + body, b""
            await send({"type": "http.response.body", "body": body, "more_body": more})

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            use = use_now()
            if use is not None and use.lease is not None:
                await use.lease.release()
