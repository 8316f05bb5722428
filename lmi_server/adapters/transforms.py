"""Pure text transforms of the adapter path (no HTTP): the KV-isolation salt, and the output
formatter applied to the generated text of a JSON body, an SSE line or a jsonlines line.
`LineFormatter` splits streamed chunks into lines and keeps the partial tail.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable


def isolated_cache_salt(identity: str | None, client_salt: str | None) -> str | None:
    """The `cache_salt` vLLM and LMCache key reused KV by (LMCache keys chunks by token ids and
    salt only). KV computed under an adapter carries its identity (name + weight fingerprint),
    so only requests through the same adapter with the same weights reuse it; base requests
    without a salt stay unsalted. A client's own salt is folded in (never passed through as is,
    so no client can pick another namespace's salt)."""
    if identity is None and not client_salt:
        return None
    digest = hashlib.sha256()
    digest.update((identity or "base").encode())
    digest.update(b"\0")
    digest.update((client_salt or "").encode())
    return digest.hexdigest()


def format_json_body(obj: Any, schema: str, fmt: Callable[[str, bool], str]) -> Any:
    """Apply fmt(text, final=True) to the generated text of a non-streaming response."""
    if schema == "lmi":
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("generated_text"), str):
                item["generated_text"] = fmt(item["generated_text"], True)
        return obj
    for choice in obj.get("choices", []) if isinstance(obj, dict) else []:
        if schema == "chat":
            msg = choice.get("message") or {}
            if isinstance(msg.get("content"), str):
                msg["content"] = fmt(msg["content"], True)
        elif isinstance(choice.get("text"), str):
            choice["text"] = fmt(choice["text"], True)
    return obj


def format_sse_line(line: str, schema: str, fmt: Callable[[str, bool], str]) -> str:
    if not line.startswith("data: "):
        return line
    data = line[len("data: "):].strip()
    if not data or data == "[DONE]":
        return line
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return line
    changed = False
    for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
        if schema == "chat":
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                delta["content"] = fmt(delta["content"], False)
                changed = True
        elif isinstance(choice.get("text"), str) and choice["text"]:
            choice["text"] = fmt(choice["text"], False)
            changed = True
    return "data: " + json.dumps(chunk) if changed else line


def format_jsonl_line(line: str, fmt: Callable[[str, bool], str]) -> str:
    if not line.strip():
        return line
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(obj, dict):
        return line
    token = obj.get("token")
    if isinstance(token, dict) and isinstance(token.get("text"), str) and token["text"]:
        token["text"] = fmt(token["text"], False)
    if isinstance(obj.get("generated_text"), str):
        obj["generated_text"] = fmt(obj["generated_text"], True)
    return json.dumps(obj)


class LineFormatter:
    """Streaming: split body chunks into lines, format complete lines, keep the partial tail."""

    def __init__(self, kind: str, schema: str, fmt: Callable[[str, bool], str]):
        self.kind = kind
        self.schema = schema
        self.called = False  # whether the formatter has run yet (the response start waits for it)
        self._tail = ""

        def counted(text: str, final: bool) -> str:
            self.called = True
            return fmt(text, final)

        self.fmt = counted

    def feed(self, data: bytes, last: bool) -> bytes:
        text = self._tail + data.decode("utf-8", errors="surrogateescape")
        lines = text.split("\n")
        self._tail = "" if last else lines.pop()
        out = []
        for line in lines:
            if self.kind == "sse":
                out.append(format_sse_line(line, self.schema, self.fmt))
            else:
                out.append(format_jsonl_line(line, self.fmt))
        result = "\n".join(out)
        if not last and lines:
            result += "\n"
        elif last and self._tail:
            result += self._tail
        return result.encode("utf-8", errors="surrogateescape")
