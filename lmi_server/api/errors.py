"""Typed errors and the one place that maps them to HTTP responses.

Routers raise; they never build error responses themselves. OpenAI-schema errors use OpenAI's
error envelope; LMI-schema errors use LMI's `{"error": ..., "code": ...}` body.
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
from lmi_server.api.admission import BadPriority, Rejected
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
    503: "ServiceUnavailableError",
    507: "InsufficientStorageError",
}


# How long a client should wait before retrying while the engine loads or is rebuilt after it died.
ENGINE_RETRY_AFTER_S = 10


class APIError(Exception):
    """An error with an HTTP status and a message a person can act on."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        lmi: bool = False,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.lmi = lmi

    def body(self) -> dict[str, Any]:
        if self.lmi:
            return {"error": self.message, "code": self.status}
        err: dict[str, Any] = {"message": self.message, "type": _TYPES.get(self.status, "ServerError"), "code": self.status}
        if self.param:
            err["param"] = self.param
        return {"error": err}


def engine_unavailable(reason: str, *, lmi: bool = False) -> APIError:
    """The engine takes no requests now (loading, or being rebuilt after it died): 503 with Retry-After."""
    return APIError(
        503, f"engine not ready: {reason}; retry when GET /ping returns 200", lmi=lmi,
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


def from_vllm_error(error_response: Any, *, lmi: bool = False) -> APIError:
    """vLLM's ErrorResponse -> APIError, status kept. On /invocations (LMI) a prompt that does not
    fit is 424, as LMI's integration tests expect; a bad parameter value stays vLLM's 400."""
    err = getattr(error_response, "error", error_response)
    status = int(getattr(err, "code", 400) or 400)
    message = str(getattr(err, "message", error_response))
    param = getattr(err, "param", None)
    if lmi and status == 400 and prompt_too_long(message, param):
        status = 424
    return APIError(status, message, param=param, lmi=lmi)


def from_vllm_exception(exc: BaseException, *, lmi: bool = False) -> APIError | None:
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
            f"{ENGINE_RETRY_AFTER_S} s (or on another instance)", lmi=lmi,
            headers={"Retry-After": str(ENGINE_RETRY_AFTER_S)},
        )
    if isinstance(exc, VLLMNotFoundError):
        return APIError(404, str(exc), lmi=lmi)
    if isinstance(exc, VLLMClientError):
        param = getattr(exc, "parameter", None)
        # A prompt that does not fit the context is a bad request (400, as OpenAI answers);
        # a sampling parameter out of range is an unprocessable value (422).
        too_long = prompt_too_long(str(exc), param)
        if lmi:
            status = 424 if too_long else 400
        else:
            status = 400 if too_long or param is None else 422
        return APIError(status, str(exc), param=param, lmi=lmi)
    return None


def from_serving_exception(exc: BaseException, *, lmi: bool = False) -> APIError | None:
    """What vLLM's pooling serving classes raise for a bad request (they raise; they do not return
    ErrorResponse): the status vLLM's own server gives it when that is a 4xx (a text over the
    token limit, `dimensions` for a model without Matryoshka vectors: 400); a dead engine 503;
    anything else None (a server error)."""
    mapped = from_vllm_exception(exc, lmi=lmi)
    if mapped is not None:
        if mapped.status == 424:  # LMI's 424 is for generation prompts; an embedding input over the limit is a 400
            mapped.status = 400
        return mapped
    try:
        from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    except ImportError:  # pragma: no cover - moved in another vLLM
        return None
    error = create_error_response(exc).error
    if 400 <= int(error.code) < 500:
        return APIError(int(error.code), str(error.message), param=getattr(error, "param", None), lmi=lmi)
    return None


ADAPTER_ERRORS = (AdapterNotFound, AdapterConflict, AdapterInvalid, AdapterUnavailable, FormatterError)


def from_adapter_error(exc: BaseException, *, lmi: bool = False, param: str | None = None) -> APIError | None:
    """The adapter package's typed errors -> HTTP: unknown adapter 404, name taken 409, invalid
    adapter or formatter script 400, adapter that cannot serve or formatter that failed 424."""
    if isinstance(exc, AdapterNotFound):
        return APIError(404, str(exc), param=param, lmi=lmi)
    if isinstance(exc, AdapterConflict):
        return APIError(409, str(exc), lmi=lmi)
    if isinstance(exc, (AdapterInvalid, FormatterInvalid)):
        return APIError(400, str(exc), lmi=lmi)
    if isinstance(exc, (AdapterUnavailable, FormatterError)):
        return APIError(424, str(exc), lmi=lmi)
    return None


def from_admission_error(exc: BaseException, *, lmi: bool = False) -> APIError | None:
    """Admission's typed refusals -> HTTP: a full queue, a wait past option.max_queue_wait or a
    draining server 503; a tenant over its queue share or its rate limits 429 (both with
    Retry-After, the latter with x-ratelimit-* headers); a bad priority 400."""
    if isinstance(exc, Rejected):
        return APIError(exc.status, exc.message, lmi=lmi, headers=dict(exc.headers))
    if isinstance(exc, BadPriority):
        return APIError(400, str(exc), lmi=lmi, param=None if lmi else "priority")
    return None


def from_engine_limit(exc: BaseException, *, lmi: bool = False) -> APIError | None:
    """A combination of parameters the engine cannot serve with the options it runs with: 400
    naming the parameter (the message names the option and the way around)."""
    if isinstance(exc, UnsupportedCombination):
        return APIError(400, str(exc), param=exc.param, lmi=lmi)
    return None


def stream_error_event(error: APIError, kind: str) -> bytes:
    """The error that ends a stream already under way, in the stream's own format: an SSE `data:`
    event (OpenAI schema) or a jsonlines line (LMI schema)."""
    if kind == "sse":
        return ("data: " + json.dumps(error.body()) + "\n\n").encode()
    return (json.dumps(error.body()) + "\n").encode()


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def _adapter_error(_: Request, exc: Exception) -> JSONResponse:
        mapped = from_adapter_error(exc)
        assert mapped is not None
        return JSONResponse(mapped.body(), status_code=mapped.status)

    for error_type in ADAPTER_ERRORS:
        app.add_exception_handler(error_type, _adapter_error)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(422, validation_message(list(exc.errors()))).body(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected_or_vllm(request: Request, exc: Exception) -> JSONResponse:
        mapped = from_vllm_exception(exc)
        if mapped is not None:
            return JSONResponse(mapped.body(), status_code=mapped.status)
        return await _unexpected(request, exc)


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error")
    return JSONResponse(
        {"error": {"message": redact(f"internal error: {type(exc).__name__}: {exc}"), "type": "InternalServerError", "code": 500}},
        status_code=500,
    )
