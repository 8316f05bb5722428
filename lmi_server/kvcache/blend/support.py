"""Whether KV blending can handle a model, decided from its Hugging Face `config.json` alone.

Blending moves cached K to new positions (`rope.py`) and recomputes a share of tokens at a check
layer (`recompute.py`). That is exact for decoder-only models with full causal attention and a
RoPE this server can re-rotate: Llama, Qwen2 and Qwen3. Anything else is refused with the reason,
so a start-up error says why instead of blended answers going quietly wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmi_server.kvcache.blend.rope import RopeConfigError, RopeSpec

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
DEFAULT_CHECK_LAYER = 1
"""The layer whose KV deviation picks the tokens to recompute (LMCache's blender checks layer 1 by
default): layer 0's KV depends on the token alone, so it cannot show what cross-attention changed."""


class BlendUnsupportedModel(ValueError):
    """KV blending cannot handle this model; the message says why."""


@dataclass(frozen=True)
class BlendModelSupport:
    """What blending needs to know of a model it can handle."""

    architecture: str
    rope: RopeSpec
    num_layers: int
    num_kv_heads: int
    check_layer: int = DEFAULT_CHECK_LAYER

    def describe(self) -> str:
        rope = self.rope
        scaling = f", {rope.rope_type} scaling x{rope.factor:g}" if rope.rope_type != "default" else ""
        partial = f", rotary {rope.rotary_dim} of {rope.head_dim} dims" if rope.rotary_dim < rope.head_dim else ""
        return (
            f"{self.architecture}: {self.num_layers} layers, {self.num_kv_heads} KV heads x {rope.head_dim}, "
            f"RoPE theta {rope.base:g}{scaling}{partial} (neox) re-rotated exactly; check layer {self.check_layer}"
        )


def check_model(
    config: Mapping[str, Any], *, kv_cache_dtype: str | None = None, check_layer: int = DEFAULT_CHECK_LAYER
) -> BlendModelSupport:
    """The model's blending geometry, or BlendUnsupportedModel naming the reason."""
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(map(str, archs)) or "none named in config.json"
        raise BlendUnsupportedModel(
            f"architecture {named} is not supported for KV blending (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
        raise BlendUnsupportedModel(
            "sliding-window attention is not supported for KV blending: a token's KV would depend on a window "
            "that moves with the segment"
        )
    quant = config.get("quantization_config") or {}
    if isinstance(quant, Mapping) and str(quant.get("quant_method", "")).lower() == "gguf":
        raise BlendUnsupportedModel(
            "GGUF checkpoints are not supported for KV blending: vLLM rotates GGUF Llama models GPT-J style"
        )
    if kv_cache_dtype and kv_cache_dtype.startswith("fp8"):
        raise BlendUnsupportedModel(
            f"kv_cache_dtype={kv_cache_dtype} is not supported for KV blending: re-rotating quantized K is not exact"
        )
    try:
        rope = RopeSpec.from_hf_config(config)
    except RopeConfigError as exc:
        raise BlendUnsupportedModel(str(exc)) from None
    try:
        layers = int(config["num_hidden_layers"])
        kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise BlendUnsupportedModel("config.json lacks num_hidden_layers / num_attention_heads") from None
    if not 0 < check_layer < layers:
        raise BlendUnsupportedModel(
            f"the check layer {check_layer} must lie inside the model's {layers} layers and after layer 0"
        )
    return BlendModelSupport(architecture=arch, rope=rope, num_layers=layers, num_kv_heads=kv_heads, check_layer=check_layer)
