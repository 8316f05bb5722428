"""Which tokens to recompute at the check layer, and attention over blended KV.

At the check layer the engine has two KVs for the prompt: the reused one (loaded from the cache,
K re-rotated to its new positions) and a fresh one computed for every token. Tokens whose reused
KV deviates most from the fresh one are the ones whose cross-attention to earlier segments
mattered (the CacheBlend paper's selection); from the check layer on, only they and the tokens
that had no reused KV are recomputed, and their fresh KV replaces the reused rows.

Rules here:
- a token is *reused* when its segment hit the cache; tokens of missed segments, separator
  tokens and every token of the last segment (the query) are never reused;
- `ratio` is the share of reused tokens that is recomputed on top (0: none, 1: all), rounded up;
- attention for the recomputed tokens runs over the whole blended KV with an explicit causal
  mask through torch's scaled_dot_product_attention, so CPU and CUDA share the code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lmi_server.kvcache.blend.segments import Segment

DEFAULT_RECOMPUTE_RATIO = 0.15
QUERY_BLOCK = 256
"""Selected queries attend in blocks of this many, each over the keys up to its last query."""
MASS_BLOCK = 32
"""Queries whose attention mass `query_attention` sums at once (bounds its scores' memory)."""


def validate_ratio(ratio: float) -> float:
    """The recompute ratio as a float in [0, 1], or ValueError naming the value."""
    if isinstance(ratio, bool):
        raise ValueError(f"the recompute ratio must be a number in [0, 1], got {ratio!r}")
    try:
        value = float(ratio)
    except (TypeError, ValueError):
        raise ValueError(f"the recompute ratio must be a number in [0, 1], got {ratio!r}") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"the recompute ratio must be in [0, 1], got {ratio!r}")
    return value


def reuse_mask(n_tokens: int, segments: Sequence[Segment], hits: Sequence[bool]) -> torch.Tensor:
    """bool [n_tokens]: True where the token's KV is taken from the cache. `hits[i]` says whether
    `segments[i]` was found; the last segment is the query and is computed whatever `hits` says."""
    if len(hits) != len(segments):
        raise ValueError(f"one hit flag per segment: {len(segments)} segments, {len(hits)} flags")
    mask = torch.zeros(n_tokens, dtype=torch.bool)
    for seg in segments:
        if seg.end > n_tokens:
            raise ValueError(f"segment [{seg.start}, {seg.end}) lies beyond the prompt's {n_tokens} tokens")
    for seg, hit in list(zip(segments, hits))[:-1]:
        if hit:
            mask[seg.start : seg.end] = True
    return mask


def token_deviation(
    fresh_k: torch.Tensor,
    reused_k: torch.Tensor,
    fresh_v: torch.Tensor | None = None,
    reused_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """float32 [tokens]: the L2 norm over heads and dimensions of fresh minus reused K (plus V when
    given). Tensors are [tokens, ...] of one shape; hidden states work as well as K/V."""
    if fresh_k.shape != reused_k.shape:
        raise ValueError(f"fresh and reused K differ in shape: {tuple(fresh_k.shape)} vs {tuple(reused_k.shape)}")
    squared = (fresh_k.float() - reused_k.float()).pow(2).reshape(fresh_k.shape[0], -1).sum(dim=1)
    if (fresh_v is None) != (reused_v is None):
        raise ValueError("give both fresh and reused V, or neither")
    if fresh_v is not None and reused_v is not None:
        if fresh_v.shape != reused_v.shape or fresh_v.shape[0] != fresh_k.shape[0]:
            raise ValueError(f"V shapes do not fit: {tuple(fresh_v.shape)} vs {tuple(reused_v.shape)}")
        squared = squared + (fresh_v.float() - reused_v.float()).pow(2).reshape(fresh_v.shape[0], -1).sum(dim=1)
    return squared.sqrt()


def query_attention(
    q: torch.Tensor, k: torch.Tensor, query_positions: torch.Tensor, *, scale: float | None = None,
) -> torch.Tensor:
    """float32 [keys]: the attention mass the queries put on each key, summed over queries and heads.

    q: [queries, heads, d] at `query_positions`; k: [keys, kv_heads, d] (grouped-query heads as in
    `attend_selected`), causal by position. Given the prompt's tail (the question) as queries, it
    says which reused tokens the question reads: their KV is what its answer is built from."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != query_positions.numel():
        raise ValueError(f"q [queries, heads, d] with one position each and k [keys, kv_heads, d] expected; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {query_positions.numel()} positions")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    keys = k.float()
    positions = query_positions.to(device=k.device, dtype=torch.long)
    mass = torch.zeros(k.shape[0], dtype=torch.float32, device=k.device)
    # queries in blocks, each KV head's query group at once: the scores held at a time stay
    # [kv_heads, group, MASS_BLOCK, keys] however long the tail, and K is never copied per query head
    grouped = q.float().reshape(q.shape[0], kv_heads, heads // kv_heads, q.shape[-1])
    for first in range(0, q.shape[0], MASS_BLOCK):
        block = grouped[first : first + MASS_BLOCK]
        scores = torch.einsum("qhgd,khd->hgqk", block, keys) * scale
        visible = causal_mask(positions[first : first + MASS_BLOCK], k.shape[0])
        mass += scores.masked_fill(~visible, float("-inf")).softmax(dim=-1).sum(dim=(0, 1, 2))
    return mass


def select_recompute(
    deviation: torch.Tensor, reused: torch.Tensor, ratio: float, exact: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sorted long indices of the tokens to recompute: every token that is not reused, plus the
    ceil(ratio x candidates) reused tokens of largest deviation (ties go to the earlier token).
    Candidates are the reused tokens not marked `exact` (cached KV computed after the very same
    tokens at the very same positions: nothing to correct), so the ratio is spent where the context
    changed."""
    ratio = validate_ratio(ratio)
    if deviation.dim() != 1 or reused.shape != deviation.shape:
        raise ValueError(f"deviation and reuse mask must be [tokens], got {tuple(deviation.shape)} and {tuple(reused.shape)}")
    reused = reused.to(device=deviation.device, dtype=torch.bool)
    candidates = reused
    if exact is not None:
        if exact.shape != reused.shape:
            raise ValueError(f"the exact mask must be [tokens], got {tuple(exact.shape)}")
        candidates = reused & ~exact.to(device=deviation.device, dtype=torch.bool)
    n_candidates = int(candidates.sum())
    take = min(n_candidates, math.ceil(ratio * n_candidates - 1e-9))
    chosen = ~reused
    if take:
        scores = torch.where(candidates, deviation.float(), torch.tensor(float("-inf"), device=deviation.device))
        # stable order: equal deviations keep the earlier token first
        order = torch.sort(scores, descending=True, stable=True).indices[:take]
        chosen = chosen.clone()
        chosen[order] = True
    return chosen.nonzero(as_tuple=True)[0]


def blend_kv(reused: torch.Tensor, fresh_rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`reused` with row `indices[i]` replaced by `fresh_rows[i]` (for a fresh KV of every token,
    pass `fresh.index_select(0, indices)`). A new tensor; neither input is changed."""
    if fresh_rows.shape[0] != indices.shape[0] or fresh_rows.shape[1:] != reused.shape[1:]:
        raise ValueError(f"{indices.shape[0]} indices need rows of shape {tuple(reused.shape[1:])}, got {tuple(fresh_rows.shape)}")
    out = reused.clone()
    out.index_copy_(0, indices.to(device=out.device, dtype=torch.long), fresh_rows.to(out.dtype))
    return out


def causal_mask(query_positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """bool [queries, n_keys]: query i sees keys 0..query_positions[i]."""
    keys = torch.arange(n_keys, device=query_positions.device)
    return keys[None, :] <= query_positions[:, None]


@dataclass(frozen=True)
class AttentionPlan:
    """How a set of selected queries attends, worked out once per prefill: it is the same in every
    layer, so the position sort and the causal masks are built once, not once per layer."""

    positions: torch.Tensor
    """long [queries]: each query's offset into the KV, in the caller's order."""
    order: torch.Tensor | None
    """The sort into position order, or None when the positions are sorted already (the usual case:
    `select_recompute` returns sorted indices), so blocks are plain slices."""
    blocks: tuple[tuple[int, int, int, torch.Tensor], ...]
    """(first, stop) rows in position order, the keys they read (`:key_end`), and the block's
    additive causal mask (0 where a key is visible, -inf past the query), [stop - first, key_end]."""
    every_token: bool
    """Every key is a query, in order: plain causal attention."""


def plan_attention(query_positions: torch.Tensor, n_keys: int, dtype: torch.dtype) -> AttentionPlan:
    """The plan for queries at `query_positions` over `n_keys` keys, masks in `dtype` (the queries')."""
    positions = query_positions.to(dtype=torch.long)
    if positions.dim() != 1:
        raise ValueError(f"one position per selected query expected, got shape {tuple(positions.shape)}")
    n = positions.numel()
    if n and (int(positions.min()) < 0 or int(positions.max()) >= n_keys):
        raise ValueError(f"query positions must lie in [0, {n_keys})")
    every = n == n_keys and bool((positions == torch.arange(n, device=positions.device)).all())
    order = None
    ordered = positions
    if n > 1 and not every and not bool((positions[1:] >= positions[:-1]).all()):
        order = torch.argsort(positions)
        ordered = positions[order]
    blocks = []
    if not every:
        # Queries in position order, in blocks: each block reads the keys up to its last query only,
        # so the masked-out future costs nothing beyond one block's diagonal.
        for first in range(0, n, QUERY_BLOCK):
            stop = min(n, first + QUERY_BLOCK)
            block_positions = ordered[first:stop]
            end = int(block_positions[-1]) + 1
            mask = torch.zeros((stop - first, end), dtype=dtype, device=positions.device)
            mask.masked_fill_(~causal_mask(block_positions, end), float("-inf"))
            blocks.append((first, stop, end, mask))
    return AttentionPlan(positions=positions, order=order, blocks=tuple(blocks), every_token=every)


def attend_selected(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_positions: torch.Tensor,
    *,
    scale: float | None = None,
    plan: AttentionPlan | None = None,
) -> torch.Tensor:
    """Attention of the selected queries over the whole (blended) KV, causal by position.

    q: [selected, heads, head_dim] for the tokens at `query_positions` (offsets into the KV);
    k, v: [tokens, kv_heads, head_dim] with heads a multiple of kv_heads (grouped-query attention:
    query head h reads KV head h // (heads / kv_heads), as in Llama and Qwen). Returns
    [selected, heads, head_dim] in q's dtype. `scale` defaults to 1 / sqrt(head_dim). `plan`, from
    `plan_attention(query_positions, tokens, q.dtype)`, saves rebuilding the masks per layer."""
    if q.dim() != 3 or k.dim() != 3 or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"q [sel, heads, d], k and v [tokens, kv_heads, d] expected; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    if plan is None:
        plan = plan_attention(query_positions.to(device=q.device), k.shape[0], q.dtype)
    if plan.positions.shape != (q.shape[0],):
        raise ValueError(f"one position per selected query expected, got shape {tuple(plan.positions.shape)}")
    keys = k.to(q.dtype).transpose(0, 1).unsqueeze(0)
    values = v.to(q.dtype).transpose(0, 1).unsqueeze(0)
    gqa = heads != kv_heads
    if plan.every_token:
        # every token in order: plain causal attention, whose kernel skips the masked blocks
        q_heads = q.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q_heads, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        return out.squeeze(0).transpose(0, 1)
    ordered = q if plan.order is None else q.index_select(0, plan.order)
    q_heads = ordered.transpose(0, 1).unsqueeze(0)
    out = torch.empty_like(q_heads)
    for first, stop, end, mask in plan.blocks:
        out[:, :, first:stop] = F.scaled_dot_product_attention(
            q_heads[:, :, first:stop], keys[:, :, :end], values[:, :, :end],
            attn_mask=mask, scale=scale, enable_gqa=gqa,
        )
    out = out.squeeze(0).transpose(0, 1)
    if plan.order is not None:
        out = torch.empty_like(out).index_copy_(0, plan.order, out)
    return out
