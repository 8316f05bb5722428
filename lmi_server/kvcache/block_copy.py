"""Block-wise KV copies between LMCache chunks and vLLM's head-major paged KV cache (CPU hosts).

On CPU hosts LMCache moves KV with its pure-torch transfer kernels. vLLM's CPU KV cache is, per
layer, `[blocks, kv_heads, block_size, 2*head_size]` (head-major inside each block; that shape is
only its size: per block and head vLLM's CPU kernels keep all of K, dimension-major, then all of V,
see `blend/paged.py`, so rows of the last two dimensions are not tokens and only whole blocks may be
copied as opaque bytes, which is what this module does); LMCache's chunks are
`[layers, tokens, kv_heads * 2*head_size]` with the same bytes per block. LMCache
0.5.6 transposes through `index_copy_` for a hit and through `index_select` plus two more copies for
a store. Copying each run of consecutive blocks with one strided `copy_` writes the same bytes to
the same places with one pass over them (benchmarks/kv_hit_path.py measures both).

`install()` swaps that one kernel (LMCache's per-layer packed-K/V kernel, through `compat.lmcache`) for
`transfer_per_layer_fused` below; every other layout, and every compiled (GPU) kernel, stays
LMCache's. The connector installs it in the engine's processes when it is created.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from lmi_server.compat import lmcache as compat_lmcache

logger = logging.getLogger("lmi_server.kvcache.block_copy")


def consecutive_runs(block_ids: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(position, first block id, length) of each run of ascending consecutive ids: such a run
    takes one copy per layer (vLLM's free list hands out ascending and descending runs; a
    descending one takes a copy per block)."""
    start = 0
    for i in range(1, len(block_ids) + 1):
        if i == len(block_ids) or block_ids[i] != block_ids[i - 1] + 1:
            yield start, block_ids[start], i - start
            start = i


def transfer_per_layer_fused(
    layer_tensors: list[torch.Tensor],
    object_tensors: list[torch.Tensor],
    block_ids: torch.Tensor | list[int],
    n_block_ids: int,
    blocks_per_object: int,
    block_size: int,
    format_spec: Any,
    is_d2h: bool,
    skip_prefix_n_blocks: int,
    *,
    fallback: Callable[..., None],
    valid_range: Callable[..., tuple[int, int, int] | None],
) -> None:
    """Copy between chunk objects `[layers, chunk_tokens, heads * 2*head_size]` and per-layer paged
    tensors `[blocks, heads, block_size, 2*head_size]`, one strided copy per run of consecutive
    blocks and layer. Same arguments and effect as LMCache's kernel it replaces; token-major paged
    layouts (no transpose to do) go to `fallback`."""
    if not layer_tensors or not object_tensors:
        return
    args = (layer_tensors, object_tensors, block_ids, n_block_ids, blocks_per_object, block_size,
            format_spec, is_d2h, skip_prefix_n_blocks)
    if not format_spec.is_hnd:
        fallback(*args)
        return
    try:
        # Views only: a reshape that had to copy would take a store's or a hit's writes with it.
        # The 5-D split view [NB, NH, BS, 2, HS] shares storage with the packed [NB, NH, BS, 2*HS].
        layers = [layer.view(*layer.shape[:3], -1) if layer.dim() == 5 else layer for layer in layer_tensors]
        _, heads, _, width = layers[0].shape
        objects = [obj.view(len(layers), -1, heads * width) for obj in object_tensors]
    except RuntimeError:
        objects = []
    if not objects or not all(obj.is_contiguous() for obj in objects):
        fallback(*args)
        return
    ids = block_ids.tolist() if isinstance(block_ids, torch.Tensor) else list(block_ids)
    for object_idx, tokens in enumerate(objects):
        valid = valid_range(object_idx, n_block_ids, blocks_per_object, block_size, skip_prefix_n_blocks)
        if valid is None:
            continue
        first, end, offset = valid
        for position, block_id, length in consecutive_runs(ids[first:end]):
            t0 = offset + position * block_size
            t1 = t0 + length * block_size
            for layer_idx, layer in enumerate(layers):
                # [length, heads, block_size, 2*head_size] views of both sides
                token_major = tokens[layer_idx, t0:t1].view(length, block_size, heads, width).transpose(1, 2)
                paged = layer[block_id : block_id + length]
                if is_d2h:
                    token_major.copy_(paged)
                else:
                    paged.copy_(token_major)


def install() -> bool:
    """Use the block-wise copy for LMCache's packed-K/V per-layer kernel in this process; False
    (LMCache's own kernel stays) when this LMCache build has no such kernel."""
    installed = compat_lmcache.replace_transfer_kernel(block_wise, "lmi_block_copy")
    if installed is False:
        logger.warning("LMCache has no packed-K/V per-layer transfer kernel: its own KV copies are used")
    return bool(installed)


def block_wise(original: Callable[..., None], valid_range: Callable[..., Any]) -> Callable[..., None]:
    """LMCache's kernel signature over `transfer_per_layer_fused`, falling back to `original`."""

    def kernel(*args: Any) -> None:
        transfer_per_layer_fused(*args, fallback=original, valid_range=valid_range)

    kernel.lmi_block_copy = True  # type: ignore[attr-defined]
    kernel.lmcache_kernel = original  # type: ignore[attr-defined]
    return kernel
