"""The blended prefill of one request: a layer loop over a Llama-family model's own modules that
reuses cached KV for some tokens and recomputes the rest (CacheBlend).

Given the prompt, the reused KV of every layer (K already at the request's positions, see
`place_segments`) and which tokens it is valid for:

1. layers `0 .. check_layer - 1` run for every token as in a full prefill (their fresh KV is exact
   and is what the result keeps for those layers: layer 0's KV depends on the token and its
   position alone, so it equals the reused one anyway);
2. at `check_layer`, Q/K/V are computed for every token, the per-token deviation of fresh from
   reused K picks the reused tokens to recompute (`recompute.select_recompute`, the top `ratio` of
   them beside every token that had no reused KV), and the layer's KV becomes the reused one with
   the selected rows fresh (`recompute.blend_kv`);
3. from `check_layer` on only the selected tokens are computed: hidden states are sliced to them,
   their fresh K/V replace the reused rows of each layer, and their attention reads the whole
   blended KV with a causal mask (`recompute.attend_selected`).

The prompt's last token belongs to the query segment, which is never reused, so it is always
selected and its logits come out of the last layer. With ratio 1 (or nothing reused) every token
is selected and the result is a full prefill, which is what the tests hold it to.

The model is reached through `ModelAdapter` (embedding, per-layer norms, Q/K/V with the model's
own RoPE, output projection, MLP, final norm, LM head): `HFLlamaAdapter` wraps Hugging Face's
`LlamaForCausalLM`; `VLLMLlamaAdapter` wraps vLLM's, the one the served engine runs (`worker.py`).
torch only: CPU and CUDA run the same code. One request at a time, no batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lmi_server.kvcache.blend.recompute import (
    AttentionPlan,
    attend_selected,
    blend_kv,
    plan_attention,
    select_recompute,
    token_deviation,
    validate_ratio,
)
from lmi_server.kvcache.blend.rope import RopeSpec, apply_rerotation, rerotation
from lmi_server.kvcache.blend.support import DEFAULT_CHECK_LAYER

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""K and V of one layer, `[tokens, kv_heads, head_dim]` each, K rotated at the tokens' positions."""


class ModelAdapter(Protocol):
    """The pieces of a Llama-family decoder the blended prefill calls, one layer at a time."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    """Attention's softmax scale (1 / sqrt(head_dim) for Llama)."""

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[tokens] -> hidden [tokens, hidden_size]."""

    def input_norm(self, layer: int, hidden: torch.Tensor) -> torch.Tensor: ...

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed hidden [tokens, hidden] -> q [tokens, heads, d], k and v [tokens, kv_heads, d], q and
        k rotated at `positions` by the model's own RoPE (and normed first where the model does so)."""

    def o_proj(self, layer: int, attn: torch.Tensor) -> torch.Tensor:
        """[tokens, heads x d] -> [tokens, hidden]."""

    def post_norm(self, layer: int, hidden: torch.Tensor) -> torch.Tensor: ...

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor: ...

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[tokens, hidden] -> logits [tokens, vocab]."""


@dataclass
class BlendResult:
    logits: torch.Tensor
    """float [vocab]: the next-token logits after the prompt's last token."""
    kv: list[LayerKV]
    """Every layer's KV for the whole prompt: fresh below the check layer, blended from it on."""
    selected: torch.Tensor
    """long: the tokens computed from the check layer on (sorted)."""
    deviation: torch.Tensor | None
    """float32 [tokens]: fresh vs reused K at the check layer (None when nothing was reused)."""


def _layer(adapter: ModelAdapter, i: int, hidden: torch.Tensor, positions: torch.Tensor,
           kv: LayerKV | None = None, plan: AttentionPlan | None = None,
           in_place: bool = False) -> tuple[torch.Tensor, LayerKV]:
    """One decoder layer for the rows of `hidden` (tokens at `positions`). Without `kv`, the rows are
    the whole prompt and attend over their own fresh KV; with `kv` (the whole prompt's KV of this
    layer), their fresh K/V replace those rows (in `kv` itself when `in_place`) and they attend over
    the result."""
    x = adapter.input_norm(i, hidden)
    q, k, v = adapter.qkv(i, x, positions)
    if kv is not None:
        k, v = _blend(kv[0], k, positions, in_place), _blend(kv[1], v, positions, in_place)
    attn = attend_selected(q, k, v, positions, scale=adapter.scale, plan=plan)
    hidden = hidden + adapter.o_proj(i, attn.reshape(attn.shape[0], -1))
    hidden = hidden + adapter.mlp(i, adapter.post_norm(i, hidden))
    return hidden, (k, v)


def _blend(reused: torch.Tensor, fresh_rows: torch.Tensor, indices: torch.Tensor, in_place: bool) -> torch.Tensor:
    """`blend_kv`, or the same rows written into `reused` itself when `in_place`."""
    if not in_place:
        return blend_kv(reused, fresh_rows, indices)
    return reused.index_copy_(0, indices.to(device=reused.device, dtype=torch.long), fresh_rows.to(reused.dtype))


def prefill(adapter: ModelAdapter, token_ids: torch.Tensor | Sequence[int]) -> BlendResult:
    """A full prefill through the adapter (every token, every layer): what a segment's cached KV is
    (run on the segment alone, at positions 0..), and the reference the blended prefill is held to."""
    ids = _ids(adapter, token_ids)
    positions = torch.arange(ids.numel(), device=ids.device)
    hidden = adapter.embed(ids)
    kv: list[LayerKV] = []
    for i in range(adapter.num_layers):
        hidden, layer_kv = _layer(adapter, i, hidden, positions)
        kv.append(layer_kv)
    logits = adapter.lm_head(adapter.final_norm(hidden[-1:]))[0]
    return BlendResult(logits=logits, kv=kv, selected=positions, deviation=None)


def prefill_selected(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    reused_kv: Sequence[LayerKV],
    selected: torch.Tensor,
    *,
    in_place: bool,
    deviation: torch.Tensor | None = None,
) -> BlendResult:
    """The tokens at `selected` (sorted offsets, the last token among them) through every layer, their
    fresh K/V replacing the reused rows and their attention reading the whole blended KV: the forward
    of the modes that pick their tokens before the first layer (EPIC, guided)."""
    hidden = adapter.embed(ids.index_select(0, selected))
    plan = plan_attention(selected, ids.numel(), hidden.dtype)
    kv: list[LayerKV] = []
    for i in range(adapter.num_layers):
        hidden, layer_kv = _layer(adapter, i, hidden, selected, kv=reused_kv[i], plan=plan, in_place=in_place)
        kv.append(layer_kv)
    logits = adapter.lm_head(adapter.final_norm(hidden[-1:]))[0]
    return BlendResult(logits=logits, kv=kv, selected=selected, deviation=deviation)


def blend_prefill(
    adapter: ModelAdapter,
    token_ids: torch.Tensor | Sequence[int],
    reused_kv: Sequence[LayerKV],
    reused: torch.Tensor,
    *,
    ratio: float,
    check_layer: int = DEFAULT_CHECK_LAYER,
    exact: torch.Tensor | None = None,
    overwrite_reused: bool = False,
) -> BlendResult:
    """The prompt's prefill reusing `reused_kv[layer]` (rows valid where `reused` is True, K at the
    request's positions) and recomputing every other token plus the top `ratio` of the reused ones
    by K deviation at `check_layer` (reused tokens marked `exact` are kept as they are and do not
    count towards the ratio). With `overwrite_reused`, the blended rows are written into
    `reused_kv`'s own tensors from the check layer on (no copy of the whole prompt's KV per layer;
    for a caller that has no further use for them, as the served worker)."""
    ratio = validate_ratio(ratio)
    ids = _ids(adapter, token_ids)
    n = ids.numel()
    if not 0 < check_layer < adapter.num_layers:
        raise ValueError(f"check_layer {check_layer} must lie in [1, {adapter.num_layers})")
    reused = check_reused(adapter, ids, reused_kv, reused)

    # Below the check layer every token is computed, except those whose reused KV is exact (vLLM's
    # prefix hit, segments at their own place after their own context): their KV is already what
    # a full prefill gives, they are never recomputed, so their hidden states are never needed.
    skip = reused & exact.to(device=ids.device, dtype=torch.bool) if exact is not None else None
    rows = (~skip).nonzero(as_tuple=True)[0] if skip is not None and bool(skip.any()) else torch.arange(n, device=ids.device)
    partial = rows.numel() < n
    hidden = adapter.embed(ids.index_select(0, rows) if partial else ids)
    below = plan_attention(rows, n, hidden.dtype) if partial else None
    kv: list[LayerKV] = []
    for i in range(check_layer):
        if partial:
            hidden, layer_kv = _layer(adapter, i, hidden, rows, kv=reused_kv[i], plan=below, in_place=overwrite_reused)
        else:
            hidden, layer_kv = _layer(adapter, i, hidden, rows)
        kv.append(layer_kv)

    # the check layer: fresh Q/K/V of the computed rows, their deviation from the reused K, selection
    i = check_layer
    x = adapter.input_norm(i, hidden)
    q, k, v = adapter.qkv(i, x, rows)
    old_k, old_v = reused_kv[i]
    deviation = None
    if bool(reused.any()):
        fresh_dev = token_deviation(k, old_k.index_select(0, rows).to(k.dtype))
        deviation = torch.zeros(n, dtype=fresh_dev.dtype, device=k.device).index_copy_(0, rows, fresh_dev)
        deviation = torch.where(reused, deviation, torch.zeros((), device=k.device))
    selected = select_recompute(deviation if deviation is not None else torch.zeros(n), reused, ratio, exact).to(ids.device)
    # selected lies within rows (exact tokens are never chosen): where each sits among the rows
    at = torch.searchsorted(rows, selected) if partial else selected
    plan = plan_attention(selected, n, q.dtype)  # the same for every layer from here on
    k_all = _blend(old_k, k.index_select(0, at), selected, overwrite_reused)
    v_all = _blend(old_v, v.index_select(0, at), selected, overwrite_reused)
    attn = attend_selected(q.index_select(0, at), k_all, v_all, selected, scale=adapter.scale, plan=plan)
    hidden = hidden.index_select(0, at)
    hidden = hidden + adapter.o_proj(i, attn.reshape(attn.shape[0], -1))
    hidden = hidden + adapter.mlp(i, adapter.post_norm(i, hidden))
    kv.append((k_all, v_all))

    for i in range(check_layer + 1, adapter.num_layers):
        hidden, layer_kv = _layer(adapter, i, hidden, selected, kv=reused_kv[i], plan=plan, in_place=overwrite_reused)
        kv.append(layer_kv)
    logits = adapter.lm_head(adapter.final_norm(hidden[-1:]))[0]
    return BlendResult(logits=logits, kv=kv, selected=selected, deviation=deviation)


def check_reused(adapter: ModelAdapter, ids: torch.Tensor, reused_kv: Sequence[LayerKV], reused: torch.Tensor) -> torch.Tensor:
    """The reuse mask as bool on the prompt's device, after checking the reused KV's shapes against
    the model and that the prompt's last token is computed; ValueError saying what does not fit."""
    n = ids.numel()
    if len(reused_kv) != adapter.num_layers:
        raise ValueError(f"reused KV for {adapter.num_layers} layers expected, got {len(reused_kv)}")
    expected = (n, adapter.num_kv_heads, adapter.head_dim)
    for k, v in reused_kv:
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"reused K and V must be {expected} per layer, got {tuple(k.shape)} and {tuple(v.shape)}")
    reused = reused.to(device=ids.device, dtype=torch.bool)
    if reused.shape != (n,):
        raise ValueError(f"the reuse mask must be [{n}], got {tuple(reused.shape)}")
    if n and bool(reused[-1]):
        raise ValueError("the prompt's last token must be computed (it belongs to the query segment)")
    return reused


def place_segments(
    n_tokens: int,
    pieces: Sequence[tuple[int, Sequence[LayerKV]]],
    spec: RopeSpec,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[list[LayerKV], torch.Tensor]:
    """The per-layer reused KV of a prompt and its reuse mask, from cached segments: each piece is
    (the segment's start in the prompt, its per-layer KV computed at positions 0..). K is
    re-rotated to the prompt's positions; rows no piece covers are zero and not reused."""
    reused = torch.zeros(n_tokens, dtype=torch.bool, device=device)
    layers = [
        (torch.zeros(n_tokens, num_kv_heads, head_dim, dtype=dtype, device=device),
         torch.zeros(n_tokens, num_kv_heads, head_dim, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]
    starts, lengths = [], []
    for start, seg_kv in pieces:
        if len(seg_kv) != num_layers:
            raise ValueError(f"a cached segment needs KV for {num_layers} layers, got {len(seg_kv)}")
        length = seg_kv[0][0].shape[0]
        if start < 0 or start + length > n_tokens:
            raise ValueError(f"a segment of {length} tokens at {start} lies outside the prompt's {n_tokens}")
        if bool(reused[start : start + length].any()):
            raise ValueError(f"cached segments overlap at [{start}, {start + length})")
        reused[start : start + length] = True
        starts.append(start)
        lengths.append(length)
    if not pieces:
        return layers, reused
    # every piece's rows at once: one rotation (K from segment-local positions to the prompt's)
    # computed once and applied to each layer, one copy per layer
    at = torch.cat([torch.arange(s, s + n, device=reused.device) for s, n in zip(starts, lengths)])
    local = torch.cat([torch.arange(n, device=reused.device) for n in lengths])
    rotation = rerotation(local, at, spec, int(at.numel()), reused.device)
    for layer, (k_out, v_out) in enumerate(layers):
        k = torch.cat([seg_kv[layer][0] for _, seg_kv in pieces])
        v = torch.cat([seg_kv[layer][1] for _, seg_kv in pieces])
        k_out.index_copy_(0, at, apply_rerotation(k.to(reused.device), rotation, spec).to(dtype))
        v_out.index_copy_(0, at, v.to(device=reused.device, dtype=dtype))
    return layers, reused


def _ids(adapter: ModelAdapter, token_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=getattr(adapter, "device", None))
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"token ids must be a non-empty [tokens] sequence, got shape {tuple(ids.shape)}")
    return ids


class _LlamaModules:
    """What both adapters reach the same way: a Llama-family model's `model.embed_tokens`,
    `model.layers[i].{input_layernorm, post_attention_layernorm, mlp}` and `model.norm` (HF and
    vLLM name them alike); `_inner` and `_layers` are set by the subclass."""

    _inner: Any
    _layers: list

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._inner.embed_tokens(token_ids)

    def input_norm(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        return self._layers[layer].input_layernorm(hidden)

    def post_norm(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        return self._layers[layer].post_attention_layernorm(hidden)

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self._layers[layer].mlp(x)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._inner.norm(hidden)


class HFLlamaAdapter(_LlamaModules):
    """`ModelAdapter` over Hugging Face transformers' `LlamaForCausalLM` (also Qwen2, whose modules
    have the same names; Qwen3's `q_norm` / `k_norm` are applied where present)."""

    def __init__(self, model: Any) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self._apply_rope = apply_rotary_pos_emb
        self.model = model
        inner = model.model
        cfg = model.config
        self._inner = inner
        self._layers = list(inner.layers)
        self.num_layers = len(self._layers)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.scale = float(self._layers[0].self_attn.scaling)
        self.device = next(model.parameters()).device

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self._layers[layer].self_attn
        n = x.shape[0]
        q = attn.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = attn.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self._inner.rotary_emb(x[None], positions[None])
        # HF rotates [batch, heads, tokens, d] with cos/sin [batch, tokens, d]
        q, k = self._apply_rope(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        return q[0].transpose(0, 1), k[0].transpose(0, 1), v

    def o_proj(self, layer: int, attn: torch.Tensor) -> torch.Tensor:
        return self._layers[layer].self_attn.o_proj(attn)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)


class VLLMLlamaAdapter(_LlamaModules):
    """`ModelAdapter` over vLLM's `LlamaForCausalLM` (`vllm/model_executor/models/llama.py`) as the
    engine built it: its fused `qkv_proj`, its own `rotary_emb`, `o_proj`, RMSNorms, MLP and
    `compute_logits`; vLLM's paged `attn` is the one module not called (attention is
    `recompute.attend_selected`). Qwen2/Qwen3 share the module names (Qwen3's `q_norm` / `k_norm`
    are applied where present). Tensor parallelism of 1 only: the heads counted are the local ones."""

    def __init__(self, model: Any) -> None:
        self.model = model
        inner = model.model
        self._inner = inner
        self._layers = list(inner.layers)[inner.start_layer : inner.end_layer]
        if len(self._layers) != len(inner.layers):
            raise ValueError("the blended prefill needs every layer in this process (no pipeline parallelism)")
        attn = self._layers[0].self_attn
        self.num_layers = len(self._layers)
        self.num_heads = int(attn.num_heads)
        self.num_kv_heads = int(attn.num_kv_heads)
        self.head_dim = int(attn.head_dim)
        self.scale = float(attn.scaling)
        self.device = next(model.parameters()).device

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self._layers[layer].self_attn
        n = x.shape[0]
        qkv, _ = attn.qkv_proj(x)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q.reshape(n, self.num_heads, self.head_dim)).reshape(n, -1)
            k = attn.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim)).reshape(n, -1)
        q, k = attn.rotary_emb(positions, q.contiguous(), k.contiguous())
        return (q.reshape(n, self.num_heads, self.head_dim), k.reshape(n, self.num_kv_heads, self.head_dim),
                v.reshape(n, self.num_kv_heads, self.head_dim))

    def o_proj(self, layer: int, attn: torch.Tensor) -> torch.Tensor:
        out, _ = self._layers[layer].self_attn.o_proj(attn)
        return out

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)
