#!/usr/bin/env python
"""What `make serve` gives a user: decode speed of the embedded assistant at 1 and 8 clients,
without and with its shipped EAGLE head, measured side by side in one run.

    python benchmarks/default_model.py                     # writes benchmarks/results/default_model.{json,png}
    python benchmarks/default_model.py --modes plain --concurrency 1
    python benchmarks/default_model.py --modes plain eagle ngram --concurrency 1 4 16 --name default_model_spec

Each mode starts `lmi-server serve` with no model option (the default assistant, as `make serve`);
"eagle" / "eagle3" add only `OPTION_SPECULATIVE_METHOD` (the server then uses the draft head
shipped for the built-in model; "eagle3_kN" also sets `OPTION_NUM_SPECULATIVE_TOKENS=N`), "ngram" only `OPTION_SPECULATIVE_METHOD=ngram` (prompt lookup); "head_kN" `OPTION_SPECULATIVE_CONFIG` with the
EAGLE-3 head given by `--head` and N draft tokens (a candidate head beside the shipped one); "bfloat16" / "float32" set only `OPTION_DTYPE`;
"no_preload" only `LMI_CPU_PRELOAD=0` (the engine without tcmalloc / Intel OpenMP preloaded:
`--modes no_preload plain --concurrency 1 4 --baseline no_preload --name cpu_preload`). Greedy streamed chat requests (held-out questions, never seen in the
drafts' training: none is in the EAGLE-1 kit nor in the assistant corpus the EAGLE-3 head learned
from) run at each concurrency level. Recorded: output tokens/s over the level, mean
inter-token latency and time to first token per request, and, for EAGLE, the acceptance rate and
mean acceptance length from vLLM's counters on /metrics (diffed around each level).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    RESULTS, builtin_server, chat_level, machine, save,
)

QUESTIONS = [
    "What is the capital of France?", "How do I reverse a list in Python?", "Why do we have day and night?",
    "Give me two tips for writing clear emails.", "What is photosynthesis?", "How does a bicycle stay upright?",
    "What is the difference between RAM and a hard drive?", "Explain what a function is in programming.",
    "What are the three states of water?", "How can I improve my sleep?", "What is an atom made of?",
    "Write a haiku about a winter morning.", "What does HTTP stand for?", "Why is the ocean salty?",
    "How do I merge two dictionaries in Python?", "What is the role of the heart in the body?",
]
MODES = {  # the only environment each mode adds to `make serve`'s
    "plain": {},
    "eagle": {"OPTION_SPECULATIVE_METHOD": "eagle"},
    "eagle3": {"OPTION_SPECULATIVE_METHOD": "eagle3"},
    "eagle3_k1": {"OPTION_SPECULATIVE_METHOD": "eagle3", "OPTION_NUM_SPECULATIVE_TOKENS": "1"},
    "eagle3_k2": {"OPTION_SPECULATIVE_METHOD": "eagle3", "OPTION_NUM_SPECULATIVE_TOKENS": "2"},
    "eagle3_k3": {"OPTION_SPECULATIVE_METHOD": "eagle3", "OPTION_NUM_SPECULATIVE_TOKENS": "3"},
    "eagle3_k4": {"OPTION_SPECULATIVE_METHOD": "eagle3", "OPTION_NUM_SPECULATIVE_TOKENS": "4"},
    "ngram": {"OPTION_SPECULATIVE_METHOD": "ngram"},
    **{f"head_k{n}": {} for n in (1, 2, 3)},  # --head's EAGLE-3 head with n draft tokens
    "bfloat16": {"OPTION_DTYPE": "bfloat16"},
    "float32": {"OPTION_DTYPE": "float32"},
    "no_preload": {"LMI_CPU_PRELOAD": "0"},  # vLLM's CPU runtime without tcmalloc / Intel OpenMP
}


def run_level(url: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    bodies = [
        {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
         "max_tokens": max_tokens, "temperature": 0}
        for i in range(requests)
    ]
    _, level = chat_level(url, bodies, concurrency)
    return {
        **level,
        "answer_sample": None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["plain", "eagle"], choices=sorted(MODES))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--requests", type=int, default=0, help="per level; default max(6, 2 x concurrency)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--name", default="default_model")
    ap.add_argument("--baseline", default="plain", help="the mode the speed-ups are relative to")
    ap.add_argument("--head", help="an EAGLE-3 head directory for the head_kN modes (a candidate beside the shipped one)")
    args = ap.parse_args()
    if any(m.startswith("head_") for m in args.modes) and not args.head:
        ap.error("head_kN modes need --head DIR")
    work = Path(tempfile.mkdtemp(prefix="lmi-default-"))
    load_start = os.getloadavg()
    runs = []
    for mode in args.modes:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID", "LMI_CPU_PRELOAD"))}
        env.update(MODES[mode])
        if mode.startswith("head_k"):
            env["OPTION_SPECULATIVE_CONFIG"] = json.dumps(
                {"method": "eagle3", "model": str(Path(args.head).resolve()), "num_speculative_tokens": int(mode[6:])})
        server = builtin_server(mode, work, env)
        with server:
            levels = []
            for c in args.concurrency:
                levels.append(run_level(server.url, c, args.requests or max(6, 2 * c), args.max_tokens))
                print(f"{mode} c={c}: {levels[-1]}", flush=True)
            sample = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 32, "temperature": 0}).json()
            levels[0]["answer_sample"] = sample["choices"][0]["message"]["content"]
        runs.append({"mode": mode, "start_s": round(server.start_s, 1), "levels": levels,
                     "cpu_runtime": cpu_runtime_lines(work / f"{mode}.log")})
    doc = {
        "benchmark": "default_model", "machine": machine(), "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(), "max_tokens": args.max_tokens, "runs": runs,
    }
    base = {lv["concurrency"]: lv["output_tokens_per_s"] for r in runs if r["mode"] == args.baseline for lv in r["levels"]}
    for r in runs:
        for lv in r["levels"]:
            if base.get(lv["concurrency"]):
                lv[f"speedup_vs_{args.baseline}"] = round(lv["output_tokens_per_s"] / base[lv["concurrency"]], 3)
    path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    print(f"wrote {path}")
    return 0


def cpu_runtime_lines(log: Path) -> list[str]:
    """The server's line on the engine's LD_PRELOAD and vLLM's worker's own check of it."""
    keep = ("CPU runtime", "not found in LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND=", "reserve_cpu_num=", "core ids=",
            "reserved_cpus=")
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return list(dict.fromkeys(line.strip()[-300:] for line in text.splitlines() if any(k in line for k in keep)))


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    levels = sorted({lv["concurrency"] for r in doc["runs"] for lv in r["levels"]})
    width = 0.8 / max(1, len(doc["runs"]))
    for i, r in enumerate(doc["runs"]):
        by_c = {lv["concurrency"]: lv for lv in r["levels"]}
        xs = [j + i * width for j in range(len(levels))]
        axes[0].bar(xs, [by_c[c]["output_tokens_per_s"] for c in levels], width, label=r["mode"])
        axes[1].bar(xs, [by_c[c]["mean_itl_ms"] or 0 for c in levels], width, label=r["mode"])
    for ax, title in zip(axes, ("output tokens/s (all clients)", "mean inter-token latency (ms)")):
        ax.set_xticks([j + width * (len(doc["runs"]) - 1) / 2 for j in range(len(levels))], [f"{c} client(s)" for c in levels])
        ax.set_title(title)
        ax.legend()
    la = doc["load_average_at_start"][0]
    fig.suptitle(f"Default assistant (SmolLM2-135M-Instruct, make serve), {doc['machine']['cpus']} CPUs, load avg {la:.1f} at start")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
