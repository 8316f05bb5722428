"""The question-guided blend mode: recompute the reused tokens the question reads.

Why: CacheBlend picks the tokens to recompute by how far their K moved at a check layer, EPIC the
first tokens of each reused span; on the assistant neither recovers the answers a full prefill
gives (LMCache's rag-qa-quality, README). What an answer is built from is the KV the question
attends to, so that KV is what must hold its full context.

How: a first pass computes every token that has no reused KV (the question among them) through every
layer over the reused KV, as EPIC with nothing recomputed, and sums the attention the prompt's tail
(the computed tokens after the last reused one) puts on each reused token over all layers and heads.
The `ratio` of reused tokens (not held exactly) with the most attention is recomputed in a second
pass, with every token that has no reused KV, through every layer over the blended KV. No check
layer runs over the whole prompt: its cost is the computed tokens twice plus the chosen ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmi_server.kvcache.blend import forward
from lmi_server.kvcache.blend.recompute import attend_selected, plan_attention, query_attention, select_recompute


def question_mass(
    adapter: forward.ModelAdapter, ids: torch.Tensor, reused_kv: Sequence[forward.LayerKV], reused: torch.Tensor,
) -> torch.Tensor:
    """float32 [tokens]: over every layer, the attention the tail puts on each token, the tokens with
    no reused KV computed over the reused KV (their rows of `reused_kv` are written on the way)."""
    computed = (~reused).nonzero(as_tuple=True)[0]
    last_reused = int(reused.nonzero(as_tuple=True)[0][-1])
    tail = (computed > last_reused).nonzero(as_tuple=True)[0]
    hidden = adapter.embed(ids.index_select(0, computed))
    plan = plan_attention(computed, ids.numel(), hidden.dtype)
    mass = torch.zeros(ids.numel(), dtype=torch.float32, device=ids.device)
    for i in range(adapter.num_layers):
        x = adapter.input_norm(i, hidden)
        q, k, v = adapter.qkv(i, x, computed)
        k_all = reused_kv[i][0].index_copy_(0, computed, k.to(reused_kv[i][0].dtype))
        v_all = reused_kv[i][1].index_copy_(0, computed, v.to(reused_kv[i][1].dtype))
        attn = attend_selected(q, k_all, v_all, computed, scale=adapter.scale, plan=plan)
        mass += query_attention(q.index_select(0, tail), k_all, computed.index_select(0, tail), scale=adapter.scale)
        hidden = hidden + adapter.o_proj(i, attn.reshape(attn.shape[0], -1))
        hidden = hidden + adapter.mlp(i, adapter.post_norm(i, hidden))
    return mass


def select_guided(mass: torch.Tensor, reused: torch.Tensor, ratio: float, exact: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted long indices: every token not reused, plus ceil(ratio x candidates) reused tokens (not
    `exact`) with the most question attention: CacheBlend's rule with the attention as the score."""
    return select_recompute(mass, reused, ratio, exact)


def guided_prefill(
    adapter: forward.ModelAdapter,
    token_ids: torch.Tensor | Sequence[int],
    reused_kv: Sequence[forward.LayerKV],
    reused: torch.Tensor,
    *,
    ratio: float,
    exact: torch.Tensor | None = None,
    overwrite_reused: bool = False,
) -> forward.BlendResult:
    """The prompt's prefill reusing `reused_kv` (as `forward.blend_prefill` takes it), recomputing
    the `ratio` of reused tokens the question attends to most and every token not reused."""
    ids = forward._ids(adapter, token_ids)
    reused = forward.check_reused(adapter, ids, reused_kv, reused)
    if not overwrite_reused:
        reused_kv = [(k.clone(), v.clone()) for k, v in reused_kv]
    if bool(reused.any()):
        mass = question_mass(adapter, ids, reused_kv, reused)
        selected = select_guided(mass, reused, ratio, exact)
    else:
        mass, selected = None, torch.arange(ids.numel(), device=ids.device)
    return forward.prefill_selected(adapter, ids, reused_kv, selected, in_place=True, deviation=mass)
