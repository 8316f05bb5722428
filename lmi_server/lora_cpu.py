"""vLLM's CPU LoRA kernels, replaced by ones that compute each run of tokens of one adapter as one
matrix product and leave tokens without an adapter alone.

Why: vLLM 0.32's CPU punica ops (`vllm/lora/ops/torch_ops`, used by `punica_cpu`) gather every
token's adapter weights (`weights[indices]`, one [out, in] matrix per token) and multiply token by
token. Two things follow:
- a token of the base model has index -1, which the GPU kernels skip, but `weights[-1]` is the last
  adapter slot: a base-model request in an engine step beside adapter requests got the adapter in
  slot `max_loras - 1` applied to it (another model's answer than the one named);
- a prefill of thousands of tokens copies thousands of weight matrices per layer and projection: an
  8,000-token prompt beside adapters held the engine for minutes (the fuzzer's timeouts on the
  assistant with LoRA on).
Here the tokens are split into runs of one adapter slot (`torch.unique_consecutive`; a prefill is
one run per request) and each run is one product with its slot's weights; runs of -1 get nothing
(shrink writes zeros, expand adds nothing), as on GPUs. Shapes the runs do not describe (one index
for many rows: the logits of one request's prompt) go to vLLM's own function, unchanged.

`vllm_plugin` (a `vllm.general_plugins` entry point, pyproject.toml) installs them in every vLLM
process; on GPU hosts punica_cpu is not used and nothing changes.
"""

from __future__ import annotations

from typing import Any

import torch

from lmi_server.compat import vllm as compat_vllm

NAMES = compat_vllm.PUNICA_OPS
"""The functions `vllm.lora.punica_wrapper.punica_cpu` imports from vLLM's torch ops, all replaced."""


def runs(indices: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, slot) of each run of equal adapter slots over the tokens."""
    slots, counts = torch.unique_consecutive(indices, return_counts=True)
    out, start = [], 0
    for slot, count in zip(slots.tolist(), counts.tolist()):
        out.append((start, start + count, slot))
        start += count
    return out


def _weights(stacked: torch.Tensor) -> torch.Tensor:
    return stacked.squeeze(1) if stacked.dim() == 4 else stacked


def _per_token(inputs: torch.Tensor, output: torch.Tensor, indices: torch.Tensor) -> bool:
    return indices.dim() == 1 and indices.shape[0] == inputs.shape[0] == output.shape[0]


def make_bgmv_shrink(original: Any):
    def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
        if not _per_token(inputs, output_tensor, lora_indices_tensor):
            return original(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling)
        weights = _weights(lora_a_weights)
        dtype = output_tensor.dtype
        rank = weights.shape[1]
        for start, end, slot in runs(lora_indices_tensor):
            if slot < 0:
                output_tensor[start:end, :rank] = 0
            else:
                product = inputs[start:end].to(dtype) @ weights[slot].to(dtype).T
                output_tensor[start:end, :rank] = scaling * product
    return bgmv_shrink


def make_bgmv_expand(original: Any):
    def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
        if not _per_token(inputs, output_tensor, lora_indices_tensor):
            return original(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
        weights = _weights(lora_b_weights)
        dtype = output_tensor.dtype
        width = min(weights.shape[1], output_tensor.shape[1])
        for start, end, slot in runs(lora_indices_tensor):
            if slot < 0:
                if not add_inputs:
                    output_tensor[start:end, :width] = 0
                continue
            product = inputs[start:end].to(dtype) @ weights[slot].to(dtype).T
            if add_inputs:
                output_tensor[start:end, :width] += product[:, :width]
            else:
                output_tensor[start:end, :width] = product[:, :width]
    return bgmv_expand


def make_bgmv_expand_slice(original: Any):
    def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int, slice_size: int,
                          add_inputs: bool = True):
        if not _per_token(inputs, output_tensor, lora_indices_tensor):
            return original(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs)
        weights = _weights(lora_b_weights)
        dtype = output_tensor.dtype
        for start, end, slot in runs(lora_indices_tensor):
            target = output_tensor[start:end, slice_offset:slice_offset + slice_size]
            if slot < 0:
                if not add_inputs:
                    target.zero_()
                continue
            product = inputs[start:end].to(dtype) @ weights[slot].to(dtype).T
            if add_inputs:
                target += product
            else:
                target.copy_(product)
    return bgmv_expand_slice


def _exploded(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def kernels(originals: dict[str, Any]) -> dict[str, Any]:
    """The six replacements, each falling back to `originals[name]` for shapes it does not cover."""
    shrink = make_bgmv_shrink(originals["bgmv_shrink"])
    expand = make_bgmv_expand(originals["bgmv_expand"])
    expand_slice = make_bgmv_expand_slice(originals["bgmv_expand_slice"])

    def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                    batches, max_seq_length, token_nums, scaling):
        shrink(inputs, lora_a_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor), scaling)

    def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                    batches, max_seq_length, token_nums, add_inputs=False):
        expand(inputs, lora_b_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor), add_inputs)

    def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                          batches, max_seq_length, token_nums, slice_offset, slice_size, add_inputs=False):
        expand_slice(inputs, lora_b_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor),
                     slice_offset, slice_size, add_inputs)

    return {"bgmv_shrink": shrink, "bgmv_expand": expand, "bgmv_expand_slice": expand_slice,
            "sgmv_shrink": sgmv_shrink, "sgmv_expand": sgmv_expand, "sgmv_expand_slice": sgmv_expand_slice}


def install() -> bool:
    """Replace the six names in vLLM's punica_cpu module (where its CPU wrapper looks them up)."""
    return compat_vllm.replace_punica_cpu_ops(kernels, "lmi_lora_cpu")


def vllm_plugin() -> None:
    """vLLM's `vllm.general_plugins` entry point: the kernels in every vLLM process."""
    try:
        install()
    except Exception as exc:  # never stop vLLM from starting over this: its own kernels then run
        import logging

        logging.getLogger(__name__).warning("CPU LoRA kernels not replaced: %s", exc)
