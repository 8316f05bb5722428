"""What the engine's own configuration check would refuse, found before the engine starts.

Why: `lmi-server config` is a dry run; a setting it accepts and `serve` then dies on (after
minutes of loading) is the worst kind of error. These checks mirror vLLM 0.32's rules for the
settings a user of this server writes (`option.max_model_len`, LMCache's `chunk_size`), from the
model's config.json alone, and err on the side of letting vLLM decide when unsure.
"""

from __future__ import annotations

import os
from typing import Any

# The keys vLLM reads the model's context length from (the smallest present wins).
MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
    "model_max_length", "max_sequence_length", "max_seq_length", "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length (vLLM does not multiply).
UNSCALED_ROPE_TYPES = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default"}
# vLLM's default KV block size: 128 tokens on CPU hosts, 16 on GPUs.
DEFAULT_BLOCK_SIZE = {"cpu": 128, "gpu": 16}


def model_context_length(model_config: dict[str, Any]) -> tuple[int, str] | None:
    """The longest sequence the model's config allows, as vLLM derives it, with the key that said
    so; None when the config names none (vLLM then takes what the user sets)."""
    cfg = model_config
    found = [(cfg[k], k) for k in MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool)]
    if not found and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
        found = [(cfg[k], k) for k in MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool)]
    if not found:
        return None
    length, key = min(found)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(scaling, dict) and "gemma3" not in str(cfg.get("model_type", "")):
        rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
        factor = scaling.get("factor")
        if rope_type not in UNSCALED_ROPE_TYPES and isinstance(factor, (int, float)) and factor > 0:
            return int(length * factor), f"{key}={int(length):,} x rope factor {factor:g}"
    return int(length), f"{key}={int(length):,}"


def check_max_model_len(engine_args: dict[str, Any], model_config: dict[str, Any] | None) -> str | None:
    """The problem with option.max_model_len, or None."""
    wanted = engine_args.get("max_model_len")
    if not wanted or model_config is None or int(wanted) == -1:
        return None
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        return None
    limit = model_context_length(model_config)
    if limit is None or int(wanted) <= limit[0]:
        return None
    model_max = model_config.get("model_max_length")
    if isinstance(model_max, int) and int(wanted) <= model_max:
        return None
    return (
        f"option.max_model_len={int(wanted)}: longer than the model's context ({limit[1]} in its "
        f"config.json); the engine refuses it. Use at most {limit[0]}, or set "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model really takes longer sequences"
    )


def engine_block_size(engine_args: dict[str, Any], *, gpu: bool) -> int:
    return int(engine_args.get("block_size") or DEFAULT_BLOCK_SIZE["gpu" if gpu else "cpu"])


def check_chunk_size(chunk_size: int | None, engine_args: dict[str, Any], *, gpu: bool) -> str | None:
    """LMCache moves KV per chunk into the engine's blocks: a chunk must be whole blocks."""
    if not chunk_size:
        return None
    block = engine_block_size(engine_args, gpu=gpu)
    if chunk_size % block == 0:
        return None
    source = "option.block_size" if engine_args.get("block_size") else f"the engine's default on {'GPU' if gpu else 'CPU'} hosts"
    nearest = max(block, round(chunk_size / block) * block)
    return (
        f"LMCache chunk_size={chunk_size} is not a multiple of the engine's KV block size {block} "
        f"({source}); use chunk_size: {nearest} (or another multiple of {block})"
    )
