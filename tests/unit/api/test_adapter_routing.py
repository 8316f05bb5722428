"""The adapter path in the API: KV salt per adapter, output formatting where the response is made
(JSON, SSE, jsonlines), 424 before a stream starts, an error event mid-stream, bounded buffering,
generators closed (engine request aborted) and the lease released."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from starlette.responses import StreamingResponse

from lmi_server.adapters.formatters import Formatters
from lmi_server.adapters.transforms import isolated_cache_salt
from lmi_server.api.adapter_routing import (
    MAX_PENDING_BYTES,
    STATE_KEY,
    STREAMS_KEY,
    AdapterLeaseMiddleware,
    AdapterUse,
    apply_cache_salt,
    format_json,
    format_stream,
)
from lmi_server.api.errors import APIError


def test_cache_salt_follows_the_requests_adapter():
    entry = SimpleNamespace(cache_identity=lambda: "lora:a:fp1")
    req = SimpleNamespace(state=SimpleNamespace(**{STATE_KEY: SimpleNamespace(lease=SimpleNamespace(entry=entry))}))
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(req, parsed)
    assert parsed.cache_salt == isolated_cache_salt("lora:a:fp1", None)
    base = SimpleNamespace(state=SimpleNamespace())
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(base, parsed)
    assert parsed.cache_salt is None


def _request(fmt, schema="completion", lmi=False, lease=None):
    use = AdapterUse("a", schema, lmi, lease, Formatters(output=fmt, _out_arity=1), None, True)
    return SimpleNamespace(scope={"state": {STATE_KEY: use}})


def test_json_bodies_are_formatted_and_a_failing_formatter_is_424():
    request = _request(lambda t: t.upper(), schema="lmi", lmi=True)
    assert format_json(request, {"generated_text": "ab"}) == {"generated_text": "AB"}

    def boom(text):
        raise ValueError("nope")

    with pytest.raises(APIError) as err:
        format_json(_request(boom, schema="lmi", lmi=True), {"generated_text": "ab"})
    assert err.value.status == 424 and err.value.body() == {"error": err.value.message, "code": 424}
    # no adapter (or no output formatter): the body is untouched
    assert format_json(SimpleNamespace(scope={"state": {}}), {"x": 1}) == {"x": 1}


def _run_stream(fmt, chunks, kind="sse"):
    """format_stream + StreamingResponse over `chunks`; returns (messages, produced, closed)."""
    produced, closed, messages = [], [], []

    async def gen():
        try:
            for c in chunks:
                produced.append(c)
                yield c
        finally:
            closed.append(True)

    async def receive():
        await asyncio.Event().wait()

    async def send(message):
        messages.append((len(produced), message))

    async def main():
        request = _request(fmt)
        g = gen()
        request.scope["state"][STREAMS_KEY] = [g]
        body = await format_stream(request, g, kind)
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "path": "/v1/completions", "headers": []}
        await StreamingResponse(body, media_type="text/event-stream")(scope, receive, send)

    asyncio.run(main())
    return messages, produced, closed


def test_formatter_raising_mid_stream_ends_with_an_sse_error_and_closes_the_generator():
    calls = []

    def fmt(text):
        calls.append(text)
        if len(calls) > 3:
            raise ValueError("boom")
        return text.upper()

    chunks = [f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n' for i in range(1000)]
    messages, produced, closed = _run_stream(fmt, chunks)
    bodies = b"".join(m.get("body", b"") for _, m in messages if m["type"] == "http.response.body").decode()
    assert messages[0][1]["status"] == 200 and '"T0"' in bodies
    last = bodies.strip().splitlines()[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == 424 and "boom" in last
    assert closed and len(produced) < 10  # generation stopped, not drained to the end


def test_jsonlines_stream_error_is_a_jsonlines_line():
    def fmt(text):
        if text == "t2":
            raise ValueError("boom")
        return text

    chunks = [json.dumps({"token": {"id": i, "text": f"t{i}"}, "generated_text": None}) + "\n" for i in range(100)]
    messages, produced, closed = _run_stream(fmt, chunks, kind="jsonl")
    lines = b"".join(m.get("body", b"") for _, m in messages if m["type"] == "http.response.body").decode().splitlines()
    assert json.loads(lines[-1]) == {"error": json.loads(lines[-1])["error"], "code": 424} and "boom" in lines[-1]
    assert closed and len(produced) < 10


def test_formatter_failing_on_the_first_text_is_a_424_before_the_response_starts():
    def fmt(text):
        raise ValueError("refused")

    with pytest.raises(APIError) as err:
        _run_stream(fmt, ['data: {"choices": [{"text": "a"}]}\n\n'] * 100)
    assert err.value.status == 424 and "refused" in err.value.message


def test_buffering_before_the_formatters_first_output_is_bounded():
    chunks = ['data: {"choices": [{"text": ""}]}' + " " * 100 + "\n\n" for _ in range(3000)]  # no text: formatter not called
    messages, produced, _ = _run_stream(lambda t: t, chunks)
    started_after = next(n for n, m in messages if m["type"] == "http.response.start")
    assert started_after * len(chunks[0]) <= MAX_PENDING_BYTES + len(chunks[0])
    assert len(produced) == 3000


def test_the_lease_is_released_when_the_response_fails():
    released = []
    lease = SimpleNamespace(release=lambda: asyncio.sleep(0, released.append(True)))

    async def app(scope, receive, send):
        scope["state"][STATE_KEY] = AdapterUse("a", "chat", False, lease, Formatters(), None)
        raise RuntimeError("the route failed")

    scope = {"type": "http", "state": {}}
    with pytest.raises(RuntimeError):
        asyncio.run(AdapterLeaseMiddleware(app)(scope, None, None))
    assert released == [True]
