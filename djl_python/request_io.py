"""Request types that LMI's examples subclass or annotate with (kept for imports to resolve)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class RequestInput:
    request_id: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    output_formatter: str | Callable | None = None


@dataclass
class TextInput(RequestInput):
    input_text: str = ""
    input_ids: list[int] = field(default_factory=list)
    adapters: Any = None
    tokenizer: Any = None
