"""LMI's custom handler: a model directory's `async def handle(inputs: Input)` sees each
/invocations request first (as in LMI's vLLM async mode).

It gets a `djl_python.Input` (the body, the request's headers and the model's properties such as
`model_id` and `model_dir`); it returns an `Output` (LMI's `create_non_stream_output` /
`create_stream_chunk_output`, or one it filled itself), an async generator of them (streaming),
or None to let the server handle the request. A handler that raises is LMI's 424
`Custom handler failed: ...`.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from djl_python.async_utils import Chunk
from djl_python.inputs import Input
from djl_python.outputs import Output
from lmi_server.api.context import Shape, app_context
from lmi_server.api.errors import APIError

log = logging.getLogger(__name__)


def handler_properties(config: Any) -> dict[str, str]:
    """What LMI hands a handler as the model's properties: where the model is, and the engine's
    settings by name (scalars only), LMI's `tensor_parallel_degree` included."""
    engine_args = getattr(config, "engine_args", None) or {}
    props = {k: str(v) for k, v in engine_args.items() if isinstance(v, (str, int, float, bool))}
    props["model_id"] = str(config.model.path_or_id)
    props["model_dir"] = str(config.model_dir)
    props["tensor_parallel_degree"] = str(engine_args.get("tensor_parallel_size", 1))
    return props


def _body(item: Any) -> bytes:
    if isinstance(item, Chunk):
        return item.data.encode("utf-8")
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    return json.dumps(item, default=str).encode("utf-8")


def _error(output: Output) -> APIError | None:
    for _, item in output.content:
        if isinstance(item, Chunk) and (item.error or (item.code and item.code >= 400)):
            return APIError(item.code or 500, item.error or "the custom handler reported an error")
    if output.code >= 400:
        return APIError(output.code, output.message or "the custom handler reported an error")
    return None


def to_response(output: Output) -> Response:
    error = _error(output)
    if error is not None:
        raise error
    headers = {k: v for k, v in output.properties.items() if k.lower() != "content-type"}
    media = next((v for k, v in output.properties.items() if k.lower() == "content-type"), "application/json")
    body = b"".join(_body(item) for _, item in output.content)
    return Response(body, status_code=output.code, media_type=media, headers=headers)


async def _stream(outputs) -> Any:
    async for output in outputs:
        error = _error(output)
        if error is not None:
            yield (json.dumps(error.body(Shape.LMI)) + "\n").encode()
            return
        for _, item in output.content:
            yield _body(item)


async def run_custom_handler(request: Request, handler: Any, raw: bytes) -> Response | None:
    headers = {k: v for k, v in request.headers.items()}
    headers.setdefault("Content-Type", request.headers.get("content-type", "application/json"))
    inputs = Input(raw, {**app_context(request).handler_properties, **headers})
    try:
        result = handler(inputs)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # noqa: BLE001 - the script's own failure, reported as LMI does
        log.exception("custom handler failed")
        raise APIError(424, f"Custom handler failed: {type(exc).__name__}: {exc}") from None
    if result is None:
        return None
    if isinstance(result, Output):
        return to_response(result)
    if hasattr(result, "__aiter__"):
        return StreamingResponse(_stream(result), media_type="application/jsonlines")
    raise APIError(424, f"Custom handler failed: handle() returned {type(result).__name__}; return an Output or None")
