#!/usr/bin/env python
"""The multi-passage QA file that LMCache's `rag-qa-quality` reads in `benchmarks/lmcache_bench.py`:
facts planted in made-up places, kept only where the built-in assistant finds the answer when
given the whole prompt.

Why: LMCache's yardstick needs questions the served model can answer from the full prompt, or a
blend mode's loss cannot show (a 135M assistant misses many questions of any public set even with
every passage prefilled). Each place gets one short document (plain filler sentences and three
planted facts); a sample asks one fact of one place, over its document and three others in a
seeded order, so every document is reused by several samples in other positions.

Selection runs LMCache's own workload (`lmcache bench engine --workload rag-qa-quality`, no
warm-up, a fresh cache salt per request: every answer a full prefill) against the built-in
assistant, and keeps the samples whose answer contains the gold one, in order, up to `--keep`.

    python benchmarks/rag_qa_dataset.py      # writes benchmarks/data/rag_qa_answerable.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.body_proxy import BodyProxy  # noqa: E402
from benchmarks.common import builtin_server, free_port  # noqa: E402

OUT = REPO / "benchmarks" / "data" / "rag_qa_answerable.jsonl"

PLACES = [
    "Orvane", "Kessler Mill", "Velmora", "Dunhollow", "Lake Ferin", "Brannock School", "Saltmarsh Road",
    "Tamsin Observatory", "Harrow Bridge", "Mirefield", "Caddon Abbey", "Pellow Farm", "Greywick",
    "Ashcombe Harbour", "Lindle Forest", "Quarry Hill", "Fennick Chapel", "Roscoe Market", "Elderby",
    "Wexley Castle",
]
FIRST = ["Tilda", "Jonas", "Ada", "Milo", "Edgar", "Rosa", "Felix", "Nora", "Hugo", "Iris", "Oscar", "Clara"]
LAST = ["Marsh", "Brill", "Quill", "Vance", "Lowe", "Hart", "Penn", "Cole", "Reed", "Frost", "Wade", "Lark"]
FACTS = [
    ("person", "{place} is looked after by {value}.", "Who looks after {place}?",
     lambda rng: f"{rng.choice(FIRST)} {rng.choice(LAST)}"),
    ("colour", "The doors of {place} are painted {value}.", "What colour are the doors of {place}?",
     lambda rng: rng.choice(["red", "blue", "green", "yellow", "black", "white"])),
    ("animal", "The symbol of {place} is a {value}.", "What animal is the symbol of {place}?",
     lambda rng: rng.choice(["owl", "fox", "heron", "badger", "stag", "otter"])),
    ("food", "{place} is famous for its {value}.", "What is {place} famous for?",
     lambda rng: rng.choice(["plum cake", "smoked fish", "honey", "goat cheese", "apple cider", "rye bread"])),
    ("tree", "A tall {value} tree stands next to {place}.", "What tree stands next to {place}?",
     lambda rng: rng.choice(["oak", "willow", "birch", "chestnut", "pine", "elm"])),
    ("instrument", "Every Sunday a {value} is played at {place}.", "What instrument is played at {place} every Sunday?",
     lambda rng: rng.choice(["violin", "harp", "flute", "drum", "cello", "trumpet"])),
]
FILLER = [
    "The weather there is often windy and wet in the autumn months.", "Visitors come in the summer to walk and rest.",
    "The people there are quiet and friendly to strangers.", "Old stone houses line the narrow streets.",
    "In winter the days are short and the nights are long.", "A small bus stops there twice a day.",
    "The local bakery opens early every morning.", "Many families have lived there for a long time.",
    "A narrow path leads down to the water.", "Children walk to school along the main road.",
    "The post office closes at noon on Saturdays.", "Fog often covers the hills in the early morning.",
]


def documents(rng: random.Random, facts_per_place: int) -> tuple[list[dict], list[dict]]:
    """One document per place (filler around the planted facts); the question of every fact."""
    docs, questions = [], []
    for i, place in enumerate(PLACES):
        planted = rng.sample(FACTS, facts_per_place)
        sentences = rng.sample(FILLER, 7)
        for kind, statement, question, value_of in planted:
            value = value_of(rng)
            fact = statement.format(place=place, value=value).replace(" a o", " an o")  # "an owl", "an otter"
            sentences.insert(rng.randint(1, len(sentences)), fact)
            questions.append({"doc": i, "kind": kind, "question": question.format(place=place), "answer": value})
        half = len(sentences) // 2
        text = " ".join(sentences[:half]) + "\n\n" + " ".join(sentences[half:])
        docs.append({"title": place, "text": f"{place} is a place in the northern valley. {text}"})
    return docs, questions


def candidates(seed: int, passages: int, facts_per_place: int) -> list[dict]:
    """Every planted fact as one LMCache QA record: its document and `passages - 1` others, shuffled."""
    rng = random.Random(seed)
    docs, questions = documents(rng, facts_per_place)
    rng.shuffle(questions)
    records = []
    for n, q in enumerate(questions):
        others = rng.sample([i for i in range(len(docs)) if i != q["doc"]], passages - 1)
        order = [q["doc"], *others]
        rng.shuffle(order)
        records.append({"id": f"fact-{n:03d}-{q['kind']}", "question": q["question"], "answers": [q["answer"]],
                        "ctxs": [docs[i] for i in order]})
    return records


def answered(records: list[dict], work: Path, max_output: int, seed: int) -> list[dict]:
    """Per record, LMCache's workload over the whole prompt: the answer and whether it holds the gold."""
    from benchmarks.lmcache_bench import run_workload, score_texts

    path = work / "candidates.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {"OPTION_LMCACHE_AUTO_CONFIG": "true"}
    counter = itertools.count()
    with builtin_server("rag-select", work, env) as server:
        served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
        (work / served["id"]).symlink_to(served["root"])  # LMCache loads the tokenizer by the served name
        with BodyProxy(server.url, free_port(), lambda: {"cache_salt": f"select-{next(counter)}"}) as proxy:
            run_workload(proxy.url, served["id"], "rag-qa-quality",
                         ["--rag-dataset", str(path), "--rag-num-samples", str(len(records)), "--no-warmup",
                          "--rag-max-output-length", str(max_output), "--rag-output", str(work / "select.json")],
                         work, seed)
        return score_texts(proxy.texts, path, len(records))["per_sample"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--passages", type=int, default=4)
    ap.add_argument("--facts-per-place", type=int, default=3)
    ap.add_argument("--keep", type=int, default=32)
    ap.add_argument("--max-output", type=int, default=24, help="as lmcache_bench.py's --rag-max-output")
    ap.add_argument("--bench-seed", type=int, default=42, help="as lmcache_bench.py's --seed")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    records = candidates(args.seed, args.passages, args.facts_per_place)
    work = Path(tempfile.mkdtemp(prefix="lmi-rag-select-"))
    scored = answered(records, work, args.max_output, args.bench_seed)
    kept = [r for r, s in zip(records, scored) if s["contains"]][: args.keep]
    args.out.write_text("".join(json.dumps(r) + "\n" for r in kept))
    print(f"{len(kept)} of {len(records)} candidates answered from the full prompt; wrote {args.out}")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
