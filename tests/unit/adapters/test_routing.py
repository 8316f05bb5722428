"""Output formatting of JSON, SSE and jsonlines responses (pure functions)."""

from __future__ import annotations

import json

from lmi_server.adapters.routing import LineFormatter, format_json_body, format_jsonl_line, format_sse_line


def up(text, final):
    return text.upper() + ("!" if final else "")


def test_json_bodies():
    assert format_json_body({"generated_text": "ab"}, "lmi", up) == {"generated_text": "AB!"}
    assert format_json_body([{"generated_text": "a"}, {"generated_text": "b"}], "lmi", up) == [{"generated_text": "A!"}, {"generated_text": "B!"}]
    chat = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    assert format_json_body(chat, "chat", up)["choices"][0]["message"]["content"] == "HI!"
    comp = {"choices": [{"text": "x"}, {"text": "y"}]}
    assert [c["text"] for c in format_json_body(comp, "completion", up)["choices"]] == ["X!", "Y!"]


def test_sse_lines():
    line = "data: " + json.dumps({"choices": [{"delta": {"content": "ab"}}]})
    assert json.loads(format_sse_line(line, "chat", up)[6:])["choices"][0]["delta"]["content"] == "AB"
    line = "data: " + json.dumps({"choices": [{"text": "ab"}]})
    assert json.loads(format_sse_line(line, "completion", up)[6:])["choices"][0]["text"] == "AB"
    assert format_sse_line("data: [DONE]", "chat", up) == "data: [DONE]"
    assert format_sse_line("", "chat", up) == ""


def test_jsonl_lines():
    tok = json.dumps({"token": {"id": 1, "text": "ab"}, "generated_text": None})
    assert json.loads(format_jsonl_line(tok, up))["token"]["text"] == "AB"
    final = json.dumps({"token": None, "generated_text": "abc"})
    assert json.loads(format_jsonl_line(final, up))["generated_text"] == "ABC!"


def test_line_formatter_keeps_partial_lines():
    lf = LineFormatter("sse", "completion", up)
    event = "data: " + json.dumps({"choices": [{"text": "ab"}]}) + "\n\n"
    out = lf.feed(event[:10].encode(), last=False) + lf.feed(event[10:].encode(), last=False) + lf.feed(b"data: [DONE]\n\n", last=True)
    text = out.decode()
    assert '"AB"' in text and text.endswith("data: [DONE]\n\n")


def test_cache_salt_isolates_adapters_weights_and_clients():
    from types import SimpleNamespace

    from lmi_server.adapters.routing import STATE_KEY, apply_cache_salt, isolated_cache_salt

    assert isolated_cache_salt(None, None) is None  # base, no client salt: shared base KV
    a1 = isolated_cache_salt("lora:a:fp1", None)
    assert a1 and a1 != isolated_cache_salt("lora:a:fp2", None) != isolated_cache_salt("lora:b:fp1", None)
    assert isolated_cache_salt("lora:a:fp1", "client") not in (a1, isolated_cache_salt(None, "client"))
    # A base client cannot step into an adapter's namespace by sending its salt.
    assert isolated_cache_salt(None, a1) != a1
    assert len(a1) == 64 and all(c in "0123456789abcdef" for c in a1)

    entry = SimpleNamespace(cache_identity=lambda: "lora:a:fp1")
    req = SimpleNamespace(state=SimpleNamespace(**{STATE_KEY: SimpleNamespace(lease=SimpleNamespace(entry=entry))}))
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(req, parsed)
    assert parsed.cache_salt == a1
    base = SimpleNamespace(state=SimpleNamespace())
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(base, parsed)
    assert parsed.cache_salt is None


def _run_stream(fmt, chunks, limit=None):
    """AdapterMiddleware around a StreamingResponse of `chunks`; returns (messages, produced, closed)."""
    import asyncio

    from starlette.responses import StreamingResponse

    from lmi_server.adapters.formatters import Formatters
    from lmi_server.adapters.routing import STATE_KEY, STREAMS_KEY, AdapterMiddleware, AdapterUse

    produced, closed, messages = [], [], []

    async def gen():
        try:
            for c in chunks:
                produced.append(c)
                yield c
        finally:
            closed.append(True)

    async def app(scope, receive, send):
        scope["state"][STATE_KEY] = AdapterUse("a", "completion", False, None, Formatters(output=fmt, _out_arity=1), None, True)
        g = gen()
        scope["state"][STREAMS_KEY] = [g]
        await StreamingResponse(g, media_type="text/event-stream")(scope, receive, send)

    async def receive():
        await asyncio.Event().wait()

    async def send(message):
        messages.append((len(produced), message))

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "path": "/v1/completions", "headers": [], "state": {}}
    asyncio.run(AdapterMiddleware(app)(scope, receive, send))
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


def test_buffering_before_the_formatters_first_output_is_bounded():
    from lmi_server.adapters.routing import MAX_PENDING_BYTES

    chunks = ['data: {"choices": [{"text": ""}]}' + " " * 100 + "\n\n" for _ in range(3000)]  # no text: formatter not called
    messages, produced, _ = _run_stream(lambda t: t, chunks)
    started_after = next(n for n, m in messages if m["type"] == "http.response.start")
    assert started_after * len(chunks[0]) <= MAX_PENDING_BYTES + len(chunks[0])
    assert len(produced) == 3000
