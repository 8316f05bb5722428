"""RAG with reordered documents on the served product: KV blending (CacheBlend) against prefix-only
reuse, TTFT and answer quality, side by side in one run.

Workload: a system prompt of about 1,000 tokens, then six documents of about 1,000 tokens each, each
after the blend separator, then the separator and a question; every request holds the same six
documents in another order (a seeded permutation per question). The documents are built here from
the assistant's own committed answers (`lmi_server/demo/assistant/corpus/`) with four invented
facts planted in each (a town's founding year, founder, river, export...), so every question has
one gold answer found in exactly one document. Before the measured requests each server sees the
documents once, in their own order (what "documents seen before" means: that request stores them).

Two servers, one after the other, on the built-in assistant (float32), with LMCache's auto plan:
  prefix      blending off: LMCache and vLLM reuse the prefix (the system prompt), the documents
              are prefilled again on every request. Its answers are the full-prefill reference.
  blend-R     option.lmcache_blend=true, each request asking for recompute ratio R (0, 0.05, 0.15,
              0.30, and 1, where every reused token is recomputed: the blend path's own ceiling) in
              its `kv_transfer_params`; the same documents stored once serve every ratio.

Reported per configuration: TTFT p50/mean over the questions (streaming, first content chunk),
the prompt tokens the usage reports as cached, answer accuracy (the gold answer appears in the
answer, case- and punctuation-insensitive) and token F1 against the gold answer, and, for the
blended ones, how many greedy answers are identical to the reference's.

    python benchmarks/blend_rag.py                       # results/blend_rag.{json,png}
    python benchmarks/blend_rag.py --questions 6 --ratios 0.15   # a quick look
    python benchmarks/blend_rag.py --plot-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from benchmarks.common import RESULTS, Server, free_port, machine, save, stream_completion  # noqa: E402

SEPARATOR = " # # "
CORPUS = Path(__file__).resolve().parents[1] / "lmi_server" / "demo" / "assistant" / "corpus"
TOWNS = ["Velmora", "Drastin", "Quellholm", "Orvanne", "Tibrask", "Lunetta"]
FIRST = ["Aldric", "Maren", "Tobias", "Ilse", "Corwin", "Petra", "Anselm", "Rhea", "Dorian", "Selma", "Jorund", "Vesna"]
LAST = ["Holloway", "Brenner", "Castellan", "Mirov", "Ashdown", "Kettering", "Valdez", "Orlov", "Lindqvist", "Marsh"]
RIVERS = ["Sable", "Wenning", "Cardle", "Oresund", "Tavish", "Ilmar", "Brooke", "Kessel"]
EXPORTS = ["copper wire", "blue glass", "salted herring", "wool blankets", "clock springs", "pear brandy",
           "roof slate", "paper lanterns"]
FACTS = (
    ("year", "{town} was founded in the year {year}.", "In what year was {town} founded?"),
    ("founder", "The founder of {town} was {founder}.", "Who founded {town}?"),
    ("river", "{town} lies on the banks of the {river} River.", "On which river does {town} lie?"),
    ("export", "The main export of {town} is {export}.", "What is the main export of {town}?"),
)


SUBJECTS = (
    # one subject per document, each fact worded so that its question names it alone: the model
    # only has to find the statement, not tell six alike documents apart
    ("the Harrow Point lighthouse", (
        ("year", "The Harrow Point lighthouse was built in {year}.", "In what year was the Harrow Point lighthouse built?"),
        ("person", "The keeper of the Harrow Point lighthouse is {person}.", "Who is the keeper of the Harrow Point lighthouse?"),
        ("colour", "The Harrow Point lighthouse is painted {colour}.", "What colour is the Harrow Point lighthouse painted?"),
        ("animal", "A {animal} lives in the lantern room of the lighthouse.", "Which animal lives in the lantern room of the lighthouse?"),
    )),
    ("the bakery on Mill Lane", (
        ("food", "The bakery on Mill Lane is famous for its {food}.", "What is the bakery on Mill Lane famous for?"),
        ("person", "The baker who owns the shop is {person}.", "Who is the baker who owns the shop?"),
        ("hour", "The bakery opens every morning at {hour} o'clock.", "At what hour does the bakery open?"),
        ("fuel", "The bread oven is heated with {fuel}.", "What is the bread oven heated with?"),
    )),
    ("the cargo ship Northern Star", (
        ("person", "The captain of the Northern Star is {person}.", "Who is the captain of the Northern Star?"),
        ("cargo", "The Northern Star carries {cargo}.", "What does the Northern Star carry?"),
        ("port", "The home port of the ship is {port}.", "What is the home port of the ship?"),
        ("number", "The ship has a crew of {number} sailors.", "How many sailors are in the crew of the ship?"),
    )),
    ("the Museum of Clocks", (
        ("person", "The curator of the Museum of Clocks is {person}.", "Who is the curator of the Museum of Clocks?"),
        ("object", "The oldest piece in the museum is a {object}.", "What is the oldest piece in the museum?"),
        ("day", "The museum is closed on {day}.", "On which day is the museum closed?"),
        ("price", "A ticket to the museum costs {price} dollars.", "How many dollars does a museum ticket cost?"),
    )),
    ("the Greywater mountain pass", (
        ("height", "The Greywater pass rises to {height} metres.", "How many metres high does the Greywater pass rise?"),
        ("month", "Snow closes the pass every year in {month}.", "In which month does snow close the pass?"),
        ("person", "The guide who leads walkers over the pass is {person}.", "Who is the guide who leads walkers over the pass?"),
        ("tree", "The slopes below the pass are covered in {tree} trees.", "Which trees cover the slopes below the pass?"),
    )),
    ("the village library", (
        ("person", "The librarian of the village library is {person}.", "Who is the librarian of the village library?"),
        ("number", "The library holds {number} books.", "How many books does the library hold?"),
        ("instrument", "On Fridays a {instrument} player performs in the reading room.", "Which instrument is played in the reading room on Fridays?"),
        ("game", "The chess club meets in the library to play {game}.", "What game does the club in the library play?"),
    )),
)
VALUES = {
    "year": lambda rng: str(rng.randint(1100, 1899)),
    "person": lambda rng: f"{rng.choice(FIRST)} {rng.choice(LAST)}",
    "colour": lambda rng: rng.choice(["red and white", "green", "yellow", "black and gold"]),
    "animal": lambda rng: rng.choice(["grey owl", "tabby cat", "tortoise", "raven"]),
    "food": lambda rng: rng.choice(["rye bread", "cinnamon rolls", "lemon tarts", "pretzels"]),
    "hour": lambda rng: rng.choice(["five", "six", "seven"]),
    "fuel": lambda rng: rng.choice(["beech wood", "coal", "olive pits"]),
    "cargo": lambda rng: rng.choice(["timber", "coffee beans", "iron ore", "rice"]),
    "port": lambda rng: rng.choice(["Lisbon", "Bergen", "Halifax", "Genoa"]),
    "number": lambda rng: str(rng.randint(12, 95)),
    "object": lambda rng: rng.choice(["water clock", "sundial", "pendulum clock", "hourglass"]),
    "day": lambda rng: rng.choice(["Monday", "Tuesday", "Wednesday"]),
    "price": lambda rng: str(rng.randint(3, 19)),
    "height": lambda rng: str(rng.randint(1500, 2900)),
    "month": lambda rng: rng.choice(["October", "November", "December"]),
    "tree": lambda rng: rng.choice(["pine", "birch", "larch", "oak"]),
    "instrument": lambda rng: rng.choice(["violin", "harp", "cello", "flute"]),
    "game": lambda rng: rng.choice(["chess", "draughts", "backgammon"]),
}


# The parts the documents are drawn from: fixed, so the workload stays the same as the corpus grows.
CORPUS_PARTS = ("part-0000.jsonl", "part-0001.jsonl", "part-0002.jsonl")


def corpus_answers() -> list[str]:
    rows = []
    for part in (CORPUS / name for name in CORPUS_PARTS):
        rows += [json.loads(line) for line in part.read_text().splitlines() if line.strip()]
    return [r["answer"].replace("#", "") for r in rows if r.get("finish_reason") == "stop" and len(r["answer"]) > 200]


def build_documents(tokenizer, n_docs: int, doc_tokens: int, seed: int, facts: str = "towns") -> tuple[list[str], list[dict]]:
    """n_docs documents of about doc_tokens tokens of corpus text, each with its subject's four facts
    planted at random places; the questions with their gold answers. `facts`: "towns" (six alike
    documents, a town each with the same four kinds of fact: what this benchmark serves) or
    "subjects" (six different subjects, `SUBJECTS`; benchmarks/blend_fidelity.py)."""
    rng = random.Random(seed)
    answers = corpus_answers()
    rng.shuffle(answers)
    docs, questions = [], []
    for i in range(n_docs):
        if facts == "towns":
            town = TOWNS[i]
            values = {"town": town, "year": str(rng.randint(1100, 1899)), "river": rng.choice(RIVERS),
                      "founder": f"{rng.choice(FIRST)} {rng.choice(LAST)}", "export": rng.choice(EXPORTS)}
            title, planted = f"Notes on {town}.", [(k, s.format(**values), q.format(**values), values[k]) for k, s, q in FACTS]
        else:
            subject, templates = SUBJECTS[i]
            values = {key: VALUES[key](rng) for key, _, _ in templates}
            title, planted = f"Notes on {subject}.", [(k, s.format(**values), q, values[k]) for k, s, q in templates]
        paragraphs = [title]
        while len(tokenizer.encode("\n\n".join(paragraphs))) < doc_tokens:
            paragraphs.append(answers.pop())
        for key, statement, question, gold in planted:
            paragraphs.insert(rng.randint(1, len(paragraphs)), statement)
            questions.append({"doc": i, "fact": key, "question": question, "gold": gold})
        docs.append("\n\n".join(paragraphs))
    return docs, questions


def system_prompt(tokenizer, n_tokens: int, seed: int) -> str:
    rng = random.Random(seed + 1)
    answers = corpus_answers()
    rng.shuffle(answers)
    text = ("You are a careful assistant. The user gives you documents separated by '#' marks and then a "
            "question. Answer the question with the fact stated in the documents, in a few words. "
            "Background notes follow; they are not the documents.")
    while len(tokenizer.encode(text)) < n_tokens:
        text += "\n\n" + answers.pop()
    return text


def workload(tokenizer, n_docs: int, doc_tokens: int, system_tokens: int, n_requests: int, seed: int,
             facts: str = "towns") -> dict:
    """Documents, a system prompt, n_requests questions and a document order for each (never the
    documents' own order, which the warm-up uses)."""
    docs, questions = build_documents(tokenizer, n_docs, doc_tokens, seed, facts)
    rng = random.Random(seed)
    questions = [questions[i % len(questions)] for i in rng.sample(range(max(n_requests, len(questions))), n_requests)]
    orders = []
    for _ in questions:
        order = list(range(len(docs)))
        while order == sorted(order):
            rng.shuffle(order)
        orders.append(order)
    return {"system": system_prompt(tokenizer, system_tokens, seed), "docs": docs, "questions": questions, "orders": orders}


JOIN = ("separator", "blank-lines")
"""How a prompt's documents are joined: the blend separator before each (and before the question),
or blank lines as a RAG application writes them (the server then finds documents by their content)."""
join_style = "separator"


def messages(system: str, docs: list[str], order: list[int], question: str) -> list[dict]:
    if join_style == "blank-lines":
        user = "\n\n".join([*(docs[i] for i in order), f"Question: {question} Answer briefly."])
    else:
        user = "".join(SEPARATOR + docs[i] for i in order) + SEPARATOR + f"Question: {question} Answer briefly."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def normalise(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()


def contains(answer: str, gold: str) -> bool:
    a, g = " ".join(normalise(answer)), " ".join(normalise(gold))
    return f" {g} " in f" {a} "


def f1(answer: str, gold: str) -> float:
    a, g = normalise(answer), normalise(gold)
    common = sum(min(a.count(t), g.count(t)) for t in set(g))
    if not a or not g or not common:
        return 0.0
    p, r = common / len(a), common / len(g)
    return 2 * p * r / (p + r)


async def ask(url: str, model: str, msgs: list[dict], max_tokens: int, ratio: float | None = None) -> tuple[dict, str]:
    body = {"model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    if ratio is not None:
        body["kv_transfer_params"] = {"lmi_blend_recompute_ratio": ratio}
    async with httpx.AsyncClient(timeout=900) as client:
        timed = await stream_completion(client, url + "/v1/chat/completions", body)
    if not timed.ok:
        raise RuntimeError(timed.error)
    return {"ttft_s": timed.ttft_s, "prompt_tokens": timed.prompt_tokens, "cached_tokens": timed.cached_tokens}, timed.text


def blend_counters(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name.startswith("lmi_blend_"):
                key = s.name + ("_" + s.labels["kind"] if "kind" in s.labels else "")
                out[key] = s.value
    return out


def run_server(name: str, env_options: dict[str, str], work: Path, phases: dict[str, dict], max_tokens: int,
               ratios: list[float | None]) -> dict[str, dict]:
    """One server: each phase warmed once, then its questions at every ratio (None: the server's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
    env.update({"OPTION_LMCACHE_AUTO_CONFIG": "true", "OPTION_MAX_MODEL_LEN": "8192", **env_options})
    port = free_port()
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"),
            "--host", "127.0.0.1", "--port", str(port)]
    server = Server(name, argv, port, "/ping", work / f"{name}.log", env=env)
    server.env = {**env, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    print(f"== {name}", flush=True)
    with server:
        model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for phase, data in phases.items():
            warm, _ = asyncio.run(ask(server.url, model, messages(data["system"], data["docs"], list(range(len(data["docs"]))),
                                                                  "Which towns are described?"), 4))
            print(f"   {phase} warm-up (documents in their own order): TTFT {warm['ttft_s']:.2f} s", flush=True)
        out = {}
        for ratio in ratios:
            label = name if ratio is None else f"blend-{ratio:g}"
            print(f"-- {label}", flush=True)
            out[label] = {"options": env_options, "ratio": ratio, "start_s": server.start_s,
                          "phases": {phase: run_phase(server.url, model, data, max_tokens, ratio) for phase, data in phases.items()}}
        counters = blend_counters(server.url)
    for run in out.values():
        run["blend_metrics_server_total"] = counters
    return out


def run_phase(url: str, model: str, data: dict, max_tokens: int, ratio: float | None) -> dict:
    system, docs = data["system"], data["docs"]
    rows = []
    for q, order in zip(data["questions"], data["orders"]):
        timing, text = asyncio.run(ask(url, model, messages(system, docs, order, q["question"]), max_tokens, ratio))
        rows.append({**timing, "question": q["question"], "gold": q["gold"], "answer": text,
                     "correct": contains(text, q["gold"]), "f1": f1(text, q["gold"])})
        print(f"   {timing['ttft_s']:6.2f} s  cached {timing['cached_tokens']:5d}/{timing['prompt_tokens']}  "
              f"{'ok ' if rows[-1]['correct'] else 'no '} {text[:70]!r}", flush=True)
    ttft = [r["ttft_s"] for r in rows]
    return {
        "ttft_p50_s": statistics.median(ttft), "ttft_mean_s": statistics.fmean(ttft),
        "prompt_tokens_mean": statistics.fmean(r["prompt_tokens"] for r in rows),
        "cached_tokens_mean": statistics.fmean(r["cached_tokens"] for r in rows),
        "accuracy": statistics.fmean(r["correct"] for r in rows), "f1": statistics.fmean(r["f1"] for r in rows),
        "rows": rows,
    }


def compare(doc: dict) -> None:
    """Each configuration against prefix-only, per phase: TTFT ratio, answers identical, score points."""
    ref = doc["configs"]["prefix"]["phases"]
    for run in doc["configs"].values():
        for phase, res in run["phases"].items():
            base = ref[phase]
            res["ttft_speedup_vs_prefix"] = base["ttft_p50_s"] / res["ttft_p50_s"]
            same = [a["answer"] == b["answer"] for a, b in zip(res["rows"], base["rows"])]
            res["identical_to_prefix"] = sum(same) / len(same)
            res["accuracy_points_vs_prefix"] = 100 * (res["accuracy"] - base["accuracy"])
            res["f1_points_vs_prefix"] = 100 * (res["f1"] - base["f1"])


def plot(doc: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["configs"])
    ttft = [doc["configs"][n]["phases"]["ttft"] for n in names]
    qa = [doc["configs"][n]["phases"]["qa"] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = a.bar(names, [r["ttft_p50_s"] for r in ttft], color=["#888"] + ["#2a7"] * (len(names) - 1))
    a.tick_params(axis="x", labelsize=8)
    b.tick_params(axis="x", labelsize=8)
    for bar, r in zip(bars, ttft):
        a.annotate(f"{r['ttft_p50_s']:.2f} s\n{r['ttft_speedup_vs_prefix']:.1f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                   ha="center", va="bottom", fontsize=8)
    a.set_ylabel("TTFT p50 (s)")
    a.set_title(f"TTFT: {ttft[0]['prompt_tokens_mean']:.0f}-token prompts, documents reordered", fontsize=9)
    x = range(len(names))
    b.plot(x, [100 * r["accuracy"] for r in qa], "o-", label="answer accuracy (%)")
    b.plot(x, [100 * r["f1"] for r in qa], "s-", label="token F1 (x100)")
    b.plot(x, [100 * r["identical_to_prefix"] for r in qa], "^--", label="answers identical to prefix-only (%)")
    b.set_xticks(list(x), names)
    b.set_ylim(0, 105)
    b.legend(fontsize=8)
    b.set_title(f"quality: {len(qa[0]['rows'])} questions, {qa[0]['prompt_tokens_mean']:.0f}-token prompts", fontsize=9)
    joined = "documents joined by blank lines, no separator" if doc["args"].get("join") == "blank-lines" else "documents after the separator"
    fig.suptitle(f"KV blending on the served assistant ({joined}, 2 CPU cores)", fontsize=9)
    fig.tight_layout()
    out = RESULTS / f"{doc['args'].get('name', 'blend_rag')}.png"
    fig.savefig(out, dpi=110)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.0, 0.05, 0.15, 0.30, 1.0])
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--doc-tokens", type=int, default=1000)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--ttft-requests", type=int, default=8)
    ap.add_argument("--qa-doc-tokens", type=int, default=300)
    ap.add_argument("--qa-system-tokens", type=int, default=150)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--join", choices=JOIN, default="separator",
                    help="documents after the blend separator, or joined by blank lines (no separator)")
    ap.add_argument("--name", default="blend_rag", help="results/NAME.{json,png}")
    ap.add_argument("--no-save", action="store_true", help="print only (a quick look)")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    global join_style
    join_style = args.join
    if args.plot_only:
        print(plot(json.loads((RESULTS / f"{args.name}.json").read_text())))
        return 0
    from transformers import AutoTokenizer

    from lmi_server.demo.assistant import ensure_assistant

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_assistant()))
    phases = {
        "ttft": workload(tokenizer, args.docs, args.doc_tokens, args.system_tokens, args.ttft_requests, args.seed),
        "qa": workload(tokenizer, args.docs, args.qa_doc_tokens, args.qa_system_tokens, args.questions, args.seed + 100),
    }
    work = Path(tempfile.mkdtemp(prefix="lmi-blend-rag-"))
    doc = {"benchmark": "blend_rag", "machine": machine(), "load_average_at_start": os.getloadavg(),
           "args": vars(args), "configs": {}}
    started = time.monotonic()
    doc["configs"].update(run_server("prefix", {}, work, phases, args.max_tokens, [None]))
    doc["configs"].update(run_server("blend", {"OPTION_LMCACHE_BLEND": "true"}, work, phases, args.max_tokens, args.ratios))
    doc["wall_s"] = time.monotonic() - started
    doc["load_average_at_end"] = os.getloadavg()
    compare(doc)
    if not args.no_save:
        print(save(args.name, doc))
        print(plot(doc))
    for name, run in doc["configs"].items():
        t, q = run["phases"]["ttft"], run["phases"]["qa"]
        print(f"{name:10s} TTFT p50 {t['ttft_p50_s']:6.2f} s ({t['ttft_speedup_vs_prefix']:.2f}x)  identical {t['identical_to_prefix']:.2f} | "
              f"QA accuracy {q['accuracy']:.2f} F1 {q['f1']:.2f} identical {q['identical_to_prefix']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
