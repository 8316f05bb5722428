"""The Anthropic Messages API front door (POST /v1/messages, POST /v1/messages/count_tokens)."""

from lmi_server.api.anthropic.errors import error_body_for, is_anthropic_path
from lmi_server.api.anthropic.routes import PATHS, router

__all__ = ["PATHS", "error_body_for", "is_anthropic_path", "router"]
