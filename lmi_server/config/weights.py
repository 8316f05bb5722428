"""How many bytes a model's weights take on the GPUs, known before anything is loaded.

Why: a tensor-parallel degree that leaves each GPU more weights than it holds fails only after
minutes of loading. The size is the local safetensors' (exact), else a parameter count from
config.json for the decoder shapes whose parameters follow from it (gated MLP, MoE experts, MLA),
at the bytes each parameter takes once loaded (the model's quantization, else vLLM's dtype). A
model this module does not know gives None, and the caller then leaves the question to vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
# Decoder families whose MLP is gated (gate, up, down) and whose config.json names every size.
GATED_DECODERS = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl",
    "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "deepseek_v2", "deepseek_v3",
    "kimi_k2", "gpt_oss", "phi3", "granite", "olmo2", "gemma", "gemma2", "gemma3_text",
}
# MXFP4: 4-bit values plus one 8-bit scale per 32 of them.
MXFP4_BYTES = 0.5 + 1 / 32
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")


@dataclass(frozen=True)
class WeightSize:
    bytes: int
    source: str
    """Where the number comes from, for the reasons a plan prints."""


def safetensors_bytes(model_dir: Path | None) -> int | None:
    """The weights' bytes in a local model directory: the `metadata.total_size` that a sharded
    model's `model.safetensors.index.json` states (known before, or without, every shard on disk),
    else the sum of `*.safetensors` file sizes; None if neither is there."""
    if model_dir is None or not model_dir.is_dir():
        return None
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        except (OSError, ValueError, AttributeError):
            total = None
        if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
            return int(total)
    sizes = [p.stat().st_size for p in model_dir.glob("*.safetensors")]
    return sum(sizes) if sizes else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's numbers: a multimodal config's text sub-config over the top level."""
    for key in _TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, Mapping) and "num_attention_heads" in sub:
            return {**config, **sub}
    return config


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by how they are stored: `linear` are the decoder's matrices (what quantization
    shrinks), `experts` the part of them in MoE experts, `other` embeddings, head and vision tower."""

    linear: int
    experts: int
    other: int

    @property
    def total(self) -> int:
        return self.linear + self.other


def _moe_layers(cfg: Mapping[str, Any], layers: int, experts: int) -> int:
    if not experts:
        return 0
    first_dense = _int(cfg, "first_k_dense_replace") or 0
    freq = _int(cfg, "moe_layer_freq") or 1
    step = _int(cfg, "decoder_sparse_step") or 1
    dense_only = set(cfg.get("mlp_only_layers") or [])
    return sum(
        1 for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )


def count_parameters(config: Mapping[str, Any]) -> ParameterCount | None:
    """Parameters of the served model (without MTP draft layers) from config.json, or None."""
    cfg = text_config(config)
    if str(config.get("model_type")) not in GATED_DECODERS and str(cfg.get("model_type")) not in GATED_DECODERS:
        return None
    hidden, layers, heads = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers"), _int(cfg, "num_attention_heads")
    vocab, inter = _int(cfg, "vocab_size"), _int(cfg, "intermediate_size")
    if not (hidden and layers and heads and vocab and inter):
        return None
    if _int(cfg, "kv_lora_rank"):
        rank, rope = _int(cfg, "kv_lora_rank") or 0, _int(cfg, "qk_rope_head_dim") or 0
        nope, v_dim = _int(cfg, "qk_nope_head_dim") or 0, _int(cfg, "v_head_dim") or 0
        q_rank = _int(cfg, "q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attention = q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        kv = _int(cfg, "num_key_value_heads") or heads
        head_dim = _int(cfg, "head_dim") or hidden // heads
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts") or 0
    moe_layers = _moe_layers(cfg, layers, experts)
    moe_inter = _int(cfg, "moe_intermediate_size") or inter
    shared = (_int(cfg, "n_shared_experts") or 0) * moe_inter + (_int(cfg, "shared_expert_intermediate_size") or 0)
    expert_params = moe_layers * experts * 3 * hidden * moe_inter
    linear = layers * attention + (layers - moe_layers) * 3 * hidden * inter + moe_layers * 3 * hidden * shared
    linear += expert_params
    tied = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    other = vocab * hidden * (1 if tied else 2) + moe_layers * hidden * experts + (2 * layers + 1) * hidden
    vision = config.get("vision_config")
    if isinstance(vision, Mapping):
        v_hidden, v_inter = _int(vision, "hidden_size"), _int(vision, "intermediate_size")
        depth = _int(vision, "depth", "num_hidden_layers")
        if v_hidden and v_inter and depth:
            other += depth * (4 * v_hidden * v_hidden + 2 * v_hidden * v_inter)
    return ParameterCount(linear=linear, experts=expert_params, other=other)


def _loaded_dtype_bytes(cfg: Mapping[str, Any], dtype: str | None) -> int | None:
    """Bytes per unquantized parameter as vLLM loads it: option.dtype, else the model's dtype
    (float32 checkpoints are served in 16 bits, as vLLM's `auto` does on GPUs)."""
    if dtype and dtype != "auto":
        return FLOAT_BYTES.get(str(dtype).removeprefix("torch."))
    stored = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    return min(2, FLOAT_BYTES[stored]) if stored in FLOAT_BYTES else None


def _linear_bytes(quant: Mapping[str, Any] | None, engine_quant: str | None) -> tuple[float | None, float | None, str]:
    """(bytes per linear parameter, bytes per expert parameter, what says so); None: as unquantized."""
    if quant:
        method = str(quant.get("quant_method", "")).lower()
        if method == "mxfp4":
            return None, MXFP4_BYTES, "MXFP4 experts"
        if method in ("fp8", "fbgemm_fp8", "modelopt"):
            return 1, 1, f"{method} weights"
        bits = quant.get("bits") or quant.get("w_bit")
        if method == "bitsandbytes":
            bits = 4 if quant.get("load_in_4bit") else 8
        if method == "compressed-tensors":
            groups = quant.get("config_groups") or {}
            found = [g.get("weights", {}).get("num_bits") for g in groups.values() if isinstance(g, Mapping)]
            bits = next((b for b in found if isinstance(b, int)), None)
        if isinstance(bits, int) and 0 < bits <= 16:
            return bits / 8, bits / 8, f"{method} {bits}-bit weights"
        raise LookupError(method)
    if engine_quant in (None, "", "none"):
        return None, None, ""
    if engine_quant == "fp8":
        return 1, 1, "fp8 quantized at load (option.quantization)"
    if engine_quant == "bitsandbytes":
        return 0.5, 0.5, "bitsandbytes 4-bit at load (option.quantization)"
    raise LookupError(engine_quant)


def estimate_weight_bytes(config: Mapping[str, Any], engine_args: Mapping[str, Any]) -> WeightSize | None:
    """Weight bytes on the GPUs from config.json alone, or None when the shape or the storage of
    the parameters is not one this module knows."""
    count = count_parameters(config)
    cfg = text_config(config)
    dtype_bytes = _loaded_dtype_bytes(cfg, engine_args.get("dtype"))
    if count is None or dtype_bytes is None:
        return None
    quant = config.get("quantization_config") or cfg.get("quantization_config")
    try:
        per_linear, per_expert, how = _linear_bytes(quant if isinstance(quant, Mapping) else None, engine_args.get("quantization"))
    except LookupError:
        return None
    dense = count.linear - count.experts
    total = (
        dense * (per_linear or dtype_bytes)
        + count.experts * (per_expert or dtype_bytes)
        + count.other * dtype_bytes
    )
    note = f", {how}" if how else ""
    return WeightSize(int(total), f"estimated from config.json: {count.total / 1e9:.1f}B parameters{note}")


def model_weight_size(model_dir: Path | None, config: Mapping[str, Any] | None, engine_args: Mapping[str, Any]) -> WeightSize | None:
    """The local safetensors' size (scaled when vLLM casts unquantized weights to another float
    width), else the estimate from config.json, else None."""
    files = safetensors_bytes(model_dir)
    cfg = text_config(config or {})
    if files is not None:
        stored = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").removeprefix("torch.")
        wanted = engine_args.get("dtype")
        quantized = bool(cfg.get("quantization_config") or engine_args.get("quantization"))
        if not quantized and stored in FLOAT_BYTES and wanted in FLOAT_BYTES:
            return WeightSize(files * FLOAT_BYTES[wanted] // FLOAT_BYTES[stored], f"safetensors in {model_dir}, as {wanted}")
        return WeightSize(files, f"safetensors in {model_dir}")
    return estimate_weight_bytes(config, engine_args) if config else None
