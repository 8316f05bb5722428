"""Output formatting of JSON, SSE and jsonlines responses and the KV-isolation salt (pure functions)."""

from __future__ import annotations

import json

from lmi_server.adapters.transforms import LineFormatter, format_json_body, format_jsonl_line, format_sse_line, isolated_cache_salt


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
    assert isolated_cache_salt(None, None) is None  # base, no client salt: shared base KV
    a1 = isolated_cache_salt("lora:a:fp1", None)
    assert a1 and a1 != isolated_cache_salt("lora:a:fp2", None) != isolated_cache_salt("lora:b:fp1", None)
    assert isolated_cache_salt("lora:a:fp1", "client") not in (a1, isolated_cache_salt(None, "client"))
    # A base client cannot step into an adapter's namespace by sending its salt.
    assert isolated_cache_salt(None, a1) != a1
    assert len(a1) == 64 and all(c in "0123456789abcdef" for c in a1)
