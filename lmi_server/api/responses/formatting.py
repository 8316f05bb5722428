"""An adapter's output formatter on the Responses API: it sees the same shape as on the chat route.

Why: formatters are written against vLLM's chat answer (`ChatCompletionResponse`, or each chunk
`'data: {"choices": [{"delta": ...}]}'` of a stream; lmi_server/adapters/formatters.py). vLLM's
Responses handler builds its own objects, which a formatter written for chat cannot read (`.choices`).
So the generated text of an answer is shown to the formatter as a chat answer, and what the
formatter made of it is put back where the Responses API carries that text:
- whole answers: the text of the `output_text` parts of the message items, joined, as one chat
  message; the edited content replaces them (in the first part, the others emptied);
- streams: each `response.output_text.delta` as one chat chunk; the edited delta is sent, and the
  events that repeat the text at the end (`output_text.done`, `content_part.done`,
  `output_item.done`, `response.completed`) carry the edited text the client already received.
A formatter that returns something else than what it got: a whole answer is sent as it returned
it (as on every route); inside a Responses stream there is no place for it, so the stream ends with
an error event naming the rule.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from lmi_server.adapters.formatters import FormatterError, Formatters


def _chat_view(text: str, model: str, response_id: str) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    choice = ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content=text), finish_reason="stop")
    return ChatCompletionResponse(id=response_id, model=model, choices=[choice], usage=UsageInfo())


def _text_parts(output: list[Any]) -> list[Any]:
    """The `output_text` parts of the message items, in order (objects or dicts)."""
    parts = []
    for item in output or []:
        if _get(item, "type") != "message":
            continue
        for part in _get(item, "content") or []:
            if _get(part, "type") == "output_text":
                parts.append(part)
    return parts


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _set(obj: Any, key: str, value: Any) -> None:
    if isinstance(obj, dict):
        obj[key] = value
    else:
        setattr(obj, key, value)


def format_whole(formatters: Formatters, response: Any) -> Any:
    """The Responses answer with its text through the formatter, or what the formatter returned
    instead of a chat answer (sent as it is)."""
    parts = _text_parts(getattr(response, "output", None))
    view = _chat_view("".join(_get(p, "text") or "" for p in parts), str(getattr(response, "model", "")),
                      str(getattr(response, "id", "")))
    edited = formatters.format_response(view)
    if not isinstance(edited, type(view)):
        return edited
    content = edited.choices[0].message.content if edited.choices else ""
    for i, part in enumerate(parts):
        _set(part, "text", (content or "") if i == 0 else "")
    return response


def _chunk(delta: str) -> str:
    return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": delta}}]}) + "\n\n"


def _edited_delta(formatters: Formatters, delta: str) -> str:
    value = formatters.format_response(_chunk(delta))
    if not (isinstance(value, str) and value.startswith("data:")):
        raise FormatterError(
            f"output formatter of {formatters.owner} returned {type(value).__name__} for a stream chunk; on "
            "/v1/responses a streaming formatter must return the 'data: {...}' chunk it got (edited)"
        )
    try:
        chunk = json.loads(value[len("data:"):].strip())
        return chunk["choices"][0]["delta"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise FormatterError(f"output formatter of {formatters.owner} returned a chunk without choices[0].delta") from None


class StreamFormatting:
    """One Responses stream's events (JSON) through the formatter; the edited text per part."""

    def __init__(self, formatters: Formatters):
        self.formatters = formatters
        self.texts: dict[tuple[Any, Any], str] = {}  # (item_id, content_index) -> text sent

    def _sent(self, item_id: Any, index: Any) -> str | None:
        return self.texts.get((item_id, index))

    def _fix_item(self, item: Any) -> None:
        for index, part in enumerate(_get(item, "content") or []):
            text = self._sent(_get(item, "id"), index)
            if _get(part, "type") == "output_text" and text is not None:
                part["text"] = text

    def event(self, event: dict) -> dict:
        kind = event.get("type")
        key = (event.get("item_id"), event.get("content_index"))
        if kind == "response.output_text.delta":
            event["delta"] = _edited_delta(self.formatters, event.get("delta") or "")
            self.texts[key] = self.texts.get(key, "") + event["delta"]
        elif kind == "response.output_text.done" and key in self.texts:
            event["text"] = self.texts[key]
        elif kind == "response.content_part.done" and key in self.texts and isinstance(event.get("part"), dict):
            event["part"]["text"] = self.texts[key]
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._fix_item(event["item"])
        elif kind in ("response.completed", "response.incomplete") and isinstance(event.get("response"), dict):
            for item in event["response"].get("output") or []:
                if isinstance(item, dict):
                    self._fix_item(item)
        return event


async def format_stream(formatters: Formatters, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """vLLM's Responses SSE events (`event: ...\\ndata: {...}\\n\\n`) with their text formatted;
    a formatter's failure raises FormatterError (the caller ends the stream with an error event)."""
    state = StreamFormatting(formatters)
    async for text in events:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("data:"):
                try:
                    event = json.loads(line[len("data:"):].strip())
                except ValueError:
                    continue
                if isinstance(event, dict):
                    lines[i] = "data: " + json.dumps(state.event(event), ensure_ascii=False)
        yield "\n".join(lines)
