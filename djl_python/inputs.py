"""`Input`: one request as LMI hands it to Python code (body bytes plus properties such as headers)."""

from __future__ import annotations

import json
from typing import Any


class Input:
    """A request body with its properties (`Content-Type` and the other headers)."""

    def __init__(self, content: bytes | str | None = None, properties: dict[str, str] | None = None):
        self._content = content.encode("utf-8") if isinstance(content, str) else (content or b"")
        self._properties = {str(k): str(v) for k, v in (properties or {}).items()}

    def get_as_bytes(self, key: str | None = None) -> bytes:
        return self._content

    def get_as_string(self, key: str | None = None) -> str:
        return self._content.decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self._content)

    def get_property(self, key: str) -> str | None:
        wanted = key.lower()
        return next((v for k, v in self._properties.items() if k.lower() == wanted), None)

    def get_properties(self) -> dict[str, str]:
        return dict(self._properties)

    def contains_key(self, key: str) -> bool:
        return key == "data" and bool(self._content)

    def is_empty(self) -> bool:
        return not self._content

    def get_batches(self) -> list["Input"]:
        return [self]
