"""An output formatter written for the chat answer, on the Responses API's answers and streams."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from lmi_server.adapters.formatters import FormatterError, Formatters
from lmi_server.api.responses.formatting import format_stream, format_whole


def shout(response):
    if isinstance(response, str):
        chunk = json.loads(response[len("data:"):])
        for choice in chunk["choices"]:
            choice["delta"]["content"] = choice["delta"]["content"].upper()
        return "data: " + json.dumps(chunk) + "\n\n"
    for choice in response.choices:
        choice.message.content = choice.message.content.upper()
    return response


SHOUTER = Formatters(response_output=shout, owner="adapter 'shouter'")


def _response():
    """The parts of vLLM's ResponsesResponse the formatting reads (objects, as vLLM builds them)."""
    part = lambda text: SimpleNamespace(type="output_text", text=text)  # noqa: E731
    message = SimpleNamespace(type="message", content=[part("hello "), part("world")])
    reasoning = SimpleNamespace(type="reasoning", content=[part("not shown")])
    return SimpleNamespace(id="resp_1", model="shouter", output=[reasoning, message])


def test_a_whole_answer_shows_its_text_as_a_chat_answer_and_takes_the_edit_back():
    out = format_whole(SHOUTER, _response())
    texts = [p.text for p in out.output[1].content]
    assert out.output[0].content[0].text == "not shown"  # only the message's text is the answer's
    assert texts == ["HELLO WORLD", ""]


def test_a_formatter_returning_something_else_is_sent_as_it_returned_it():
    as_is = Formatters(response_output=lambda r: {"answer": r.choices[0].message.content}, owner="x")
    assert format_whole(as_is, _response()) == {"answer": "hello world"}


def _events(*events: dict) -> list[str]:
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]


async def _collect(formatters, events):
    async def source():
        for e in events:
            yield e

    return [json.loads(t.split("data: ", 1)[1]) async for t in format_stream(formatters, source())]


def test_a_stream_edits_each_delta_and_the_events_that_repeat_the_text():
    key = {"item_id": "m1", "content_index": 0}
    item = {"id": "m1", "type": "message", "content": [{"type": "output_text", "text": "ab"}]}
    out = asyncio.run(_collect(SHOUTER, _events(
        {"type": "response.output_text.delta", "delta": "a", **key},
        {"type": "response.output_text.delta", "delta": "b", **key},
        {"type": "response.output_text.done", "text": "ab", **key},
        {"type": "response.content_part.done", "part": {"type": "output_text", "text": "ab"}, **key},
        {"type": "response.output_item.done", "item": item},
        {"type": "response.completed", "response": {"output": [item]}},
    )))
    assert [e.get("delta") for e in out[:2]] == ["A", "B"]
    assert out[2]["text"] == "AB" and out[3]["part"]["text"] == "AB"
    assert out[4]["item"]["content"][0]["text"] == "AB"
    assert out[5]["response"]["output"][0]["content"][0]["text"] == "AB"


def test_a_streaming_formatter_that_returns_no_chunk_is_a_formatter_error_naming_the_rule():
    as_is = Formatters(response_output=lambda r: {"x": 1}, owner="adapter 'odd'")
    with pytest.raises(FormatterError, match="must return the 'data"):
        asyncio.run(_collect(as_is, _events({"type": "response.output_text.delta", "delta": "a", "item_id": "m", "content_index": 0})))
