"""Facts read from the model's own files and the engine arguments: its config.json, the KV
dtype, max_model_len, one sequence's KV bytes. Shared by the planning steps of `resolve`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmi_server.kvcache.footprint import kv_footprint


def model_config(model_path: str) -> tuple[Path | None, dict[str, Any] | None]:
    """The model directory and its config.json, when the model is a local directory."""
    path = Path(model_path)
    if (path / "config.json").is_file():
        return path, json.loads((path / "config.json").read_text())
    return None, None


def kv_dtype(engine_args: dict[str, Any]) -> str | None:
    """The KV cache's dtype: kv_cache_dtype when set, else the engine's dtype (the KV follows it:
    fp32 on CPUs without bf16); None for the model's own."""
    for key in ("kv_cache_dtype", "dtype"):
        value = engine_args.get(key)
        if value and value != "auto":
            return str(value)
    return None


def max_model_len(model_config: dict[str, Any] | None, engine_args: dict[str, Any]) -> int:
    """The engine's max_model_len: as set, else the model's max_position_embeddings, else 4096."""
    return int(engine_args.get("max_model_len") or (model_config or {}).get("max_position_embeddings") or 4096)


def longest_sequence_kv_bytes(model_config: dict[str, Any] | None, engine_args: dict[str, Any]) -> int | None:
    """KV bytes of one max_model_len sequence (all layers), or None when the model is not local
    or its config is not one the footprint knows."""
    if model_config is None:
        return None
    try:
        fp = kv_footprint(model_config, kv_dtype(engine_args))
    except (KeyError, TypeError, ValueError):
        return None
    return max_model_len(model_config, engine_args) * fp.bytes_per_token
