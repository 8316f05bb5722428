"""The helpers LMI's custom `handle()` examples build their responses with.

`create_non_stream_output(data, error=..., code=...)` and `create_stream_chunk_output(...)` give an
`Output` whose one item is a `Chunk`: the data as text (JSON for a dict), whether it is the last,
and an error with its status. The server turns a returned `Output` (or an async generator of them)
into the HTTP response: an error becomes LMI's flat `{"error": ..., "code": ...}` body with that
status; streamed chunks are sent as they come (jsonlines).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from djl_python.outputs import Output


@dataclass
class Chunk:
    data: str
    last: bool
    content_type: str
    error: str | None = None
    code: int | None = None


def _output(data: str | dict, last: bool, content_type: str, properties: dict | None, error: str | None, code: int | None) -> Output:
    text = json.dumps(data, ensure_ascii=False) if isinstance(data, (dict, list)) else str(data)
    out = Output()
    out.add_property("Content-Type", content_type)
    for key, value in (properties or {}).items():
        out.add_property(key, value)
    if error or code:
        out.set_code(int(code or 500))
        if error:
            out.set_message(error)
    out.add(Chunk(text + "\n", last, content_type, error, int(code) if code else None))
    return out


def create_non_stream_output(data: str | dict, properties: dict | None = None, error: str | None = None,
                             code: int | None = None) -> Output:
    return _output(data, True, "application/json", properties, error, code)


def create_stream_chunk_output(data: str | dict, last_chunk: bool, error: str | None = None, code: int | None = None) -> Output:
    return _output(data, last_chunk, "application/jsonlines", None, error, code)


async def handle_streaming_response(response: AsyncGenerator[str, None], stream_output_formatter: Callable,
                                    accumulate_chunks: bool = False, **kwargs: Any) -> AsyncGenerator[Output, None]:
    """Strings from `response` through `stream_output_formatter` (returning `(data, last)`, or
    `(data, last, history)` with `accumulate_chunks`), as stream chunk outputs; a formatter that
    fails ends the stream with a 424 chunk."""
    history: list[str] = []
    async for chunk in response:
        try:
            if accumulate_chunks:
                data, last, history = stream_output_formatter(chunk, history=history, **kwargs)
            else:
                data, last = stream_output_formatter(chunk, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported in the stream, as LMI does
            yield create_stream_chunk_output("", True, error=str(exc), code=424)
            return
        yield create_stream_chunk_output(data, last)
        if last:
            return
