"""The HTTP side of admission (the policy, queue, tenants and limits are `lmi_server.admission`):
taking an engine slot for a request, and the middleware that ends every request's hold on the
server's resources.

`admit` identifies the tenant (API key, else adapter, else the operator's header), reads the
priority, checks the tenant's rate limits and waits for a slot, raising typed refusals that
api/errors.py renders in the request's shape. `RequestScopeMiddleware` (outermost) creates the
request's context and, when the response is over however it ended (client gone, error,
cancellation), releases the adapter lease and the admission ticket; it adds the headers the request
collected on its way (the tenant's rate-limit headers) to the response.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from lmi_server.admission import REJECTED, BadPriority, Rejected, count, estimate_tokens, parse_priority
from lmi_server.api.context import app_context, request_context
from lmi_server.api.engine_calls import engine_max_num_seqs, until_disconnect
from lmi_server.api.errors import from_admission_error

log = logging.getLogger(__name__)


def _rate_limited(tenant: str, decision: Any) -> Rejected:
    REJECTED.labels(reason="rate_limited").inc()
    count(tenant, "rate_limited")
    unit = "second" if decision.exceeded == "requests" else "minute"
    return Rejected(
        "rate_limited",
        f"rate limit of tenant {tenant!r} reached ({decision.exceeded} per {unit}); retry in "
        f"{decision.retry_after_s:.1f} s",
        max(1, int(-(-decision.retry_after_s // 1))),
        decision.headers,
    )


def tenant_of(request: Request) -> str:
    """The request's tenant: the API key that authenticated it, else its adapter, else the header."""
    ctx = request_context(request)
    key_name = getattr(ctx.key_entry, "name", None)
    return app_context(request).tenants.identify(key_name, request.headers, getattr(ctx.adapter, "name", None))


async def admit(request: Request, state: Any, parsed: Any = None) -> None:
    """Take an engine slot for the request's tenant (waiting in the fair queue if need be), or
    raise: 400 for a bad priority, 429 for a tenant over its rate limits or queue share, 503 for a
    full queue or a wait too long. `parsed` is the vLLM request about to be sent (its priority is
    set here). The ticket is released by RequestScopeMiddleware."""
    app, ctx = app_context(request), request_context(request)
    admission, tenants = app.admission, app.tenants
    if admission.slots is None:
        admission.set_slots(engine_max_num_seqs(state) or 1)
    tenant = tenant_of(request)
    try:
        priority = parse_priority(request.headers, parsed)
    except BadPriority as exc:
        raise from_admission_error(exc) from None
    if parsed is not None and hasattr(parsed, "priority"):
        parsed.priority = priority if tenants.vllm_priority else 0  # vLLM's fcfs policy refuses others
    decision = tenants.limiter.check(tenant, estimate_tokens(parsed))
    if decision.headers:
        ctx.response_headers.update({k: v for k, v in decision.headers.items() if k != "retry-after"})
    try:
        if not decision.allowed:
            raise _rate_limited(tenant, decision)
        stream = bool(getattr(parsed, "stream", False))
        ctx.ticket = await until_disconnect(admission.acquire(tenant, priority, stream=stream), request)
    except Rejected as exc:
        if exc.status == 429:
            log.info("admission: tenant %s refused: %s", tenant, exc.reason)
        raise from_admission_error(exc) from None


class RequestScopeMiddleware:
    """Outermost: every request gets its context; when its response is over, its adapter lease and
    admission ticket are released, and the headers it collected are added to the response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = request_context(scope)

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and ctx.response_headers:
                present = {k.lower() for k, _ in message.get("headers", [])}
                added = [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in ctx.response_headers.items()
                    if k.encode("latin-1") not in present
                ]
                message = {**message, "headers": list(message.get("headers", [])) + added}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            try:
                if ctx.adapter is not None and ctx.adapter.lease is not None:
                    await ctx.adapter.lease.release()
            finally:
                if ctx.ticket is not None:
                    ctx.ticket.release()
