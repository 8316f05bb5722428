"""Each model kind's routes, chosen once when the app is built from the kind the configuration
decided (`config/model_kind.py`). A route of another kind answers 400 saying what this model does
and where to send the request instead, never a 404 or a 500, and no route asks for the kind again.
A new kind is one entry of `KINDS`: its routers (with refusals of the others' paths) and the
request bodies its routes read themselves, for /openapi.json.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from lmi_server.api.context import Shape, begin
from lmi_server.api import anthropic as anthropic_routes
from lmi_server.api import responses as responses_routes
from lmi_server.api import tokenize as tokenize_routes
from lmi_server.api.errors import APIError
from lmi_server.api.openai import render
from lmi_server.api.openai import routes as openai_routes
from lmi_server.api.pooling import embeddings
from lmi_server.api.sagemaker import routes as sagemaker
from lmi_server.config.model_kind import ModelKind

INVOCATIONS = "/invocations"
GENERATION_PATHS = (
    ("/v1/chat/completions", "/v1/completions") + render.RENDER_PATHS + responses_routes.PATHS + anthropic_routes.PATHS
)
EMBEDDING_PATHS = ("/v1/embeddings", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")

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


def select(router: APIRouter, *, only: Iterable[str] | None = None, without: Iterable[str] = ()) -> APIRouter:
    """A router holding some of `router`'s routes (by path)."""
    only, without = (set(only) if only is not None else None), set(without)
    picked = APIRouter()
    picked.routes.extend(
        r for r in router.routes if (only is None or getattr(r, "path", None) in only) and getattr(r, "path", None) not in without
    )
    return picked


def refusals(kind: ModelKind, paths: Iterable[str], route_kind: str) -> APIRouter:
    """POST routes that answer 400: this model is of `kind`, the path serves `route_kind`."""
    router = APIRouter()
    message = (
        f"this model {DOES[kind.name]} ({kind.reason}); {{path}} needs {NEEDS[route_kind]}. "
        f"This model serves: {INSTEAD[kind.name]}"
    )

    for path in paths:
        shape = Shape.LMI if path == INVOCATIONS else Shape.OPENAI

        async def refuse(request: Request, _path: str = path, _shape: Shape = shape):
            begin(request, _shape)
            raise APIError(400, message.replace("{path}", _path))

        router.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)
    return router


def _generate(kind: ModelKind) -> list[APIRouter]:
    return [
        sagemaker.router, openai_routes.router, render.router, responses_routes.router, anthropic_routes.router,
        tokenize_routes.router, refusals(kind, EMBEDDING_PATHS, "embed"),
    ]


def _embed(kind: ModelKind) -> list[APIRouter]:
    return [_health(), embeddings.router, _models(), refusals(kind, GENERATION_PATHS, "generate")]


def _classify(kind: ModelKind) -> list[APIRouter]:
    return [
        _health(), _models(),
        refusals(kind, GENERATION_PATHS + (INVOCATIONS,), "generate"),
        refusals(kind, EMBEDDING_PATHS, "embed"),
    ]


def _health() -> APIRouter:
    return select(sagemaker.router, without=[INVOCATIONS])  # /ping, /health, /live: every kind


def _models() -> APIRouter:
    return select(openai_routes.router, only=["/v1/models"])


@dataclass(frozen=True)
class KindRoutes:
    routers: Callable[[ModelKind], list[APIRouter]]
    """The kind's routers, with refusals for the other kinds' paths."""
    request_bodies: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Bodies its routes read themselves, for /openapi.json (beyond the generation ones)."""


KINDS: dict[str, KindRoutes] = {
    "generate": KindRoutes(_generate, render.request_bodies),
    "embed": KindRoutes(_embed, embeddings.request_bodies),
    "classify": KindRoutes(_classify),
}


def install(app: FastAPI, kind: ModelKind) -> None:
    routes = KINDS[kind.name]
    for router in routes.routers(kind):
        app.include_router(router)
    app.state.ctx.request_bodies = routes.request_bodies
