"""Reading request bodies: size limit (413) and JSON syntax (400) checked in one place."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from lmi_server.api.context import request_context
from lmi_server.api.errors import APIError

# Deeper JSON than this is refused (400) before anything walks it recursively (pydantic, vLLM's
# validators, json.dumps): Python's recursion limit would otherwise turn it into a 500.
MAX_JSON_DEPTH = 64


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Iterative (no recursion): True when containers nest deeper than `limit`."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


async def read_json_body(request: Request, max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes (option.max_request_bytes)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"request body exceeds the limit of {max_bytes} bytes (option.max_request_bytes)")
        chunks.append(chunk)
    raw = b"".join(chunks)
    request_context(request).raw_body = raw  # LMI's custom handler gets the bytes
    if not raw.strip():
        raise APIError(400, "request body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        data = None
        too_deep = True
    else:
        too_deep = json_depth_exceeds(data)
    if too_deep:
        raise APIError(400, f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    return data
