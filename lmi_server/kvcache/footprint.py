"""How many bytes of KV cache one token costs, read from a model's `config.json`.

The auto planner needs this number to turn GiB of RAM or disk into tokens. It is computed from
the config dict alone (no transformers, no torch), so `lmi-server config` and the unit tests can
run anywhere. Three attention shapes are told apart:

- standard / grouped-query attention: K and V per layer = 2 x KV heads x head dim values;
- multi-head latent attention (DeepSeek V2/V3, Kimi K2, ...): one compressed latent per layer
  (`kv_lora_rank` + `qk_rope_head_dim` values), not doubled and not split across heads;
- sliding-window layers: the engine keeps only the last `window` tokens of them, so their cost
  stops growing past the window (vLLM's hybrid allocator). LMCache's MP server stores every
  layer of every stored chunk (one object group unless `--separate-object-groups`), so the
  cache-side cost per token counts all layers in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# Sub-configs that hold the language model's numbers in multimodal configs.
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")


class ModelConfigError(ValueError):
    """The model's config.json lacks a number needed for the KV size; the message names it."""


@dataclass(frozen=True)
class KVFootprint:
    """KV cache cost of one token for one model, with the reason the number is what it is."""

    bytes_per_token: int
    """All layers in full: what LMCache stores per token, and the engine's cost while a
    sequence is shorter than every sliding window."""
    bytes_per_token_per_layer: int
    full_attention_layers: int
    sliding_window_layers: int
    sliding_window: int | None
    kv_heads: int | None
    """KV heads per layer (None for MLA, whose latent is shared by all heads)."""
    dtype_bytes: int
    is_mla: bool
    explanation: str

    @property
    def layers(self) -> int:
        return self.full_attention_layers + self.sliding_window_layers

    def engine_bytes_for_sequence(self, tokens: int) -> int:
        """Engine KV bytes for one sequence of `tokens` tokens (sliding layers stop at the window)."""
        window_tokens = tokens if self.sliding_window is None else min(tokens, self.sliding_window)
        return self.bytes_per_token_per_layer * (
            self.full_attention_layers * tokens + self.sliding_window_layers * window_tokens
        )

    def tp_shards(self, tensor_parallel: int) -> int:
        """Across how many GPUs one token's KV is split. GQA heads are split up to the KV head
        count (beyond it vLLM replicates heads); an MLA latent is replicated on every rank."""
        if self.is_mla or self.kv_heads is None:
            return 1
        return max(1, min(tensor_parallel, self.kv_heads))


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in _TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, Mapping) and "num_hidden_layers" in sub:
            merged = dict(config)
            merged.update(sub)
            return merged
    return config


def _require_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"config.json: `{key}` must be a positive integer, got {value!r}")
    return value


def dtype_bytes_of(config: Mapping[str, Any], kv_cache_dtype: str | None = None) -> tuple[int, str]:
    """Bytes per KV element: vLLM's `kv_cache_dtype` when set (not "auto"), else the model dtype."""
    if kv_cache_dtype and kv_cache_dtype != "auto":
        name = kv_cache_dtype
    else:
        name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    name = str(name).removeprefix("torch.").lower()
    if name not in DTYPE_BYTES:
        raise ModelConfigError(
            f"unknown KV dtype {name!r}; expected one of {sorted(DTYPE_BYTES)} (e.g. 'bfloat16')"
        )
    return DTYPE_BYTES[name], name


def _is_mla(config: Mapping[str, Any]) -> bool:
    return isinstance(config.get("kv_lora_rank"), int) and config.get("kv_lora_rank", 0) > 0


def _sliding_layers(config: Mapping[str, Any], layers: int) -> tuple[int, int | None, str]:
    """Count the sliding-window layers. Returns (count, window, how it was found)."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or window <= 0:
        return 0, None, "no sliding window"
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types[:layers] if t == "sliding_attention")
        return count, (window if count else None), f"{count} of {layers} layers are sliding_attention"
    if config.get("use_sliding_window") is False:
        # Qwen2-style configs carry a window they do not use.
        return 0, None, "sliding_window present but use_sliding_window is false"
    if "max_window_layers" in config and config.get("use_sliding_window"):
        # Qwen2: layers at index >= max_window_layers use the window.
        full = min(int(config["max_window_layers"]), layers)
        return layers - full, window, f"layers from max_window_layers={full} on use the window"
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        # Gemma-3 style: every pattern-th layer is global, the rest slide.
        count = layers - layers // pattern
        return count, window, f"sliding_window_pattern={pattern}: {count} of {layers} layers slide"
    return layers, window, "every layer uses the sliding window"


def kv_footprint(config: Mapping[str, Any], kv_cache_dtype: str | None = None) -> KVFootprint:
    """KV bytes per token from a `config.json` dict (see the module docstring for the forms)."""
    cfg = _text_config(config)
    layers = _require_int(cfg, "num_hidden_layers")
    dbytes, dname = dtype_bytes_of(cfg, kv_cache_dtype)

    if _is_mla(cfg):
        rank = _require_int(cfg, "kv_lora_rank")
        rope = _require_int(cfg, "qk_rope_head_dim")
        per_layer = (rank + rope) * dbytes
        total = per_layer * layers
        return KVFootprint(
            bytes_per_token=total,
            bytes_per_token_per_layer=per_layer,
            full_attention_layers=layers,
            sliding_window_layers=0,
            sliding_window=None,
            kv_heads=None,
            dtype_bytes=dbytes,
            is_mla=True,
            explanation=(
                f"MLA: {layers} layers x (kv_lora_rank {rank} + qk_rope_head_dim {rope}) x "
                f"{dbytes} B ({dname}) = {total:,} B per token (one latent per layer, not x2)"
            ),
        )

    heads = _require_int(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ModelConfigError(f"config.json: `num_key_value_heads` must be a positive integer, got {kv_heads!r}")
    head_dim = cfg.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        head_dim = _require_int(cfg, "hidden_size") // heads
    per_layer = 2 * kv_heads * head_dim * dbytes
    sliding, window, how = _sliding_layers(cfg, layers)
    total = per_layer * layers
    window_note = "" if not sliding else f"; {sliding} sliding-window layers (window {window}) cost the engine at most {window} tokens each ({how})"
    return KVFootprint(
        bytes_per_token=total,
        bytes_per_token_per_layer=per_layer,
        full_attention_layers=layers - sliding,
        sliding_window_layers=sliding,
        sliding_window=window,
        kv_heads=kv_heads,
        dtype_bytes=dbytes,
        is_mla=False,
        explanation=(
            f"2 (K,V) x {layers} layers x {kv_heads} KV heads x head_dim {head_dim} x {dbytes} B "
            f"({dname}) = {total:,} B per token{window_note}"
        ),
    )
