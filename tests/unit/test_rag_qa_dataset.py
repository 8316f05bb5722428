"""The QA file generator behind `benchmarks/lmcache_bench.py`'s rag-qa-quality arms: every question's
answer is planted in exactly one of its passages, the one about the place it names, in a seeded order."""

import json

from benchmarks.rag_qa_dataset import OUT, candidates


def test_each_question_has_its_answer_in_the_passage_of_the_place_it_names():
    records = candidates(seed=7, passages=4, facts_per_place=3)
    assert len(records) == 60 and len({r["id"] for r in records}) == 60
    positions = set()
    for r in records:
        assert len(r["ctxs"]) == 4 and len({c["title"] for c in r["ctxs"]}) == 4
        own = [i for i, c in enumerate(r["ctxs"]) if c["title"] in r["question"]]
        assert len(own) == 1, r["question"]
        assert r["answers"][0] in r["ctxs"][own[0]]["text"]
        positions.add(own[0])
    assert positions == {0, 1, 2, 3}  # the answer's passage is not always first
    assert candidates(seed=7, passages=4, facts_per_place=3) == records


def test_the_committed_file_holds_only_generated_questions():
    generated = {r["id"]: r for r in candidates(seed=7, passages=4, facts_per_place=3)}
    kept = [json.loads(line) for line in OUT.read_text().splitlines()]
    assert kept and all(generated[r["id"]] == r for r in kept)
