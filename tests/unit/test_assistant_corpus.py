"""The assistant corpus's prompt pool: deterministic, distinct, large, and a disjoint held-out split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "assistant_corpus.py"


@pytest.fixture(scope="module")
def corpus():
    spec = importlib.util.spec_from_file_location("assistant_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pool_is_deterministic_distinct_and_large(corpus):
    order = corpus.ordered_prompts()
    assert order == corpus.ordered_prompts()
    prompts = [p for _, p in order]
    assert len(prompts) == len(set(prompts)) >= 20_000
    assert len({corpus.prompt_id(p) for p in prompts}) == len(prompts)
    assert corpus.ordered_prompts(seed=1) != order


def test_held_out_split_is_disjoint_and_covers_the_kit_held_out(corpus):
    train, held = corpus.split()
    train_set, held_set = {p for _, p in train}, {p for _, p in held}
    assert not train_set & held_set
    assert len(train_set) + len(held_set) == len(corpus.ordered_prompts())
    assert 0.03 < len(held_set) / (len(train_set) + len(held_set)) < 0.08
    kit = corpus.kit_held_out()
    assert "What is the capital of France?" in kit and not kit & train_set
    assert corpus.held_out_prompts() == [p for _, p in held]


def test_a_prefix_of_the_order_mixes_every_family(corpus):
    train, _ = corpus.split()
    assert {f for f, _ in train[:200]} == set(corpus.families())


def test_selection_skips_answered_prompts_and_parts_roll_over(corpus, tmp_path):
    train, _ = corpus.split()
    have = {corpus.prompt_id(train[1][1])}
    chosen = corpus.select(train, 0, 3, have)
    assert [i for i, _, _ in chosen] == [0, 2, 3]
    writer = corpus.PartWriter(tmp_path, max_bytes=200)
    for i in range(5):
        writer.write({"id": str(i), "answer": "x" * 60, "output_token_ids": [1], "finish_reason": "stop"})
    writer.close()
    parts = corpus.read_parts(tmp_path)
    assert len(parts) > 1 and [r["id"] for _, rows in parts for r in rows] == [str(i) for i in range(5)]
    manifest = corpus.write_manifest(tmp_path, {"run": {"answers": 5}})
    assert manifest["answers"] == 5 and json.loads((tmp_path / "manifest.json").read_text())["runs"] == [{"answers": 5}]
