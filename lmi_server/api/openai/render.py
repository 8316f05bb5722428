"""vLLM's render API: /v1/chat/completions/render and /v1/completions/render answer the token ids
(and sampling parameters) a chat or completion request would be generated from, without generating.

A router in front of the replicas (vllm-router's kv_aware policy) asks for them to match a prompt
against the KV blocks each replica holds. The work is vLLM's: its route functions
(`vllm/entrypoints/scale_out/render/api_router.py`) and its `ServingRender`, which vLLM's
`init_app_state` builds for a generating model. Here the body goes through the pipeline's first
stages (size limit, 503 before the engine is ready, LMI's input formatter, content parts and media
checked, `"model": "lmi"`), and the handler of the running engine is handed to vLLM's route
function. The API-key middleware covers these paths as it covers every path but the health checks.
Rendering takes no engine slot: it tokenizes, it does not generate.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api.context import Shape, begin
from lmi_server.api.openai.routes import chat_request_type, completion_request_type, parse_request
from lmi_server.api.pipeline import call_serving, check_request, read_checked

CHAT_RENDER = "/v1/chat/completions/render"
COMPLETION_RENDER = "/v1/completions/render"
RENDER_PATHS = (CHAT_RENDER, COMPLETION_RENDER)

router = APIRouter()


async def _render(request: Request, request_type: Any, route: Any):
    begin(request, Shape.OPENAI)
    body, state = await read_checked(request, generates=False)  # 503 until the engine is ready
    parsed = parse_request(request_type, body)
    await check_request(request, parsed, state, generates=False)  # as on /v1/chat/completions: a 400, not vLLM's 500
    # vLLM's route functions read the handler from the app's state: the running engine's.
    request.app.state.serving_render = getattr(state.serving, "serving_render", None)
    return await call_serving(route(parsed, request), request)


@router.post(CHAT_RENDER)
async def render_chat_completion(request: Request):
    from vllm.entrypoints.scale_out.render import api_router as vllm_render

    return await _render(request, chat_request_type(), vllm_render.render_chat_completion)


@router.post(COMPLETION_RENDER)
async def render_completion(request: Request):
    from vllm.entrypoints.scale_out.render import api_router as vllm_render

    return await _render(request, completion_request_type(), vllm_render.render_completion)


def request_bodies(components: dict[str, Any]) -> dict[str, Any]:
    """The render routes take the chat and completion request bodies (for /openapi.json)."""
    from lmi_server.api.openapi import _schema_of

    return {
        CHAT_RENDER: _schema_of(chat_request_type(), components),
        COMPLETION_RENDER: _schema_of(completion_request_type(), components),
    }
