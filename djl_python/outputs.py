"""`Output`: what LMI's Python code returns; here a plain container for code that builds one."""

from __future__ import annotations

import json
from typing import Any


class Output:
    def __init__(self, code: int = 200, message: str = "OK"):
        self.code = code
        self.message = message
        self.properties: dict[str, str] = {}
        self.content: list[tuple[str | None, Any]] = []

    def set_code(self, code: int) -> "Output":
        self.code = code
        return self

    def set_message(self, message: str) -> "Output":
        self.message = message
        return self

    def add_property(self, key: str, value: str) -> "Output":
        self.properties[key] = value
        return self

    def add(self, value: Any, key: str | None = None) -> "Output":
        self.content.append((key, value))
        return self

    def add_as_json(self, value: Any, key: str | None = None) -> "Output":
        return self.add(json.dumps(value), key)
