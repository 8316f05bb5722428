"""The question-guided blend mode on the tiny HF Llama of test_forward: ratio 1 is a full prefill,
ratio 0 keeps every reused row, the tokens it recomputes are those the question attends to most,
and recomputing them errs less on the question's logits than recomputing as many others."""

import pytest
import torch

from lmi_server.kvcache.blend import forward, guided
from lmi_server.kvcache.blend.recompute import query_attention
from tests.unit.kvcache.blend.test_forward import adapter, assert_same, cached_prompt, docs, hf_reference, model, spec  # noqa: F401

pytestmark = pytest.mark.unit


def test_query_attention_sums_each_querys_softmax_over_visible_keys():
    torch.manual_seed(1)
    q, k = torch.randn(3, 4, 8), torch.randn(10, 2, 8)
    positions = torch.tensor([7, 8, 9])
    mass = query_attention(q, k, positions, scale=0.5)
    assert mass.shape == (10,)
    assert torch.allclose(mass.sum(), torch.tensor(3.0 * 4))  # one unit per query and head
    early = query_attention(q[:1], k, torch.tensor([4]), scale=0.5)
    assert torch.all(early[5:] == 0) and torch.allclose(early.sum(), torch.tensor(4.0))  # causal
    with pytest.raises(ValueError, match="multiple"):
        query_attention(torch.randn(1, 3, 8), k, torch.tensor([9]))


def test_select_guided_takes_the_most_attended_candidates_and_everything_computed():
    reused = torch.tensor([True, True, True, True, False, False])
    mass = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.0, 0.0])
    assert guided.select_guided(mass, reused, 0.5).tolist() == [1, 3, 4, 5]
    exact = torch.tensor([False, True, False, False, False, False])
    assert guided.select_guided(mass, reused, 0.5, exact).tolist() == [2, 3, 4, 5]  # exact rows are kept
    assert guided.select_guided(mass, reused, 0.0).tolist() == [4, 5]
    with pytest.raises(ValueError, match="ratio"):
        guided.select_guided(mass, reused, 1.5)


@torch.no_grad()
def test_ratio_1_is_a_full_prefill(model, adapter, spec):  # noqa: F811
    ids, reused_kv, reused = cached_prompt(adapter, spec, docs(11), [2, 0, 1], [3, 4, 5])
    result = guided.guided_prefill(adapter, ids, reused_kv, reused, ratio=1.0)
    assert result.selected.tolist() == list(range(len(ids)))
    assert_same(result, *hf_reference(model, ids))


@torch.no_grad()
def test_ratio_0_keeps_every_reused_row_and_leaves_the_callers_kv_alone(adapter, spec):  # noqa: F811
    ids, reused_kv, reused = cached_prompt(adapter, spec, docs(12), [1, 2, 0], [3, 4, 5, 6])
    before = [(k.clone(), v.clone()) for k, v in reused_kv]
    r = guided.guided_prefill(adapter, ids, reused_kv, reused, ratio=0.0)
    assert r.selected.tolist() == (~reused).nonzero().flatten().tolist()
    for layer in range(adapter.num_layers):
        assert torch.equal(r.kv[layer][0][reused], before[layer][0][reused])
        assert torch.equal(reused_kv[layer][0], before[layer][0])  # not overwritten without overwrite_reused
    # the tail after the last reused token (the separator and the 4-token question) spends one unit of
    # attention per token, head and layer
    tail = len(ids) - 1 - int(reused.nonzero().flatten()[-1])
    assert tail == 6
    assert torch.allclose(r.deviation.sum(), torch.tensor(float(tail * adapter.num_heads * adapter.num_layers)))


@torch.no_grad()
def test_the_question_attended_tokens_err_less_than_as_many_others(adapter, spec):  # noqa: F811
    """The same number of reused tokens recomputed: those the question reads most against those it
    reads least. The logits of the question's last token are closer to the full prefill's."""
    errors = {"most": 0.0, "least": 0.0}
    for seed in range(8):
        ids, reused_kv, reused = cached_prompt(adapter, spec, docs(300 + seed), [1, 2, 0], [3, 4, 5, 6])
        full = forward.prefill(adapter, ids)
        mass = guided.question_mass(adapter, torch.tensor(ids), [(k.clone(), v.clone()) for k, v in reused_kv], reused)
        most = guided.select_guided(mass, reused, 0.25)
        least = guided.select_guided(torch.where(reused, -mass, mass), reused, 0.25)
        assert most.numel() == least.numel() and not torch.equal(most, least)
        for name, chosen in (("most", most), ("least", least)):
            r = _recompute(adapter, ids, reused_kv, chosen)
            errors[name] += float((r - full.logits).pow(2).sum().sqrt())
    assert errors["most"] < errors["least"]


def _recompute(adapter, ids, reused_kv, selected):
    """The last token's logits when `selected` goes through every layer over the blended KV."""
    kv = [(k.clone(), v.clone()) for k, v in reused_kv]
    ids_t = torch.tensor(ids)
    hidden = adapter.embed(ids_t.index_select(0, selected))
    plan = forward.plan_attention(selected, len(ids), hidden.dtype)
    for i in range(adapter.num_layers):
        hidden, _ = forward._layer(adapter, i, hidden, selected, kv=kv[i], plan=plan, in_place=True)
    return adapter.lm_head(adapter.final_norm(hidden[-1:]))[0]


def test_query_attention_in_blocks_equals_one_softmax_per_query_and_head():
    """Many queries (more than one block) with grouped KV heads: the same sums as a plain softmax of
    every query head over its KV head's keys."""
    from lmi_server.kvcache.blend import recompute

    torch.manual_seed(2)
    n, queries, heads, kv_heads, d = 90, recompute.MASS_BLOCK * 2 + 5, 6, 2, 8
    q, k = torch.randn(queries, heads, d), torch.randn(n, kv_heads, d)
    positions = torch.arange(n - queries, n)
    expected = torch.zeros(n)
    for i, pos in enumerate(positions.tolist()):
        for h in range(heads):
            scores = (k[: pos + 1, h // (heads // kv_heads)] @ q[i, h]) * 0.3
            expected[: pos + 1] += scores.softmax(-1)
    torch.testing.assert_close(query_attention(q, k, positions, scale=0.3), expected, atol=1e-5, rtol=1e-5)
