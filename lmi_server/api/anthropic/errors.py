"""Anthropic's error format for refusals made before a front door runs (the API-key check): the
routes themselves answer in it through the request's shape (`Shape.ANTHROPIC`, `api/errors.py`)."""

from __future__ import annotations

from typing import Any

from lmi_server.api.context import Shape
from lmi_server.api.errors import APIError

PREFIX = "/v1/messages"


def is_anthropic_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_body_for(path: str, error: APIError) -> dict[str, Any]:
    """A refusal's body in the format of the path's API (Anthropic's on /v1/messages*, else OpenAI's)."""
    return error.body(Shape.ANTHROPIC) if is_anthropic_path(path) else error.body()
