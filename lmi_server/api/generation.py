"""Calls into vLLM's serving objects, shared by the OpenAI routes and /invocations.

vLLM returns `Response | ErrorResponse | AsyncGenerator`; here that becomes a Starlette response
or a raised APIError. A client that disconnects aborts its generation: streaming responses close
vLLM's generator (which aborts the request); non-streaming calls race a disconnect listener.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from lmi_server.api.adapter_routing import STREAMS_KEY, format_json, format_stream
from lmi_server.api.admission import TICKET_KEY, Rejected
from lmi_server.api.errors import APIError, from_vllm_error, from_vllm_exception


def engine_state(request: Request):
    state = request.app.state.engine_owner.state
    if not state.healthy:
        reason = state.error or "the model is still loading"
        raise APIError(503, f"engine not ready: {reason}; retry when GET /ping returns 200")
    return state


def engine_max_num_seqs(state) -> int | None:
    config = getattr(state.engine, "vllm_config", None)
    return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)


async def admit(request: Request, state, *, lmi: bool = False) -> None:
    """Take an engine slot (waiting in the bounded queue if need be), or raise 503 + Retry-After in
    the request's schema. The ticket is released by AdmissionReleaseMiddleware."""
    admission = request.app.state.admission
    if admission.slots is None:
        admission.set_slots(engine_max_num_seqs(state) or 1)
    try:
        ticket = await until_disconnect(admission.acquire(), request)
    except Rejected as exc:
        raise APIError(503, exc.message, lmi=lmi, headers={"Retry-After": str(exc.retry_after_s)}) from None
    request.scope.setdefault("state", {})[TICKET_KEY] = ticket


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(coro: Awaitable[Any], request: Request) -> Any:
    """Run coro; if the client goes away first, cancel it (vLLM aborts the request on cancel)."""
    work = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise APIError(400, "client disconnected before the response was ready")
    finally:
        watcher.cancel()


def is_error(result: Any) -> bool:
    return type(result).__name__ == "ErrorResponse"


async def call_serving(coro: Awaitable[Any], request: Request, *, lmi: bool = False) -> Any:
    """Await a vLLM serving call; ErrorResponse -> APIError; generators are returned as they are."""
    try:
        result = await until_disconnect(coro, request)
    except APIError:
        raise
    except Exception as exc:
        mapped = from_vllm_exception(exc, lmi=lmi)
        if mapped is None:
            raise
        raise mapped from None
    if is_error(result):
        raise from_vllm_error(result, lmi=lmi)
    return result


def is_stream(result: Any) -> bool:
    return isinstance(result, AsyncIterator) or hasattr(result, "__aiter__")


def track_stream(request: Request, gen: Any) -> Any:
    """Record a response generator (innermost first) so that a response ended early (a failing
    output formatter) can close it, which aborts the engine request."""
    request.scope.setdefault("state", {}).setdefault(STREAMS_KEY, []).append(gen)
    return gen


async def as_response(result: Any, request: Request, headers: dict[str, str] | None = None):
    """vLLM's result as a response, with the adapter's output formatter (if any) applied."""
    if is_stream(result):
        track_stream(request, result)
        return StreamingResponse(await format_stream(request, result, "sse"), media_type="text/event-stream", headers=headers)
    return JSONResponse(format_json(request, result.model_dump(exclude_none=False)), headers=headers)
