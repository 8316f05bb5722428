"""The EPIC blend mode: which tokens it recomputes (the first k of each span of reused tokens, all
that was not reused), and its prefill against a full one on the tiny HF Llama of test_forward:
k covering every span is a full prefill, k = 0 keeps every reused row, and a few tokens per span err
less than none."""

import pytest
import torch

from lmi_server.kvcache.blend import epic, forward
from lmi_server.kvcache.blend.modes import recomputed_count, validate_epic_tokens, validate_mode
from tests.unit.kvcache.blend.test_forward import adapter, assert_same, cached_prompt, docs, hf_reference, model, spec  # noqa: F401

pytestmark = pytest.mark.unit


def mask(bits: str) -> torch.Tensor:
    return torch.tensor([c == "1" for c in bits])


def test_span_heads_are_the_first_k_of_each_run():
    assert epic.span_heads(mask("0111100111"), 2).tolist() == [c == "1" for c in "0110000110"]
    assert epic.span_heads(mask("1110111"), 5).tolist() == [c == "1" for c in "1110111"]
    assert not epic.span_heads(mask("0111"), 0).any()
    assert not epic.span_heads(mask("0000"), 3).any()


def test_select_epic_computes_what_was_not_reused_and_the_heads_of_inexact_spans():
    reused = mask("011111101110")
    exact = mask("011000000000")  # vLLM's prefix: kept, not a span
    assert epic.select_epic(reused, 2, exact).tolist() == [0, 3, 4, 7, 8, 9, 11]
    assert epic.select_epic(reused, 0, exact).tolist() == [0, 7, 11]


def test_the_schedulers_count_matches_the_selection():
    candidates = "0111100111011111"
    for k in (0, 1, 2, 3, 10):
        assert recomputed_count([c == "1" for c in candidates], k) == int(epic.span_heads(mask(candidates), k).sum())


def test_bad_modes_and_token_counts_are_refused():
    assert validate_mode("epic") == "epic"
    for bad in ("EPIC", "", None, 1):
        with pytest.raises(ValueError, match="blend mode"):
            validate_mode(bad)
    for bad in (-1, 4097, 1.5, True, "8"):
        with pytest.raises(ValueError, match="EPIC token count"):
            validate_epic_tokens(bad)


@torch.no_grad()
def test_enough_tokens_per_span_is_a_full_prefill(model, adapter, spec):  # noqa: F811
    ids, reused_kv, reused = cached_prompt(adapter, spec, docs(7), [2, 0, 1], [3, 4, 5])
    result = epic.epic_prefill(adapter, ids, reused_kv, reused, tokens=1000)
    assert result.selected.tolist() == list(range(len(ids)))
    assert_same(result, *hf_reference(model, ids))


@torch.no_grad()
def test_k0_keeps_every_reused_row_and_a_few_tokens_err_less(adapter, spec):  # noqa: F811
    errors = {0: 0.0, 4: 0.0}
    for seed in range(6):
        ids, reused_kv, reused = cached_prompt(adapter, spec, docs(200 + seed), [1, 2, 0], [3, 4, 5, 6])
        full = forward.prefill(adapter, ids)
        for k in errors:
            kv = [(a.clone(), b.clone()) for a, b in reused_kv]
            r = epic.epic_prefill(adapter, ids, kv, reused, tokens=k)
            if k == 0:
                assert r.selected.tolist() == (~reused).nonzero().flatten().tolist()
                for layer in range(adapter.num_layers):
                    assert torch.equal(r.kv[layer][0][reused], reused_kv[layer][0][reused])
            errors[k] += float(sum((a - fa).pow(2).sum() for (a, _), (fa, _) in zip(r.kv, full.kv)).sqrt())
    assert 0 < errors[4] < errors[0]


def test_bad_inputs_are_refused(adapter):  # noqa: F811
    kv = [(torch.zeros(4, adapter.num_kv_heads, adapter.head_dim),) * 2 for _ in range(adapter.num_layers)]
    with pytest.raises(ValueError, match="last token"):
        epic.epic_prefill(adapter, [1, 2, 3, 4], kv, torch.tensor([True] * 4), tokens=2)
    with pytest.raises(ValueError, match="EPIC token count"):
        epic.epic_prefill(adapter, [1, 2, 3, 4], kv, torch.zeros(4, dtype=torch.bool), tokens=-1)
