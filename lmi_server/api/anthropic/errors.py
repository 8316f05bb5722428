"""Anthropic's error format, `{"type": "error", "error": {"type": ..., "message": ...}}`, for every
refusal on the Messages routes: Anthropic's clients read `error.type` and `error.message` from it.
The statuses are the ones every route uses (`api/errors.py`); only the body differs."""

from __future__ import annotations

import functools
from typing import Any

from lmi_server.api.errors import APIError

PREFIX = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def anthropic_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicAPIError(APIError):
    """An APIError whose body is in Anthropic's format."""

    def body(self) -> dict[str, Any]:
        return anthropic_body(self.status, self.message)


def in_anthropic_format(route):
    """Route decorator: every APIError it raises leaves in Anthropic's format, status and headers kept."""

    @functools.wraps(route)
    async def wrapped(*args, **kwargs):
        try:
            return await route(*args, **kwargs)
        except AnthropicAPIError:
            raise
        except APIError as exc:
            raise AnthropicAPIError(exc.status, exc.message, headers=exc.headers) from None

    return wrapped


def error_body_for(path: str, error: APIError) -> dict[str, Any]:
    """A refusal made before any route runs (the API-key check) in the format of the path's API."""
    return anthropic_body(error.status, error.message) if is_anthropic_path(path) else error.body()
