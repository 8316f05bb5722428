"""Calling vLLM's serving objects: the engine's readiness, the call itself, its stream.

vLLM returns `Response | ErrorResponse | AsyncGenerator`; here that becomes a result or a raised
APIError (rendered in the request's shape by api/errors.py). A client that disconnects aborts its
generation: a call still running is cancelled by vLLM's own `with_cancellation` (vLLM aborts the
request on cancel), and a streaming response closes vLLM's generator (which aborts it too).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request

from lmi_server.api.context import app_context
from lmi_server.api.errors import APIError, engine_unavailable, from_vllm_error, from_vllm_exception


def engine_state(request: Request):
    """The running engine's state; 503 with Retry-After while it loads or is rebuilt."""
    state = app_context(request).owner.state
    if not state.healthy:
        raise engine_unavailable(state.error or "the model is still loading")
    return state


def engine_max_num_seqs(state) -> int | None:
    config = getattr(state.engine, "vllm_config", None)
    return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)


def served_name(state) -> str | None:
    """The base model's first served name (what LMI calls the model: "lmi" stands for it)."""
    models = getattr(getattr(state, "serving", None), "openai_serving_models", None)
    paths = getattr(models, "base_model_paths", None) or []
    return paths[0].name if paths else None


async def until_disconnect(coro: Awaitable[Any], request: Request) -> Any:
    """Run coro under vLLM's `with_cancellation`: if the client goes away first, coro is cancelled
    (vLLM aborts the request on cancel) and the request ends with a 400."""
    from vllm.entrypoints.serve.utils.api_utils import with_cancellation

    async def work(_self: Any, raw_request: Request) -> tuple[Any]:
        return (await coro,)  # a tuple: with_cancellation's None means "disconnected"

    done = await with_cancellation(work)(None, request)
    if done is None:
        raise APIError(400, "client disconnected before the response was ready")
    return done[0]


def is_error(result: Any) -> bool:
    return type(result).__name__ == "ErrorResponse"


async def call_serving(coro: Awaitable[Any], request: Request) -> Any:
    """Await a vLLM serving call; ErrorResponse -> APIError; generators are returned as they are."""
    try:
        result = await until_disconnect(coro, request)
    except APIError:
        raise
    except Exception as exc:
        mapped = from_vllm_exception(exc)
        if mapped is None:
            raise
        raise mapped from None
    if is_error(result):
        raise from_vllm_error(result)
    return result


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
