"""Which tensor-parallel degrees vLLM 0.32 accepts for a model, read from its config.json.

Why: vLLM checks most of these only once the engine starts (some in every worker, after the
weights began to load), so `lmi-server config` would accept a degree that `serve` then dies on,
and a default of "every GPU" would pick one. The rules, as vLLM applies them:
- the attention heads are divisible by the degree (`ModelConfig.verify_with_parallel_config`);
- the KV heads are divisible by the degree, or the degree by them (`QKVParallelLinear` replicates
  KV heads over ranks). Not for MLA models (DeepSeek V2/V3, Kimi K2), whose one latent per layer
  is kept whole on every rank; and gpt-oss keeps `kv_heads // degree` heads per rank, so there
  the KV heads must be divisible by the degree;
- MLP and expert intermediate sizes are divisible by the degree (`MergedColumnParallelLinear`;
  experts are split the same way unless expert parallelism is on);
- block-quantized fp8 weights: every rank's share of a split size is whole blocks
  (`validate_fp8_block_shape`); AWQ/GPTQ: whole quantization groups (`create_weights`).
Vision towers are not checked: where their heads do not split, vLLM runs them data-parallel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmi_server.config.weights import text_config

# Quantization methods whose row-parallel inputs must be whole groups on every rank.
GROUPED_QUANT = {"awq", "awq_marlin", "gptq", "gptq_marlin"}


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class ShardShape:
    """The sizes of a model that tensor parallelism splits, with what vLLM requires of them."""

    heads: int
    kv_heads: int | None
    """None for MLA (nothing to split); otherwise the KV heads."""
    kv_must_divide: bool = False
    """The degree must divide the KV heads (no replication), as in vLLM's gpt-oss."""
    splits: tuple[tuple[str, int], ...] = ()
    """(what, size) of each dimension split over the ranks."""
    block: int | None = None
    """fp8 block size: every rank's share of a split is whole blocks."""
    group: int | None = None
    """AWQ/GPTQ group size: every rank's share of a split is whole groups."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], engine_args: Mapping[str, Any] | None = None) -> ShardShape | None:
        """The shape from config.json (a multimodal model's text config); None without heads."""
        engine_args = engine_args or {}
        cfg = text_config(config)
        heads = _int(cfg, "num_attention_heads")
        if heads is None:
            return None
        mla = _int(cfg, "kv_lora_rank") is not None
        kv = None if mla else (_int(cfg, "num_key_value_heads") or _int(cfg, "num_kv_heads") or heads)
        splits: list[tuple[str, int]] = []
        head_dim = _int(cfg, "v_head_dim") if mla else _int(cfg, "head_dim")
        hidden = _int(cfg, "hidden_size")
        head_dim = head_dim or (hidden // heads if hidden else None)
        if head_dim:
            splits.append(("attention output (heads x head_dim)", heads * head_dim))
        if inter := _int(cfg, "intermediate_size"):
            splits.append(("MLP intermediate size", inter))
        experts = _int(cfg, "n_routed_experts") or _int(cfg, "num_local_experts") or _int(cfg, "num_experts")
        if experts and not engine_args.get("enable_expert_parallel"):
            if moe := _int(cfg, "moe_intermediate_size"):
                splits.append(("expert intermediate size", moe))
            if shared := _int(cfg, "shared_expert_intermediate_size"):
                splits.append(("shared expert intermediate size", shared))
        quant = config.get("quantization_config") or cfg.get("quantization_config") or {}
        block = group = None
        if isinstance(quant, Mapping):
            method = str(quant.get("quant_method", "")).lower()
            sizes = quant.get("weight_block_size")
            if method == "fp8" and isinstance(sizes, list) and sizes and isinstance(sizes[0], int):
                block = sizes[0]
            size = quant.get("group_size") if "group_size" in quant else quant.get("q_group_size")
            if method in GROUPED_QUANT and isinstance(size, int) and size > 0:
                group = size
        model_type = str(cfg.get("model_type", ""))
        return cls(heads=heads, kv_heads=kv, kv_must_divide=model_type == "gpt_oss", splits=tuple(splits),
                   block=block, group=group)

    def refusal(self, degree: int) -> str | None:
        """Why vLLM refuses this degree for the model, in its terms; None when it accepts it."""
        if degree < 1:
            return "the degree must be at least 1"
        if self.heads % degree:
            return f"its {self.heads} attention heads are not divisible by {degree}"
        if self.kv_heads is not None:
            if self.kv_must_divide and self.kv_heads % degree:
                return f"its {self.kv_heads} KV heads are not divisible by {degree} (vLLM does not replicate them for this model)"
            if self.kv_heads % degree and degree % self.kv_heads:
                return f"its {self.kv_heads} KV heads and {degree} divide neither way"
        for what, size in self.splits:
            if size % degree:
                return f"its {what} {size} is not divisible by {degree}"
            share = size // degree
            if degree > 1 and self.block and share % self.block:
                return f"its {what} {size} / {degree} = {share} is not whole fp8 blocks of {self.block}"
            if degree > 1 and self.group and share % self.group:
                return f"its {what} {size} / {degree} = {share} is not whole quantization groups of {self.group}"
        return None

    def valid_degrees(self, upto: int) -> list[int]:
        return [d for d in range(1, max(1, upto) + 1) if self.refusal(d) is None]
