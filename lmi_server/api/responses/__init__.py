"""The OpenAI Responses API front door (POST /v1/responses, GET /v1/responses/{id}, cancel)."""

from lmi_server.api.responses.routes import PATHS, router

__all__ = ["PATHS", "router"]
