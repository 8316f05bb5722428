"""The two typed contexts of the HTTP layer.

`AppContext`: what the app is built from and holds for its whole life (configuration, the engine's
owner, admission, tenants, adapters, sessions, the model directory's formatters ...), built once in
`create_app` and kept as `app.state.ctx`. Routers and middleware read it there; nothing is looked
up by a string name at request time and nothing is swapped in later.

`RequestContext`: what one request carries from its front door to the end of its response, kept
under ONE key of the ASGI scope's state (`REQUEST_KEY`): the response shape chosen by the front
door (errors are rendered from it, `api/errors.py`), the body as it arrived, the API key that
authenticated it, the adapter it uses (its lease), the output formatter that applies, its
admission ticket, headers to add to the response, and the response's async generators (closed to
abort the generation).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

REQUEST_KEY = "lmi_request"


class Shape(str, enum.Enum):
    """The wire shape of a request's answer, errors included, fixed by its front door."""

    OPENAI = "openai"  # {"error": {"message", "type", "code", "param"}}
    LMI = "lmi"  # {"error": "...", "code": N}
    TGI = "tgi"  # LMI's route with option.tgi_compat: errors as LMI's
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type": ..., "message": ...}}


@dataclass
class RequestContext:
    """Per-request state (see the module docstring); one instance per HTTP request."""

    shape: Shape = Shape.OPENAI
    raw_body: bytes = b""
    key_entry: Any = None  # api.auth.KeyEntry of the key that authenticated the request
    adapter: Any = None  # api.adapters.routing.AdapterUse (name and lease)
    tenant: str | None = None  # who the request is for (admission, rate limits)
    formatters: Any = None  # adapters.formatters.Formatters whose output formatter applies
    ticket: Any = None  # lmi_server.admission.Ticket, released when the response is over
    response_headers: dict[str, str] = field(default_factory=dict)
    streams: list[Any] = field(default_factory=list)  # innermost (vLLM's) first
    arrived: float = field(default_factory=time.perf_counter)  # created first thing (RequestScopeMiddleware): TTFT's start

    @property
    def lmi(self) -> bool:
        return self.shape in (Shape.LMI, Shape.TGI)


def request_context(scope_or_request: Any) -> RequestContext:
    """The request's context (created on first use): takes an ASGI scope or a Starlette request."""
    scope = scope_or_request if isinstance(scope_or_request, dict) else scope_or_request.scope
    state = scope.setdefault("state", {})
    ctx = state.get(REQUEST_KEY)
    if ctx is None:
        ctx = state[REQUEST_KEY] = RequestContext()
    return ctx


def begin(request: Any, shape: Shape) -> RequestContext:
    """A front door fixes the request's shape: its errors and its answer are shaped so."""
    ctx = request_context(request)
    ctx.shape = shape
    return ctx


@dataclass
class AppContext:
    """The app's long-lived parts, built once in `create_app` (see the module docstring)."""

    config: Any
    owner: Any  # engine.EngineOwner
    admission: Any  # lmi_server.admission.Admission
    tenants: Any  # lmi_server.admission.Tenants
    sessions: Any  # api.sessions.SessionHook
    model_formatters: Any  # adapters.formatters.Formatters of the model directory's model.py
    handler_properties: dict[str, str]
    media_policy: Any  # api.media.MediaPolicy
    runtime: Any = None
    adapters: Any = None  # api.adapters.wiring.AdapterState
    engine_limits: Any = None  # engine_limits.EngineLimits of the running engine (set when it is ready)
    prefill_gate: Any = None
    request_bodies: Any = None  # the model kind's extra request bodies for /openapi.json

    @property
    def lora(self) -> bool:
        return bool(self.adapters is not None and self.adapters.enabled)


def app_context(request_or_app: Any) -> AppContext:
    app = getattr(request_or_app, "app", request_or_app)
    return app.state.ctx
