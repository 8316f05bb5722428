"""vLLM's engine and front-end arguments as this server reads them: the tables generated from the
pinned vLLM (`vllm_engine_args.json`, so config never imports vLLM) and the conversion of a
properties string to the type an argument wants."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

_EXAMPLES = {"int": "4096", "float": "0.9", "bool": "true", "json": '{"key": "value"}'}


@lru_cache(maxsize=1)
def _vllm_tables() -> dict[str, Any]:
    return json.loads(Path(__file__).with_name("vllm_engine_args.json").read_text())


def vllm_engine_arg_table() -> dict[str, dict[str, Any]]:
    return _vllm_tables()["args"]


def vllm_frontend_arg_table() -> dict[str, dict[str, Any]]:
    """vLLM `serve` front-end options (tool calling, chat template, request logging ...)."""
    return _vllm_tables()["frontend_args"]


def vllm_frontend_excluded() -> dict[str, str]:
    """vLLM front-end options that are not keys here, with the reason."""
    return _vllm_tables()["frontend_excluded"]


def coerce_engine_value(key: str, raw: str, desc: dict[str, Any]) -> Any:
    """Convert a properties string to the type vLLM's engine argument wants, or raise ValueError."""
    kind = desc["kind"]
    text = raw.strip()
    if desc.get("nullable") and text.lower() in ("none", "null"):
        return None
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected an integer") from None
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None
    if kind == "choice":
        for choice in desc["choices"]:
            if str(choice).lower() == text.lower():
                return choice
        raise ValueError("expected one of " + ", ".join(str(c) for c in desc["choices"]))
    if desc.get("known") and text not in desc["known"]:
        close = difflib.get_close_matches(text, desc["known"], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"unknown name; {hint}vLLM knows: {', '.join(desc['known'])}")
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
    return text


def example_value(key: str, desc: dict[str, Any]) -> str:
    if desc["kind"] == "choice":
        return f"option.{key}={desc['choices'][0]}"
    return f"option.{key}={_EXAMPLES.get(desc['kind'], 'VALUE')}"
