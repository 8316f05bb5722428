"""Each model kind's routes, mounted once when the app is built from the kind the configuration
decided (`config/model_kind.py`) and the route table (`api/routes.py`). A route of another kind
answers 400 saying what this model does and where to send the request instead, never a 404 or a
500, and no route asks for the kind again.

A new front door is one entry of `ROUTERS` (its name in the table's `router` column -> its
APIRouter) plus its rows in the table; a new kind is rows naming it and, if its routes read their
bodies themselves, an entry of `REQUEST_BODIES` (for /openapi.json).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from lmi_server.api import routes as table
from lmi_server.api.context import Shape, begin
from lmi_server.api.errors import APIError
from lmi_server.config.model_kind import ModelKind


def _sagemaker() -> APIRouter:
    from lmi_server.api.sagemaker.routes import router

    return router


def _openai() -> APIRouter:
    from lmi_server.api.openai.routes import router

    return router


def _render() -> APIRouter:
    from lmi_server.api.openai.render import router

    return router


def _pooling() -> APIRouter:
    from lmi_server.api.pooling.embeddings import router

    return router


def _adapters() -> APIRouter:
    from lmi_server.api.adapters.routes import router

    return router


def _responses() -> APIRouter:
    from lmi_server.api.responses import router

    return router


def _anthropic() -> APIRouter:
    from lmi_server.api.anthropic import router

    return router


def _tokenize() -> APIRouter:
    from lmi_server.api.tokenize import router

    return router


def _cache_admin() -> APIRouter:
    from lmi_server.api.cache_admin import router

    return router


def _metrics() -> APIRouter:
    from lmi_server.api.metrics_route import router

    return router


ROUTERS: dict[str, Callable[[], APIRouter]] = {
    "sagemaker": _sagemaker,
    "openai": _openai,
    "render": _render,
    "pooling": _pooling,
    "adapters": _adapters,
    "metrics": _metrics,
    "responses": _responses,
    "anthropic": _anthropic,
    "tokenize": _tokenize,
    "cache_admin": _cache_admin,
}
"""Front doors by the name the route table gives them."""


def _render_bodies(components: dict[str, Any]) -> dict[str, Any]:
    from lmi_server.api.openai.render import request_bodies

    return request_bodies(components)


def _embedding_bodies(components: dict[str, Any]) -> dict[str, Any]:
    from lmi_server.api.pooling.embeddings import request_bodies

    return request_bodies(components)


def _generate_bodies(components: dict[str, Any]) -> dict[str, Any]:
    from lmi_server.api.front_door import request_bodies

    return {**_render_bodies(components), **request_bodies(components)}


REQUEST_BODIES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    table.GENERATE: _generate_bodies,
    table.EMBED: _embedding_bodies,
}
"""Bodies a kind's routes read themselves, for /openapi.json (beyond the generation ones)."""

# What a client of the wrong kind is told to use instead.
INSTEAD = {
    "generate": "POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages or /invocations with "
    "{\"inputs\": ..., \"parameters\": {...}}",
    "embed": "POST /v1/embeddings, /score, /rerank, or /invocations with {\"inputs\": \"text\" | [\"text\", ...]}",
    "classify": "nothing here yet: this server serves generating and embedding models",
}
DOES = {"generate": "generates text", "embed": "embeds text", "classify": "classifies text"}
NEEDS = {
    "generate": "a generating model",
    "embed": "an embedding model (option.task=text-embedding)",
    "classify": "a classification model",
}


def select(router: APIRouter, rows: Iterable[table.Route]) -> APIRouter:
    """A router holding the routes of `router` that `rows` name (path and method), each in the
    OpenAPI document as its row says."""
    wanted = {(r.path, m): r for r in rows for m in r.methods}
    picked = APIRouter()
    for route in router.routes:
        methods = getattr(route, "methods", None) or set()
        row = next((wanted[(route.path, m)] for m in methods if (route.path, m) in wanted), None)
        if row is not None:
            route.include_in_schema = row.documented
            picked.routes.append(route)
    return picked


def refusals(kind: ModelKind, refused: dict[str, frozenset[str]]) -> APIRouter:
    """POST routes that answer 400: this model is of `kind`, the path serves other kinds."""
    router = APIRouter()
    for path, kinds in refused.items():
        route_kind = table.GENERATE if table.GENERATE in kinds else sorted(kinds)[0]
        message = (
            f"this model {DOES[kind.name]} ({kind.reason}); {path} needs {NEEDS[route_kind]}. "
            f"This model serves: {INSTEAD[kind.name]}"
        )
        shape = Shape.LMI if path == "/invocations" else Shape.OPENAI

        async def refuse(request: Request, _message: str = message, _shape: Shape = shape):
            begin(request, _shape)
            raise APIError(400, _message)

        router.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)
    return router


def install(app: FastAPI, kind: ModelKind) -> None:
    """Mount the rows of the table this kind serves, and refusals for the other kinds' paths."""
    for name, make in ROUTERS.items():
        rows = table.rows(router=name, kind=kind.name)
        if rows:
            app.include_router(select(make(), rows))
    app.include_router(refusals(kind, table.refused_paths(kind.name, set(ROUTERS))))
    app.state.ctx.request_bodies = REQUEST_BODIES.get(kind.name)
