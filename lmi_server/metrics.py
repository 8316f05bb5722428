"""Prometheus metrics that vLLM does not already export, and the /metrics route.

vLLM registers its engine metrics (vllm:*) in the default registry of this process; this module
adds the HTTP layer's view: requests by route and status, latency, and time to first token as
the client sees it (first streamed chunk that carries generated text).
"""

from __future__ import annotations

import re
import time

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest

ROUTES = {
    "/invocations", "/ping", "/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics",
    "/adapters", "/sessions",
}

REQUESTS = Counter("lmi_requests", "HTTP requests by route and status", ["route", "status"])
LATENCY = Histogram(
    "lmi_request_latency_seconds",
    "Time from request arrival to the last byte of the response",
    ["route"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
TTFT = Histogram(
    "lmi_time_to_first_token_seconds",
    "Streaming responses: time from request arrival to the first chunk carrying generated text",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# A streamed chunk carries text when an OpenAI delta/choice or an LMI token has non-empty text.
_TOKEN_CHUNK = re.compile(rb'"(?:content|text)":\s*"[^"]')

router = APIRouter()


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    for prefix in ("/adapters", "/models", "/sessions"):
        if path.startswith(prefix):
            return prefix
    return "other"


class MetricsMiddleware:
    """Pure ASGI middleware (works with streaming and client disconnects)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = route_label(scope["path"])
        start = time.perf_counter()
        status = {"code": 500, "streaming": False, "first": False}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-type" and (b"event-stream" in value or b"jsonlines" in value):
                        status["streaming"] = True
            elif message["type"] == "http.response.body" and status["streaming"] and not status["first"]:
                if _TOKEN_CHUNK.search(message.get("body", b"")):
                    status["first"] = True
                    TTFT.labels(route).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            REQUESTS.labels(route, str(status["code"])).inc()
            LATENCY.labels(route).observe(time.perf_counter() - start)
