"""Token-granular KV copies between a contiguous per-segment KV and vLLM's CPU paged KV cache,
with the RoPE re-rotation of K applied on the way in.

A segment found in the cache starts anywhere in the request, not on a block boundary, so its KV
is addressed by *slots* (`block_id x block_size + offset in the block`, vLLM's slot mapping) rather
than by whole blocks as LMCache's transfer kernels (and `block_copy.py`) do.

**vLLM 0.32's CPU layout, as its own kernels write it.** The per-layer tensor is allocated as
`[num_blocks, num_kv_heads, block_size, 2 * head_size]`, but that shape is only its size: the CPU
attention backend views it as `[num_blocks, num_kv_heads, 2 * block_size, head_size]` and splits
dim 2 in halves (`cpu_attn.py`: `kv_cache.view(...).chunk(2, dim=2)`), so each (block, head) holds
`block_size x head_size` elements of K and then as many of V. Inside those halves the ISA kernels
`vec` and `vec16` (`cpu_attn_reshape_and_cache`, what every x86 host without AMX and every block
size runs) store **K dimension-major, `[head_size, block_size]`** (element `d x block_size + t`) and
**V token-major, `[block_size, head_size]`**. K and V are therefore *not* packed per token: a whole
block is the smallest unit that a byte copy may treat as opaque. `tests/unit/kvcache/blend/
test_paged.py` checks this layout against vLLM's own `cpu_attn_reshape_and_cache`. The AMX
(bfloat16 on AMX hosts), NEON, VSX, VXE and RVV kernels may tile differently and are refused by
`check_isa` until they are checked the same way.

The per-segment KV is `[tokens, num_kv_heads, head_size]` for K and V of one layer (what the model's
projections give); `gather`/`scatter` go by a slot per token, so a segment may span scattered
blocks and start or end mid-block.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmi_server.kvcache.blend.rope import RopeSpec, rerotate

CHECKED_ISAS = ("vec", "vec16")
"""vLLM CPU attention kernels whose cache layout this module is checked against."""


class PagedLayoutError(ValueError):
    """A paged KV cache this module cannot address token by token; the message says why."""


def check_isa(isa: str) -> None:
    """PagedLayoutError unless `isa` (vLLM's `_get_attn_isa`, kept on each attention layer as
    `layer.isa`) is one whose K/V layout this module was checked against."""
    if isa not in CHECKED_ISAS:
        raise PagedLayoutError(
            f"vLLM's CPU attention kernel {isa!r} may lay K/V out in tiles this copy does not know; only "
            f"{', '.join(CHECKED_ISAS)} are checked (bfloat16 on an AMX host picks 'amx': use float32 or no blending)"
        )


def slot_mapping(block_ids: Sequence[int] | torch.Tensor, start: int, n_tokens: int, block_size: int) -> torch.Tensor:
    """long [n_tokens]: the slots of a request's tokens `start .. start + n_tokens - 1`, given the
    request's block table (`block_ids[i]` holds its tokens `i x block_size ..`)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if start < 0 or n_tokens < 0:
        raise ValueError(f"start ({start}) and n_tokens ({n_tokens}) must not be negative")
    table = torch.as_tensor(block_ids, dtype=torch.long)
    positions = torch.arange(start, start + n_tokens, dtype=torch.long)
    if n_tokens and int(positions[-1]) // block_size >= table.numel():
        raise ValueError(
            f"tokens up to {start + n_tokens} need {(start + n_tokens + block_size - 1) // block_size} blocks, "
            f"the block table has {table.numel()}"
        )
    return table[positions // block_size] * block_size + positions % block_size


def _halves(layer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of one layer's cache: K as [blocks, block_size, heads, head_size] (over the
    dimension-major storage) and V as [blocks, block_size, heads, head_size]."""
    if layer.dim() != 4 or layer.shape[-1] % 2:
        raise PagedLayoutError(
            f"a CPU paged KV layer is [blocks, kv_heads, block_size, 2 * head_size], got {tuple(layer.shape)}"
        )
    if not layer.is_contiguous():
        raise PagedLayoutError("the paged KV layer must be contiguous (vLLM allocates it so)")
    blocks, heads, block_size, width = layer.shape
    head_size = width // 2
    per_head = layer.view(blocks, heads, 2, block_size * head_size)
    k = per_head[:, :, 0].view(blocks, heads, head_size, block_size).permute(0, 3, 1, 2)
    v = per_head[:, :, 1].view(blocks, heads, block_size, head_size).permute(0, 2, 1, 3)
    return k, v


def _split_slots(layer: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, _, block_size, _ = layer.shape
    slots = torch.as_tensor(slots, dtype=torch.long, device=layer.device)
    if slots.dim() != 1:
        raise ValueError(f"slots must be one per token, got shape {tuple(slots.shape)}")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= blocks * block_size):
        raise ValueError(f"slots must lie in [0, {blocks * block_size}) for {blocks} blocks of {block_size}")
    return slots // block_size, slots % block_size


def gather(layer: torch.Tensor, slots: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V `[tokens, kv_heads, head_size]` (new tensors) of the tokens at `slots`."""
    k_view, v_view = _halves(layer)
    block, offset = _split_slots(layer, torch.as_tensor(slots))
    return k_view[block, offset], v_view[block, offset]


def scatter(
    layer: torch.Tensor, slots: torch.Tensor | Sequence[int], k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write K and V `[tokens, kv_heads, head_size]` of the tokens at `slots` into the cache, in
    place; every other slot is left as it was. Slots must be distinct."""
    k_view, v_view = _halves(layer)
    block, offset = _split_slots(layer, torch.as_tensor(slots))
    expected = (block.numel(), k_view.shape[2], k_view.shape[3])
    if tuple(k.shape) != expected or tuple(v.shape) != expected:
        raise ValueError(f"K and V must be {expected} for these slots, got {tuple(k.shape)} and {tuple(v.shape)}")
    if torch.unique(block * layer.shape[2] + offset).numel() != block.numel():
        raise ValueError("slots must be distinct")
    k_view[block, offset] = k.to(layer.dtype)
    v_view[block, offset] = v.to(layer.dtype)


def load_segment(
    layer: torch.Tensor,
    slots: torch.Tensor | Sequence[int],
    k: torch.Tensor,
    v: torch.Tensor,
    spec: RopeSpec,
    *,
    from_start: int = 0,
    to_start: int,
) -> None:
    """Write a cached segment's KV into the request's slots, K re-rotated from the positions it was
    computed at (`from_start ..`, segment-local 0.. as segments are stored) to the request's
    (`to_start ..`). V carries no position and is written as is."""
    n = k.shape[0]
    positions = torch.arange(n, dtype=torch.long, device=k.device)
    moved = rerotate(k, positions + from_start, positions + to_start, spec) if from_start != to_start else k
    scatter(layer, slots, moved, v)


def store_segment(
    layer: torch.Tensor,
    slots: torch.Tensor | Sequence[int],
    spec: RopeSpec,
    *,
    at_start: int,
    to_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A segment's K and V read from the request's slots, K re-rotated from the request's positions
    (`at_start ..`) to `to_start ..` (segment-local 0.. for the store): the inverse of `load_segment`."""
    k, v = gather(layer, slots)
    if at_start != to_start:
        positions = torch.arange(k.shape[0], dtype=torch.long, device=k.device)
        k = rerotate(k, positions + at_start, positions + to_start, spec)
    return k, v
