"""Typed errors and the one place that maps them to HTTP responses.

Routers raise; they never build error responses themselves, and they never say which shape an
error takes: the front door fixed the request's shape once (`api/context.py`), and the handlers
here render every error in it: OpenAI's envelope, LMI's flat `{"error": ..., "code": ...}` (TGI's
route too), or Anthropic's `{"type": "error", "error": {"type": ..., "message": ...}}`. Where LMI
answers another status than OpenAI for the same failure (a prompt too long: 424), the error
carries both (`lmi_status`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmi_server.adapters.formatters import FormatterError, FormatterInvalid
from lmi_server.adapters.registry import AdapterConflict, AdapterNotFound, AdapterUnavailable
from lmi_server.adapters.validation import AdapterInvalid
from lmi_server.admission import BadPriority, Rejected
from lmi_server.api.context import Shape, request_context
from lmi_server.engine_limits import UnsupportedCombination
from lmi_server.redact import redact

log = logging.getLogger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    424: "FailedDependencyError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    507: "InsufficientStorageError",
}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


# How long a client should wait before retrying while the engine loads or is rebuilt after it died.
ENGINE_RETRY_AFTER_S = 10


class APIError(Exception):
    """An error with an HTTP status and a message a person can act on. `lmi_status`: the status
    on LMI's routes where LMI answers another one (rendered by the request's shape)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        lmi_status: int | None = None,
    ):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.lmi_status = lmi_status

    def status_for(self, shape: Shape) -> int:
        if shape in (Shape.LMI, Shape.TGI) and self.lmi_status is not None:
            return self.lmi_status
        return self.status

    def body(self, shape: Shape = Shape.OPENAI) -> dict[str, Any]:
        status = self.status_for(shape)
        if shape in (Shape.LMI, Shape.TGI):
            return {"error": self.message, "code": status}
        if shape is Shape.ANTHROPIC:
            kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        err: dict[str, Any] = {"message": self.message, "type": _TYPES.get(status, "ServerError"), "code": status}
        if self.param:
            err["param"] = self.param
        return {"error": err}

    def response(self, shape: Shape = Shape.OPENAI) -> JSONResponse:
        return JSONResponse(self.body(shape), status_code=self.status_for(shape), headers=self.headers)


def engine_unavailable(reason: str) -> APIError:
    """The engine takes no requests now (loading, or being rebuilt after it died): 503 with Retry-After."""
    return APIError(
        503, f"engine not ready: {reason}; retry when GET /ping returns 200",
        headers={"Retry-After": str(ENGINE_RETRY_AFTER_S)},
    )


def validation_message(errors: list[dict[str, Any]], limit: int = 5) -> str:
    """Pydantic errors -> 'field: problem; ...' (first few)."""
    parts = []
    for err in errors[:limit]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    more = len(errors) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def validated(validate: Any, body: Any, *, other_status: int = 422) -> Any:
    """`validate(body)` with pydantic's errors as a 422 that lists them; vLLM's validators raise
    their own client errors, which become `other_status`."""
    from pydantic import ValidationError

    try:
        return validate(body)
    except ValidationError as exc:
        raise APIError(422, validation_message(exc.errors())) from None
    except Exception as exc:  # noqa: BLE001 - vLLM's own request validators
        raise APIError(other_status, str(exc)) from None


def prompt_too_long(message: str, param: str | None = None) -> bool:
    text = message.lower()
    return param in ("input_tokens", "prompt") or "context length" in text or "maximum context" in text or "too long" in text


def from_vllm_error(error_response: Any) -> APIError:
    """vLLM's ErrorResponse -> APIError, status kept. On /invocations (LMI) a prompt that does not
    fit is 424, as LMI's integration tests expect; a bad parameter value stays vLLM's 400."""
    err = getattr(error_response, "error", error_response)
    status = int(getattr(err, "code", 400) or 400)
    message = str(getattr(err, "message", error_response))
    param = getattr(err, "param", None)
    lmi_status = 424 if status == 400 and prompt_too_long(message, param) else None
    return APIError(status, message, param=param, lmi_status=lmi_status)


def from_vllm_exception(exc: BaseException) -> APIError | None:
    """vLLM's client errors raised by the engine side (e.g. prompt too long) -> 400/404, as vLLM's
    own server answers; LMI-schema requests get 424. Anything else -> None."""
    try:
        from vllm.exceptions import VLLMClientError, VLLMNotFoundError
    except ImportError:
        return None
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # pragma: no cover - moved in another vLLM
        EngineDeadError = ()  # type: ignore[assignment]
    if EngineDeadError and isinstance(exc, EngineDeadError):
        return APIError(
            503, "the engine died while serving this request; it is being rebuilt, retry after "
            f"{ENGINE_RETRY_AFTER_S} s (or on another instance)",
            headers={"Retry-After": str(ENGINE_RETRY_AFTER_S)},
        )
    if isinstance(exc, VLLMNotFoundError):
        return APIError(404, str(exc))
    if isinstance(exc, VLLMClientError):
        param = getattr(exc, "parameter", None)
        # A prompt that does not fit the context is a bad request (400, as OpenAI answers);
        # a sampling parameter out of range is an unprocessable value (422). LMI: 424 and 400.
        too_long = prompt_too_long(str(exc), param)
        status = 400 if too_long or param is None else 422
        return APIError(status, str(exc), param=param, lmi_status=424 if too_long else 400)
    return None


def from_serving_exception(exc: BaseException) -> APIError | None:
    """What vLLM's pooling serving classes raise for a bad request (they raise; they do not return
    ErrorResponse): the status vLLM's own server gives it when that is a 4xx (a text over the
    token limit, `dimensions` for a model without Matryoshka vectors: 400); a dead engine 503;
    anything else None (a server error)."""
    mapped = from_vllm_exception(exc)
    if mapped is not None:
        if mapped.lmi_status == 424:  # LMI's 424 is for generation prompts; an embedding input over the limit is a 400
            mapped.lmi_status = 400
        return mapped
    try:
        from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    except ImportError:  # pragma: no cover - moved in another vLLM
        return None
    error = create_error_response(exc).error
    if 400 <= int(error.code) < 500:
        return APIError(int(error.code), str(error.message), param=getattr(error, "param", None))
    return None


ADAPTER_ERRORS = (AdapterNotFound, AdapterConflict, AdapterInvalid, AdapterUnavailable, FormatterError)


def from_adapter_error(exc: BaseException, *, param: str | None = None) -> APIError | None:
    """The adapter package's typed errors -> HTTP: unknown adapter 404, name taken 409, invalid
    adapter or formatter script 400, adapter that cannot serve or formatter that failed 424."""
    if isinstance(exc, AdapterNotFound):
        return APIError(404, str(exc), param=param)
    if isinstance(exc, AdapterConflict):
        return APIError(409, str(exc))
    if isinstance(exc, (AdapterInvalid, FormatterInvalid)):
        return APIError(400, str(exc))
    if isinstance(exc, (AdapterUnavailable, FormatterError)):
        return APIError(424, str(exc))
    return None


def from_admission_error(exc: BaseException) -> APIError | None:
    """Admission's typed refusals -> HTTP: a full queue, a wait past option.max_queue_wait or a
    draining server 503; a tenant over its queue share or its rate limits 429 (both with
    Retry-After, the latter with x-ratelimit-* headers); a bad priority 400."""
    if isinstance(exc, Rejected):
        return APIError(exc.status, exc.message, headers=dict(exc.headers))
    if isinstance(exc, BadPriority):
        return APIError(400, str(exc), param="priority")
    return None


def from_engine_limit(exc: BaseException) -> APIError | None:
    """A combination of parameters the engine cannot serve with the options it runs with: 400
    naming the parameter (the message names the option and the way around)."""
    if isinstance(exc, UnsupportedCombination):
        return APIError(400, str(exc), param=exc.param)
    return None


def stream_error_event(error: APIError, shape: Shape, kind: str) -> bytes:
    """The error that ends a stream already under way, in the request's shape and the stream's own
    format: an SSE `data:` event or a jsonlines line."""
    if kind == "sse":
        return ("data: " + json.dumps(error.body(shape)) + "\n\n").encode()
    return (json.dumps(error.body(shape)) + "\n").encode()


def _shape(request: Request) -> Shape:
    return request_context(request).shape


def install_error_handlers(app: FastAPI) -> None:
    """Every error, rendered in the shape the request's front door chose."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(_shape(request))

    async def _adapter_error(request: Request, exc: Exception) -> JSONResponse:
        mapped = from_adapter_error(exc)
        assert mapped is not None
        return mapped.response(_shape(request))

    for error_type in ADAPTER_ERRORS:
        app.add_exception_handler(error_type, _adapter_error)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return APIError(422, validation_message(list(exc.errors()))).response(_shape(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response(_shape(request))

    @app.exception_handler(Exception)
    async def _unexpected_or_vllm(request: Request, exc: Exception) -> JSONResponse:
        mapped = from_vllm_exception(exc)
        if mapped is not None:
            return mapped.response(_shape(request))
        log.exception("unhandled error")
        error = APIError(500, redact(f"internal error: {type(exc).__name__}: {exc}"))
        return error.response(_shape(request))
