"""`decode` / `encode` as LMI's examples call them: JSON bodies to Python values and back."""

from __future__ import annotations

import json
from typing import Any

from djl_python.inputs import Input


def decode(inputs: Input, content_type: str | None = None, key: str | None = None) -> Any:
    """The request body as Python: JSON (the default) decoded; text/plain as {"inputs": text}."""
    kind = (content_type or inputs.get_property("Content-Type") or "application/json").split(";")[0].strip().lower()
    if kind in ("text/plain", "text/csv"):
        return {"inputs": inputs.get_as_string(key)}
    if inputs.is_empty():
        return {}
    return inputs.get_as_json(key)


def encode(outputs: Any, value: Any, accept: str | None = None, key: str | None = None) -> Any:
    """Add `value` to an `Output` as JSON (LMI's signature: the output first)."""
    payload = value if isinstance(value, (bytes, str)) else json.dumps(value)
    if hasattr(outputs, "add"):
        outputs.add(payload, key)
        if hasattr(outputs, "add_property"):
            outputs.add_property("Content-Type", accept or "application/json")
    return outputs
