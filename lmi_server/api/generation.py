"""Calls into vLLM's serving objects, shared by the OpenAI routes and /invocations.

vLLM returns `Response | ErrorResponse | AsyncGenerator`; here that becomes a Starlette response
or a raised APIError. A client that disconnects aborts its generation: streaming responses close
vLLM's generator (which aborts the request); non-streaming calls race a disconnect listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request

from lmi_server.api.adapter_routing import STATE_KEY as ADAPTER_KEY
from lmi_server.api.adapter_routing import STREAMS_KEY
from lmi_server.api.admission import HEADERS_KEY, REJECTED, TICKET_KEY, BadPriority, Rejected, count
from lmi_server.api.errors import (
    APIError,
    engine_unavailable,
    from_admission_error,
    from_engine_limit,
    from_vllm_error,
    from_vllm_exception,
)
from lmi_server.api.tenants import estimate_tokens, parse_priority
from lmi_server.engine_limits import UnsupportedCombination
from lmi_server.api.lmi_formatters import respond

log = logging.getLogger(__name__)


def engine_state(request: Request):
    state = request.app.state.engine_owner.state
    if not state.healthy:
        raise engine_unavailable(state.error or "the model is still loading")
    return state


def engine_max_num_seqs(state) -> int | None:
    config = getattr(state.engine, "vllm_config", None)
    return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)


def check_engine_limits(request: Request, parsed: Any, *, lmi: bool) -> None:
    """Refuse, before it takes a slot, a request the running engine would die of (`engine_limits`)."""
    limits = getattr(request.app.state, "engine_limits", None)
    if parsed is None or limits is None:
        return
    try:
        limits.check(parsed)
    except UnsupportedCombination as exc:
        raise from_engine_limit(exc, lmi=lmi) from None


async def admit(request: Request, state, *, lmi: bool = False, parsed: Any = None) -> None:
    """Take an engine slot for the request's tenant (waiting in the fair queue if need be), or raise
    in the request's schema: 400 for a bad priority, 429 for a tenant over its rate limits or queue
    share, 503 for a full queue or a wait too long. `parsed` is the vLLM request about to be sent
    (its priority is set here). The ticket is released by AdmissionReleaseMiddleware."""
    check_engine_limits(request, parsed, lmi=lmi)
    admission = request.app.state.admission
    tenants = request.app.state.tenants
    if admission.slots is None:
        admission.set_slots(engine_max_num_seqs(state) or 1)
    scope_state = request.scope.setdefault("state", {})
    use = scope_state.get(ADAPTER_KEY)
    tenant = tenants.identify(request.scope, request.headers, getattr(use, "name", None))
    try:
        priority = parse_priority(request.headers, parsed)
    except BadPriority as exc:
        raise from_admission_error(exc, lmi=lmi) from None
    if parsed is not None and hasattr(parsed, "priority"):
        parsed.priority = priority if tenants.vllm_priority else 0  # vLLM's fcfs policy refuses others
    decision = tenants.limiter.check(tenant, estimate_tokens(parsed))
    if decision.headers:
        scope_state[HEADERS_KEY] = {k: v for k, v in decision.headers.items() if k != "retry-after"}
    try:
        if not decision.allowed:
            REJECTED.labels(reason="rate_limited").inc()
            count(tenant, "rate_limited")
            raise Rejected(
                "rate_limited",
                f"rate limit of tenant {tenant!r} reached ({decision.exceeded} per "
                f"{'second' if decision.exceeded == 'requests' else 'minute'}); retry in "
                f"{decision.retry_after_s:.1f} s",
                max(1, int(-(-decision.retry_after_s // 1))),
                decision.headers,
            )
        stream = bool(getattr(parsed, "stream", False))
        ticket = await until_disconnect(admission.acquire(tenant, priority, stream=stream), request)
    except Rejected as exc:
        if exc.status == 429:
            log.info("admission: tenant %s refused: %s", tenant, exc.reason)
        raise from_admission_error(exc, lmi=lmi) from None
    scope_state[TICKET_KEY] = ticket


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


def admission_ticket(request: Request) -> Any:
    return request.scope.get("state", {}).get(TICKET_KEY)


def served_name(state) -> str | None:
    """The base model's first served name (what LMI calls the model: "lmi" stands for it)."""
    models = getattr(getattr(state, "serving", None), "openai_serving_models", None)
    paths = getattr(models, "base_model_paths", None) or []
    return paths[0].name if paths else None


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


async def as_response(
    result: Any, request: Request, headers: dict[str, str] | None = None, stream_kind: str = "sse", dump: Any = None
):
    """vLLM's result as a response (through the output formatter, if any). Streams are SSE (the
    OpenAI routes) or jsonlines (`stream_kind="jsonl"`: /invocations, as LMI sends them); `dump`
    replaces the default JSON of a response object (a front door sending vLLM's own encoding)."""
    return await respond(
        request, result, shape_json=lambda body: body, shape_stream=(lambda events: events) if stream_kind == "sse" else sse_to_jsonl,
        kind=stream_kind, headers=headers, wrap=lambda body: yielding(body, admission_ticket(request)),
        **({"dump": dump} if dump is not None else {}),
    )
