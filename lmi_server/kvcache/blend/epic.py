"""The cheaper blend mode (EPIC, position-independent context caching, 2024): recompute only the
first `k` tokens of each reused span and every token that had no reused KV, through every layer,
with no check layer over the whole prompt.

Why it is cheaper than CacheBlend's selection: CacheBlend computes the layers up to its check layer
for every token not held exactly, to find the tokens whose KV deviates most; EPIC's observation is
that the error of reused KV concentrates at the head of each reused piece (those tokens stood
first, or after other text, when the KV was computed and drew the attention a sink draws), so a
fixed handful per piece is recomputed and nothing is spent on finding them. A *span* is a maximal
run of reused tokens whose KV is not exact where it stands (adjacent cached pieces of one document
form one span: they were computed together and stay consistent with each other).

`k = 0` recomputes nothing reused (the floor the quality yardstick must see fall).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmi_server.kvcache.blend import forward
from lmi_server.kvcache.blend.modes import validate_epic_tokens


def span_heads(candidates: torch.Tensor, k: int) -> torch.Tensor:
    """bool [tokens]: the first `k` tokens of each maximal run of True in `candidates`."""
    candidates = candidates.to(dtype=torch.bool)
    if k <= 0 or not bool(candidates.any()):
        return torch.zeros_like(candidates)
    index = torch.arange(candidates.numel(), device=candidates.device)
    starts = candidates.clone()
    starts[1:] &= ~candidates[:-1]
    # each token's run start: the last start at or before it (a running max over start offsets)
    start_at = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=0).values
    return candidates & (index - start_at < k)


def select_epic(reused: torch.Tensor, k: int, exact: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted long indices of the tokens to compute: every token not reused, plus the first `k` of
    each span of reused tokens not marked `exact`."""
    reused = reused.to(dtype=torch.bool)
    candidates = reused if exact is None else reused & ~exact.to(device=reused.device, dtype=torch.bool)
    return ((~reused) | span_heads(candidates, k)).nonzero(as_tuple=True)[0]


def epic_prefill(
    adapter: forward.ModelAdapter,
    token_ids: torch.Tensor | Sequence[int],
    reused_kv: Sequence[forward.LayerKV],
    reused: torch.Tensor,
    *,
    tokens: int,
    exact: torch.Tensor | None = None,
    overwrite_reused: bool = False,
) -> forward.BlendResult:
    """The prompt's prefill reusing `reused_kv` (as `forward.blend_prefill` takes it) and computing,
    in every layer, only the tokens `select_epic` picks; their attention reads the whole blended KV."""
    tokens = validate_epic_tokens(tokens)
    ids = forward._ids(adapter, token_ids)
    reused = forward.check_reused(adapter, ids, reused_kv, reused)
    selected = select_epic(reused, tokens, exact)
    return forward.prefill_selected(adapter, ids, reused_kv, selected, in_place=overwrite_reused)
