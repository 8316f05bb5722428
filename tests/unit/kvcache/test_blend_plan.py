"""The scheduler's blend plan: which prompt tokens come from cached segments, which are computed,
what the connector reports to vLLM, and what is stored after the forward (fake lookups)."""

from __future__ import annotations

import pytest

from lmi_server.kvcache.blend.plan import PENDING, plan_prompt
from lmi_server.kvcache.blend.segments import SegmentationError

SEP = (900, 901)
CHUNK = 4


def prompt(*segments: list[int]) -> list[int]:
    out: list[int] = []
    for seg in segments:
        out += list(SEP) + seg
    return out


def cache_of(*stored: list[int]):
    """A lookup that answers whole chunks of each stored segment's head."""
    table = [tuple(s) for s in stored]

    def lookup(tokens):
        best = 0
        for s in table:
            n = 0
            while n + CHUNK <= min(len(s), len(tokens)) and s[: n + CHUNK] == tuple(tokens[: n + CHUNK]):
                n += CHUNK
            best = max(best, n)
        return best

    return lookup


DOC_A, DOC_B, DOC_C = list(range(10, 18)), list(range(20, 30)), list(range(40, 48))


def test_documents_seen_before_are_reused_in_any_order_and_the_rest_is_computed():
    lookup = cache_of(DOC_A, DOC_C)
    tokens = prompt(DOC_C, DOC_B, DOC_A)
    plan = plan_prompt(tokens, SEP, lookup, recompute_ratio=0.25, chunk_size=CHUNK, min_reused_tokens=1)
    assert [(s.length, s.cached) for s in plan.segments] == [(8, 8), (10, 0), (8, 8)]
    c_start, a_start = 2, 2 + 8 + 2 + 10 + 2
    last = len(tokens) - 1  # DOC_A's last token ends the prompt: vLLM computes it itself
    assert plan.reused_offsets() == list(range(c_start, c_start + 8)) + list(range(a_start, last))
    assert plan.reused_tokens == 15 and plan.computed_tokens == len(tokens) - 15
    assert plan.external_tokens == len(tokens) - 1
    assert plan.recomputed_tokens == 4  # ceil(0.25 x 15)
    assert [s.length for s in plan.to_store(CHUNK)] == [10]  # B missed: stored for the next prompt
    assert plan.to_dict()["segments"][1] == {"start": 2 + 8 + 2, "length": 10, "cached": 0, "exact": False}


def test_a_partial_hit_reuses_whole_chunks_and_stores_the_rest():
    lookup = cache_of(DOC_B[:4] + [99] * 6)
    plan = plan_prompt(prompt(DOC_A, DOC_B) + [7], SEP, lookup, recompute_ratio=0.0, chunk_size=CHUNK, min_reused_tokens=1)
    assert [(s.length, s.cached) for s in plan.segments] == [(8, 0), (11, 4)]
    assert plan.reused_tokens == 4 and plan.recomputed_tokens == 0
    assert [s.length for s in plan.to_store(CHUNK)] == [8, 11]


def test_blending_is_skipped_where_it_would_not_pay():
    lookup = cache_of(DOC_A)
    one_segment = DOC_A + DOC_B  # no separator: prefix caching covers it
    assert plan_prompt(one_segment, SEP, lookup, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=1) is None
    tokens = prompt(DOC_B, DOC_A, [5])
    assert plan_prompt(tokens, SEP, lookup, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=9) is None
    assert plan_prompt(tokens, SEP, lookup, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=8) is not None


def test_segments_shorter_than_a_chunk_are_not_looked_up():
    asked = []

    def lookup(tokens):
        asked.append(tuple(tokens))
        return 0

    plan_prompt(prompt([1, 2], DOC_A), SEP, lookup, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=0)
    assert asked == [tuple(DOC_A)]


def test_a_pending_lookup_asks_again_later():
    answers = {tuple(DOC_A): None, tuple(DOC_B): 8}
    tokens = prompt(DOC_A, DOC_B)
    assert plan_prompt(tokens, SEP, lambda t: answers[tuple(t)], recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=1) is PENDING
    answers[tuple(DOC_A)] = 8
    assert plan_prompt(tokens, SEP, lambda t: answers[tuple(t)], recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=1).reused_tokens == 16  # B: 8 of 10, its tail computed


@pytest.mark.parametrize("answer", [3, 9, -4, 12])
def test_an_answer_that_is_not_whole_chunks_of_the_segment_is_an_error(answer):
    with pytest.raises(SegmentationError, match="not whole chunks"):
        plan_prompt(prompt(DOC_A, DOC_C), SEP, lambda t: answer, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=0)


def test_a_bad_ratio_is_refused():
    with pytest.raises(ValueError):
        plan_prompt(prompt(DOC_A, DOC_C), SEP, cache_of(), recompute_ratio=1.5, chunk_size=CHUNK)


def test_boundaries_the_request_gives_replace_the_separator():
    lookup = cache_of(DOC_A, DOC_B)
    tokens = DOC_B + DOC_A + [5, 6]
    assert plan_prompt(tokens, SEP, lookup, recompute_ratio=0.0, chunk_size=CHUNK, min_reused_tokens=1) is None
    plan = plan_prompt(tokens, SEP, lookup, recompute_ratio=0.0, chunk_size=CHUNK, min_reused_tokens=1,
                       boundaries=[0, 10, 18])
    assert [(s.start, s.length, s.cached) for s in plan.segments] == [(0, 10, 8), (10, 8, 8), (18, 2, 0)]
    assert plan.reused_tokens == 16
