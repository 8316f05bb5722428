"""A local HTTP proxy that adds fields to every JSON request body on its way to the server.

Why: LMCache's `lmcache bench engine` (run unmodified) sends ordinary OpenAI requests and has no
way to add a `cache_salt` or `kv_transfer_params`; the quality benchmark needs both to run several
arms on one server (each arm its own salt, so no arm reuses another's KV; blend arms their own
mode, ratio or EPIC token count). Responses, streamed ones included, pass through untouched.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

_HOP = {"host", "content-length", "transfer-encoding", "connection"}


class BodyProxy:
    """Serves on 127.0.0.1:`port`, forwards to `upstream`; `fields()` is merged into each JSON POST
    body (a `kv_transfer_params` dict merged key by key)."""

    def __init__(self, upstream: str, port: int, fields: Callable[[], dict[str, Any]]) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.upstream = upstream.rstrip("/")
        self.url = f"http://127.0.0.1:{port}"
        self.fields = fields
        self.requests = 0
        self.texts: list[str] = []
        """The text of every streamed chat answer longer than one token, in order (the quality
        benchmark scores them itself where the model does not write LMCache's answer tags)."""
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def _body(self, raw: bytes) -> bytes:
        data = json.loads(raw)
        for key, value in self.fields().items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        self.requests += 1
        return json.dumps(data).encode()

    async def _forward(self, request):
        from starlette.background import BackgroundTask
        from starlette.responses import StreamingResponse

        raw = await request.body()
        keep = False
        if request.method == "POST" and raw:
            keep = (json.loads(raw).get("max_tokens") or 0) > 1
            raw = self._body(raw)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        client = httpx.AsyncClient(timeout=None)
        upstream = client.build_request(request.method, f"{self.upstream}{request.url.path}",
                                        params=request.query_params, content=raw, headers=headers)
        response = await client.send(upstream, stream=True)

        async def close() -> None:
            await response.aclose()
            await client.aclose()

        async def relay():
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                yield chunk
            if keep:
                self.texts.append(_streamed_text(b"".join(chunks)))

        return StreamingResponse(relay(), status_code=response.status_code,
                                 headers={k: v for k, v in response.headers.items() if k.lower() not in _HOP},
                                 background=BackgroundTask(close))

    def __enter__(self) -> BodyProxy:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the body proxy did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _streamed_text(body: bytes) -> str:
    """The answer text of an OpenAI chat stream (server-sent events), or of a plain JSON answer."""
    text = []
    for line in body.decode(errors="replace").splitlines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        try:
            choice = json.loads(line[5:])["choices"][0]
        except (ValueError, KeyError, IndexError):
            continue
        text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    if not text and body.strip().startswith(b"{"):
        try:
            return json.loads(body)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError):
            return ""
    return "".join(text)
