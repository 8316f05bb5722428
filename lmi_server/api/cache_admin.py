"""POST /reset_prefix_cache: empty vLLM's prefix cache (the engine's own reusable KV blocks)
without a restart, through vLLM's `EngineClient.reset_prefix_cache` (the call behind vLLM's own
development route of the same name).

Why: an operator who measures (cold-cache latency) or who serves LMCache beside vLLM's prefix
cache wants the next requests to start cold here, without reloading the model; with LMCache on,
the cached tokens of the next request are then LMCache's hits alone. LMCache's own tiers are left
as they are. Behind the API key as every route that is not a health check (`api/routes.py`).

vLLM refuses the reset while running requests hold blocks: the route tries again for a moment
(a KV transfer that is finishing), then answers 409 saying so, never a 500.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmi_server.api.context import Shape, begin
from lmi_server.api.errors import APIError
from lmi_server.api.pipeline import engine_state

PATH = "/reset_prefix_cache"
TRIES, PAUSE_S = 20, 0.1  # about 2 s in all: a KV store that finishes, not a request that runs on
router = APIRouter()


@router.post(PATH)
async def reset_prefix_cache(request: Request):
    begin(request, Shape.OPENAI)
    state = engine_state(request)  # 503 with Retry-After while the engine loads or is rebuilt
    for attempt in range(TRIES):
        if await state.engine.reset_prefix_cache():
            return JSONResponse({"success": True})
        if attempt + 1 < TRIES:
            await asyncio.sleep(PAUSE_S)
    raise APIError(409, "vLLM's prefix cache was not reset: running requests hold KV blocks; try again once they end")
