"""SageMaker's front door: GET /ping, /health, /live and POST /invocations.

/invocations: the body is read, a session request answered (or the session checked), the model
directory's custom handler given the request first; anything left is generation, through the
pipeline, its schema detected (`schema.py`). Every error in LMI's flat body (TGI's route too).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lmi_server.api.body import read_json_body
from lmi_server.api.context import Shape, app_context, begin
from lmi_server.api.pipeline import serve
from lmi_server.api.sagemaker.custom_handler import run_custom_handler
from lmi_server.api.sagemaker.schema import invocations_parser

router = APIRouter()


@router.get("/ping")
@router.get("/health", include_in_schema=False)  # the name routers and load balancers probe
async def ping(request: Request):
    owner = app_context(request).owner
    state = owner.state
    if getattr(request.app.state, "draining", False):  # load balancers stop sending; in-flight finish
        return JSONResponse({"status": "draining", "detail": "shutting down"}, status_code=503)
    if state.healthy:
        degraded = getattr(owner.cache_server, "degraded", None)
        if degraded:  # the engine serves (recomputing KV); the cache tier is being restarted
            return JSONResponse({"status": "healthy", "degraded": degraded})
        return JSONResponse({"status": "healthy"})
    detail = {"starting": "loading the model", "recovering": state.error, "failed": state.error, "stopped": "shutting down"}.get(
        state.status, "engine not healthy"
    )
    if state.status == "ready":
        detail = "the engine has died: " + str(getattr(state.engine, "dead_error", "unknown error"))
    return JSONResponse({"status": state.status if state.status != "ready" else "unhealthy", "detail": detail}, status_code=503)


@router.get("/live", include_in_schema=False)
async def live():
    """Liveness for orchestrators: 200 while the process serves HTTP, starting, draining and
    rebuilding a dead engine included (/ping's 503 then means "send no new work", not "restart
    me"). A failed start, or an engine that keeps dying, ends the process itself
    (lifecycle.engine_watchdog)."""
    return JSONResponse({"status": "alive"})


@router.post("/invocations")
async def invocations(request: Request):
    """read -> session -> custom handler -> the pipeline (format in, schema, adapter, admission,
    vLLM, format out); every error in LMI's flat body."""
    app = app_context(request)
    tgi = app.config.server.tgi_compat  # TGI's shape: a list, or server-sent events
    ctx = begin(request, Shape.TGI if tgi else Shape.LMI)
    body = await read_json_body(request, app.config.server.max_request_bytes)
    session_headers = await app.sessions(request, body)
    if isinstance(session_headers, Response):
        return session_headers
    handler = getattr(app.model_formatters, "handler", None)
    if handler is not None:
        handled = await run_custom_handler(request, handler, ctx.raw_body)
        if handled is not None:
            return handled
    return await serve(request, invocations_parser(tgi), shape=ctx.shape, headers=session_headers, body=body)
