"""The one route table: every path the server answers, read by every user of routes.

A row says: the path (Starlette's template), its methods, the label its requests are counted under
in /metrics (`lmi_server/metrics.py`), the front door whose router serves it (`router`), the model
kinds that serve it (`api/kinds.py` mounts it for those and answers a 400 refusal for the others),
whether it is open without an API key (`api/auth.py`) and whether it is in the OpenAPI document
(`api/openapi.py`). A unit test walks the app's routes against this table both ways.

A new front door adds its rows here with its router's name, and registers that router in
`api/kinds.py` (`ROUTERS`); rows whose router is not registered are not mounted (and not refused).
No imports from the rest of the package: metrics and auth read this module at import time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

GENERATE, EMBED, CLASSIFY = "generate", "embed", "classify"
ALL_KINDS = frozenset({GENERATE, EMBED, CLASSIFY})
OTHER = "other"  # the label of a path no route serves (404s): bounded, whatever clients send


@dataclass(frozen=True)
class Route:
    path: str
    methods: tuple[str, ...]
    router: str
    """The front door that serves it: a key of api/kinds.ROUTERS ("fastapi": FastAPI's own)."""
    kinds: frozenset[str] = ALL_KINDS
    public: bool = False
    """Served without an API key (health checks)."""
    documented: bool = True
    """In /openapi.json."""
    label: str = ""
    """The route's label in /metrics; its path unless given."""

    @property
    def metric_label(self) -> str:
        return self.label or self.path


def _gen(path: str, router: str, methods: tuple[str, ...] = ("POST",), **kw) -> Route:
    return Route(path, methods, router, frozenset({GENERATE}), **kw)


def _embed(path: str, **kw) -> Route:
    return Route(path, ("POST",), "pooling", frozenset({EMBED}), **kw)


def _adapters(base: str) -> list[Route]:
    return [
        Route(base, ("GET", "POST"), "adapters"),
        Route(base + "/{name}", ("GET", "DELETE"), "adapters"),
        Route(base + "/{name}/update", ("POST",), "adapters"),
    ]


ROUTES: tuple[Route, ...] = (
    # FastAPI's own documentation routes
    Route("/openapi.json", ("GET", "HEAD"), "fastapi", documented=False),
    Route("/docs", ("GET", "HEAD"), "fastapi", documented=False),
    Route("/docs/oauth2-redirect", ("GET", "HEAD"), "fastapi", documented=False),
    Route("/redoc", ("GET", "HEAD"), "fastapi", documented=False),
    # SageMaker: health for every kind; /invocations generates or embeds by the model's kind
    Route("/ping", ("GET",), "sagemaker", public=True),
    Route("/health", ("GET",), "sagemaker", public=True, documented=False),
    Route("/live", ("GET",), "sagemaker", public=True, documented=False),
    _gen("/invocations", "sagemaker"),
    _embed("/invocations"),
    # OpenAI
    _gen("/v1/chat/completions", "openai"),
    _gen("/v1/completions", "openai"),
    Route("/v1/models", ("GET",), "openai"),
    _gen("/v1/chat/completions/render", "render"),
    _gen("/v1/completions/render", "render"),
    # OpenAI Responses, Anthropic Messages, vLLM's tokenizer
    _gen("/v1/responses", "responses"),
    _gen("/v1/responses/{response_id}", "responses", ("GET",)),
    _gen("/v1/responses/{response_id}/cancel", "responses"),
    _gen("/v1/messages", "anthropic"),
    _gen("/v1/messages/count_tokens", "anthropic"),
    _gen("/tokenize", "tokenize"),
    _gen("/detokenize", "tokenize"),
    # pooling (embedding models)
    _embed("/v1/embeddings"),
    _embed("/score"),
    _embed("/v1/score"),
    _embed("/rerank"),
    _embed("/v1/rerank"),
    _embed("/v2/rerank"),
    # the server's own
    Route("/metrics", ("GET",), "metrics"),
    Route("/reset_prefix_cache", ("POST",), "cache_admin"),
    *_adapters("/adapters"),
    *_adapters("/models/{model}/adapters"),
)


def rows(router: str | None = None, kind: str | None = None) -> list[Route]:
    """The rows of one router and/or served by one kind."""
    return [r for r in ROUTES if (router is None or r.router == router) and (kind is None or kind in r.kinds)]


def public_paths() -> frozenset[str]:
    return frozenset(r.path for r in ROUTES if r.public)


def refused_paths(kind: str, routers: set[str]) -> dict[str, frozenset[str]]:
    """POST paths of the registered `routers` that no row serves for `kind`: path -> the kinds
    that serve it (the refusal tells the client which model it needs)."""
    served = {r.path for r in ROUTES if kind in r.kinds}
    out: dict[str, set[str]] = {}
    for r in ROUTES:
        if r.router in routers and "POST" in r.methods and r.path not in served:
            out.setdefault(r.path, set()).update(r.kinds)
    return {path: frozenset(kinds) for path, kinds in out.items()}


@cache
def _matchers() -> tuple[dict[str, str], tuple[tuple[re.Pattern, str], ...]]:
    exact = {r.path: r.metric_label for r in ROUTES if "{" not in r.path}
    templated = tuple(
        (re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", r.path) + "$"), r.metric_label)
        for r in ROUTES if "{" in r.path
    )
    return exact, templated


def label_for(path: str) -> str:
    """The metric label of a request path: its route's label, or "other"."""
    exact, templated = _matchers()
    if path in exact:
        return exact[path]
    for pattern, label in templated:
        if pattern.match(path):
            return label
    return OTHER
