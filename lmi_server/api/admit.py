"""The pipeline's "admit" stage, the HTTP side of admission (the policy, queue, tenants and limits
are `lmi_server.admission`): taking an engine slot for a request.

`admit` identifies the tenant (API key, else the adapter resolved, else the operator's header),
reads the priority, checks the tenant's rate limits and waits for a slot, raising typed refusals
that api/errors.py renders in the request's shape. The caller runs it cancellable by a client
disconnect (the pipeline's `until_disconnect`); the ticket is released when the response is over
(api/request_scope.py).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from lmi_server.admission import REJECTED, BadPriority, Rejected, count, estimate_tokens, parse_priority
from lmi_server.api.context import app_context, request_context
from lmi_server.api.errors import from_admission_error
from lmi_server import usage_metrics

log = logging.getLogger(__name__)


def engine_max_num_seqs(state) -> int | None:
    config = getattr(state.engine, "vllm_config", None)
    return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)


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


def identify_tenant(request: Request) -> str:
    """The request's tenant (kept in its context): the API key that authenticated it, else its
    adapter (resolved first), else the operator's header, else the shared default."""
    ctx = request_context(request)
    key_name = getattr(ctx.key_entry, "name", None)
    ctx.tenant = app_context(request).tenants.identify(key_name, request.headers, getattr(ctx.adapter, "name", None))
    return ctx.tenant


async def admit(request: Request, state: Any, parsed: Any = None) -> None:
    """Take an engine slot for the request's tenant (waiting in the fair queue if need be), or
    raise: 400 for a bad priority, 429 for a tenant over its rate limits or queue share, 503 for a
    full queue or a wait too long. `parsed` is the vLLM request about to be sent (its priority is
    set here). The ticket is released by api/request_scope.RequestScopeMiddleware."""
    app, ctx = app_context(request), request_context(request)
    admission, tenants = app.admission, app.tenants
    if admission.slots is None:
        admission.set_slots(engine_max_num_seqs(state) or 1)
    tenant = ctx.tenant or identify_tenant(request)
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
        ctx.ticket = await admission.acquire(tenant, priority, stream=stream)
    except Rejected as exc:
        usage_metrics.refused(ctx.adapter, exc.reason)
        if exc.status == 429:
            log.info("admission: tenant %s refused: %s", tenant, exc.reason)
        raise from_admission_error(exc) from None
    usage_metrics.admitted(ctx.adapter, ctx.ticket.waited_s)
