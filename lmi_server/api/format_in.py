"""The pipeline's "format in" stage: the body through the payload formatter of the adapter the
request resolved to (when its model.py has one), else of the model directory's model.py (LMI's
contract, lmi_server/adapters/formatters.py); the output formatter that applies is recorded in the
request's context for api/respond.py. A formatter that fails is LMI's 424.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from lmi_server.adapters.formatters import FormatterError, Formatters
from lmi_server.api.context import RequestContext, app_context, request_context
from lmi_server.api.errors import APIError

log = logging.getLogger(__name__)

NO_FORMATTERS = Formatters(owner="the model")


def _tokenizer(request: Request) -> Any:
    engine = getattr(app_context(request).owner.state, "engine", None)
    try:
        return engine.get_tokenizer() if engine is not None else None
    except Exception:  # noqa: BLE001 - a formatter that needs it will say so itself
        return None


def _adapter_formatters(ctx: RequestContext) -> Formatters | None:
    lease = getattr(ctx.adapter, "lease", None)
    return getattr(getattr(lease, "entry", None), "formatters", None)


def apply_payload_formatter(request: Request, body: Any) -> Any:
    """The body as the payload formatter returns it; records which response formatter applies."""
    ctx = request_context(request)
    model_level: Formatters = app_context(request).model_formatters or NO_FORMATTERS
    adapter = _adapter_formatters(ctx)
    source_in = adapter if adapter is not None and adapter.has_input else model_level
    source_out = adapter if adapter is not None and adapter.has_output else model_level
    if source_out.response_output is not None:
        ctx.formatters = source_out
    if source_in.payload_input is None:
        return body
    try:
        return source_in.format_payload(body, tokenizer=_tokenizer(request))
    except FormatterError as exc:
        log.warning("formatters: %s", exc)
        raise APIError(424, f"Custom formatter failed: {exc}") from None
