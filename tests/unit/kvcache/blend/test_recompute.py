"""Choosing the tokens to recompute at the check layer, and attention over blended KV."""

import math

import pytest
import torch

from lmi_server.kvcache.blend.recompute import (
    attend_selected,
    blend_kv,
    causal_mask,
    reuse_mask,
    select_recompute,
    token_deviation,
    validate_ratio,
)
from lmi_server.kvcache.blend.segments import Segment

HEADS, KV_HEADS, D = 6, 2, 16


def kv(n, seed=0, heads=KV_HEADS, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, heads, D, generator=g).to(dtype)


def full_attention(q, k, v):
    """Causal attention of every token, written out (softmax of scaled scores), GQA by head groups."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    n = q.shape[0]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).to(q.dtype)


@pytest.mark.parametrize("ok", [0, 0.0, 0.15, 1, "0.5"])
def test_ratio_in_zero_to_one(ok):
    assert validate_ratio(ok) == float(ok)


@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan"), "x", None, True])
def test_ratio_outside_is_refused(bad):
    with pytest.raises(ValueError, match="recompute ratio"):
        validate_ratio(bad)


def test_reused_tokens_are_those_of_hit_segments_but_the_query():
    segments = [Segment(0, tuple(range(10))), Segment(13, tuple(range(7))), Segment(23, tuple(range(7)))]
    mask = reuse_mask(30, segments, [True, False, True])
    assert mask[:10].all() and not mask[10:].any()  # separator gap, missed segment, query segment
    assert not reuse_mask(30, segments, [False, False, False]).any()
    with pytest.raises(ValueError):
        reuse_mask(30, segments, [True])
    with pytest.raises(ValueError):
        reuse_mask(20, segments, [True, True, True])


def test_identical_kv_has_zero_deviation_and_changes_show_where_they_are():
    k, v = kv(12), kv(12, seed=1)
    assert torch.equal(token_deviation(k, k.clone(), v, v.clone()), torch.zeros(12))
    k2, v2 = k.clone(), v.clone()
    k2[3] += 1.0
    v2[7] -= 2.0
    dev = token_deviation(k2, k, v2, v)
    assert dev.nonzero().flatten().tolist() == [3, 7]
    torch.testing.assert_close(dev[3], torch.tensor(math.sqrt(KV_HEADS * D)))
    assert token_deviation(k2, k).nonzero().flatten().tolist() == [3]
    with pytest.raises(ValueError):
        token_deviation(k, k[:5])
    with pytest.raises(ValueError):
        token_deviation(k, k, v)


def test_selection_takes_the_most_deviating_reused_tokens_and_every_other_token():
    n = 30
    reused = torch.zeros(n, dtype=torch.bool)
    reused[:20] = True  # tokens 20..29: missed segment and query
    deviation = torch.zeros(n)
    deviation[[4, 11, 17]] = torch.tensor([3.0, 1.0, 2.0])
    deviation[25] = 100.0  # not reused: always selected, never takes a reused token's place
    # 15 % of 20 reused = 3
    assert select_recompute(deviation, reused, 0.15).tolist() == [4, 11, 17] + list(range(20, 30))
    assert select_recompute(deviation, reused, 0.1).tolist() == [4, 17] + list(range(20, 30))
    assert select_recompute(deviation, reused, 0.0).tolist() == list(range(20, 30))
    assert select_recompute(deviation, reused, 1.0).tolist() == list(range(n))
    # ties: the earlier token first; a tiny ratio still recomputes one reused token
    assert select_recompute(torch.zeros(n), reused, 0.01).tolist() == [0] + list(range(20, 30))
    with pytest.raises(ValueError):
        select_recompute(deviation, reused, 1.5)
    with pytest.raises(ValueError):
        select_recompute(deviation, reused[:5], 0.5)


def test_blend_kv_replaces_the_selected_rows_only():
    reused, fresh = kv(10), kv(10, seed=5)
    idx = torch.tensor([2, 7])
    out = blend_kv(reused, fresh.index_select(0, idx), idx)
    assert torch.equal(out[idx], fresh[idx])
    keep = [i for i in range(10) if i not in (2, 7)]
    assert torch.equal(out[keep], reused[keep])
    assert not torch.equal(reused[idx], fresh[idx])  # the input is left as it was
    with pytest.raises(ValueError):
        blend_kv(reused, fresh, idx)


def test_causal_mask():
    assert causal_mask(torch.tensor([0, 2]), 4).tolist() == [[True, False, False, False], [True, True, True, False]]


@pytest.mark.parametrize("kv_heads", [KV_HEADS, HEADS])
def test_recomputing_every_token_is_full_attention(kv_heads):
    n = 40
    q, k, v = kv(n, 1, heads=HEADS), kv(n, 2, heads=kv_heads), kv(n, 3, heads=kv_heads)
    everything = select_recompute(torch.rand(n), torch.ones(n, dtype=torch.bool), 1.0)
    out = attend_selected(q[everything], k, v, everything)
    torch.testing.assert_close(out, full_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_selected_queries_get_their_rows_of_full_attention():
    n = 40
    q, k, v = kv(n, 1, heads=HEADS), kv(n, 2), kv(n, 3)
    sel = torch.tensor([0, 5, 21, 39])
    torch.testing.assert_close(attend_selected(q[sel], k, v, sel), full_attention(q, k, v)[sel], atol=1e-5, rtol=1e-5)
    assert attend_selected(q[:0], k, v, sel[:0]).shape == (0, HEADS, D)


def test_a_blend_step_with_enough_recompute_restores_full_attention():
    """Reused KV wrong in a few rows; recomputing those rows (found by deviation) and the query
    makes the query's attention the same as with fresh KV everywhere."""
    n, query = 32, list(range(28, 32))
    fresh_k, fresh_v, q = kv(n, 7), kv(n, 8), kv(n, 9, heads=HEADS)
    reused_k, reused_v = fresh_k.clone(), fresh_v.clone()
    wrong = [3, 15, 22]
    reused_k[wrong] += 0.5
    reused_v[wrong] -= 0.5
    reused = torch.ones(n, dtype=torch.bool)
    reused[query] = False
    sel = select_recompute(token_deviation(fresh_k, reused_k, fresh_v, reused_v), reused, 3 / 28)
    assert sel.tolist() == wrong + query
    k = blend_kv(reused_k, fresh_k.index_select(0, sel), sel)
    v = blend_kv(reused_v, fresh_v.index_select(0, sel), sel)
    assert torch.equal(k, fresh_k) and torch.equal(v, fresh_v)
    out = attend_selected(q[sel], k, v, sel)
    torch.testing.assert_close(out, full_attention(q, fresh_k, fresh_v)[sel], atol=1e-5, rtol=1e-5)


def test_bfloat16_attention():
    n = 24
    q, k, v = (kv(n, s, heads=h, dtype=torch.bfloat16) for s, h in ((1, HEADS), (2, KV_HEADS), (3, KV_HEADS)))
    idx = torch.arange(n)
    out = attend_selected(q, k, v, idx)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), full_attention(q.float(), k.float(), v.float()), atol=2e-2, rtol=2e-2)


def test_bad_attention_inputs_are_refused():
    q, k = kv(4, heads=HEADS), kv(4)
    with pytest.raises(ValueError):
        attend_selected(q, k, k, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError):
        attend_selected(q, k, k, torch.tensor([0, 1, 2, 4]))
    with pytest.raises(ValueError):
        attend_selected(kv(4, heads=5), k, k, torch.arange(4))


def test_exact_tokens_are_kept_and_do_not_count_towards_the_ratio():
    n = 30
    reused = torch.zeros(n, dtype=torch.bool)
    reused[:20] = True
    deviation = torch.arange(n, dtype=torch.float32).flip(0)  # the earliest tokens deviate most
    exact = torch.zeros(n, dtype=torch.bool)
    exact[:10] = True  # cached after the very same prefix: nothing to correct there
    chosen = select_recompute(deviation, reused, 0.2, exact).tolist()
    assert chosen == [10, 11] + list(range(20, 30))  # 20 % of the 10 candidates, none of the exact ones
    assert select_recompute(deviation, reused, 1.0, exact).tolist() == list(range(10, 30))
    with pytest.raises(ValueError, match="exact mask"):
        select_recompute(deviation, reused, 0.2, exact[:5])
