"""GET /metrics: Prometheus' exposition of `lmi_server.metrics` (and vLLM's engine metrics)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from lmi_server.metrics import render

router = APIRouter()


@router.get("/metrics")
async def metrics() -> Response:
    # Collecting may scrape the cache server over HTTP (LMCacheCollector): off the event loop.
    body = await asyncio.to_thread(render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
