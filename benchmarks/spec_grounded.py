#!/usr/bin/env python
"""Speculation on grounded work: the default assistant with no speculation, prompt lookup (ngram) and
its shipped EAGLE-3 head, on tasks whose answer copies the prompt and on open chat, side by side in one run.

    python benchmarks/spec_grounded.py                    # writes benchmarks/results/spec_grounded.{json,png}
    python benchmarks/spec_grounded.py --modes none ngram_k8_max5_min2 ngram_k4_max3_min2 \\
        --concurrency 1 --workloads grounded --name spec_grounded_grid      # the 1-client grid

Prompts: benchmarks/prompts/spec_grounded.json (committed): grounded tasks (rename a variable in a given
function and return it, add a docstring and return the function, quote a given document, answer a
question from given passages) and open chat. Each mode starts `lmi-server serve` with no model option
(the built-in assistant, as `make serve`) and only the environment of its mode:
  - none:    nothing more;
  - ngram:   only `OPTION_SPECULATIVE_METHOD=ngram` (the server's measured defaults);
  - eagle3:  only `OPTION_SPECULATIVE_METHOD=eagle3` (the shipped head and its batch-size schedule);
  - ngram_kK_maxM_minN: `OPTION_SPECULATIVE_CONFIG` with prompt lookup, K draft tokens and lookup
    sizes N..M at every batch size (a grid point; no schedule).
Requests are greedy (temperature 0), streamed chat completions with a fixed max_tokens, sent at each
concurrency level (default 1, 4, 16 clients; 8, 8, 16 requests per workload, so every grounded prompt is sent at
each level), grounded first, then chat.
Recorded per mode, workload and level: output tokens/s over the level, mean inter-token latency, time to
first token, vLLM's acceptance counters from /metrics, the speed-up against `none` and, per prompt,
whether the text is identical to `none`'s at the same level.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    RESULTS, builtin_server, chat_level, machine, mark_against, save,
)

PROMPTS = Path(__file__).resolve().parent / "prompts" / "spec_grounded.json"
FIXED = {  # the only environment each named mode adds to `make serve`'s
    "none": {},
    "ngram": {"OPTION_SPECULATIVE_METHOD": "ngram"},
    "eagle3": {"OPTION_SPECULATIVE_METHOD": "eagle3"},
}
MAX_TOKENS = 512
"""What a user asking to quote a document or return a function sends: room for the whole answer. At 160 (the
earlier default) the lighthouse quote stopped 4 tokens before the end of the document (164 tokens whole) and the
code answers with a docstring run to 250 tokens; at 512 the longest grounded answer was 310 tokens
(results/spec_grounded_user_*.json)."""
GRID = re.compile(r"^ngram_k(\d+)_max(\d+)_min(\d+)$")


def mode_env(mode: str) -> dict[str, str]:
    if mode in FIXED:
        return dict(FIXED[mode])
    m = GRID.match(mode)
    if not m:
        raise ValueError(f"unknown mode {mode!r}: none, ngram, eagle3 or ngram_kK_maxM_minN")
    k, hi, lo = (int(x) for x in m.groups())
    return {"OPTION_SPECULATIVE_CONFIG": json.dumps(
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": hi, "prompt_lookup_min": lo})}


def load_prompts() -> dict[str, list[dict]]:
    """Grounded prompts interleaved by task (so a level of 4 requests covers each task once), chat as written."""
    doc = json.loads(PROMPTS.read_text())
    by_task: dict[str, list[dict]] = {}
    for p in doc["grounded"]:
        by_task.setdefault(p["task"], []).append(p)
    grounded = [group[i] for i in range(max(map(len, by_task.values()))) for group in by_task.values() if i < len(group)]
    return {"grounded": grounded, "chat": doc["chat"]}


def requests_for(concurrency: int) -> int:
    """At least 8 requests a level, so that 1 and 4 clients send every grounded prompt (2 per task) once."""
    return max(8, concurrency)


def run_level(url: str, prompts: list[dict], concurrency: int, requests: int, max_tokens: int) -> dict:
    picked = [i % len(prompts) for i in range(requests)]
    bodies = [{"messages": [{"role": "user", "content": prompts[i]["prompt"]}], "max_tokens": max_tokens, "temperature": 0}
              for i in picked]
    results, level = chat_level(url, bodies, concurrency)
    return {
        **level,
        "outputs": [{"prompt": i, "task": prompts[i]["task"], "tokens": r.output_tokens,
                     "sha1": hashlib.sha1(r.text.encode()).hexdigest()[:12], "text": r.text}
                    for i, r in zip(picked, results)],
    }


def compare(doc: dict, baseline: str) -> None:
    """Speed-up against the baseline and identical outputs (request by request, same prompt and level)."""
    base = {(w, lv["concurrency"]): lv for r in doc["runs"] if r["mode"] == baseline
            for w, levels in r["workloads"].items() for lv in levels}
    for r in doc["runs"]:
        for w, levels in r["workloads"].items():
            for lv in levels:
                ref = base.get((w, lv["concurrency"]))
                if ref is None:
                    continue
                mark_against(lv, ref, baseline)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["none", "ngram", "eagle3"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--workloads", nargs="+", default=["grounded", "chat"], choices=["grounded", "chat"])
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--name", default="spec_grounded")
    ap.add_argument("--baseline", default="none")
    args = ap.parse_args()
    for mode in args.modes:
        mode_env(mode)
    prompts = load_prompts()
    work = Path(tempfile.mkdtemp(prefix="lmi-spec-grounded-"))
    load_start = os.getloadavg()
    runs = []
    for mode in args.modes:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
        env.update(mode_env(mode))
        server = builtin_server(mode, work, env)
        with server:
            run_level(server.url, prompts["chat"], 1, 1, 16)  # warm-up, not recorded
            workloads: dict[str, list[dict]] = {w: [] for w in args.workloads}
            for c in args.concurrency:
                for w in args.workloads:
                    lv = run_level(server.url, prompts[w], c, requests_for(c), args.max_tokens)
                    workloads[w].append(lv)
                    print(f"{mode} {w} c={c}: {lv['output_tokens_per_s']} tok/s, acc len {lv['mean_acceptance_length']}", flush=True)
        runs.append({"mode": mode, "env": mode_env(mode), "start_s": round(server.start_s, 1),
                     "speculative_config": engine_speculative_config(work / f"{mode}.log"), "workloads": workloads})
    doc = {
        "benchmark": "spec_grounded", "machine": machine(), "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(), "max_tokens": args.max_tokens, "prompts": str(PROMPTS.relative_to(PROMPTS.parents[2])),
        "prompts_about": json.loads(PROMPTS.read_text())["about"],
        "baseline": args.baseline, "runs": runs,
    }
    compare(doc, args.baseline)
    path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    print(f"wrote {path}")
    for r in runs:
        for w, levels in r["workloads"].items():
            print(r["mode"], w, [(lv["concurrency"], lv["output_tokens_per_s"], lv.get(f"speedup_vs_{args.baseline}"),
                                  lv.get("identical_share")) for lv in levels])
    return 0


def engine_speculative_config(log: Path) -> str | None:
    """The speculative config the engine was started with, as vLLM logs it."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"speculative_config=([^\n]{0,400})", text)
    return found[0][:600] if found else None


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(doc["runs"][0]["workloads"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.2), squeeze=False)
    width = 0.8 / max(1, len(doc["runs"]))
    for ax, w in zip(axes[0], workloads):
        levels = sorted({lv["concurrency"] for r in doc["runs"] for lv in r["workloads"][w]})
        for i, r in enumerate(doc["runs"]):
            by_c = {lv["concurrency"]: lv for lv in r["workloads"][w]}
            xs = [j + i * width for j in range(len(levels))]
            bars = ax.bar(xs, [by_c[c]["output_tokens_per_s"] for c in levels], width, label=r["mode"])
            for bar, c in zip(bars, levels):
                ratio = by_c[c].get(f"speedup_vs_{doc['baseline']}")
                if ratio is not None and r["mode"] != doc["baseline"]:
                    ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
        ax.set_xticks([j + width * (len(doc["runs"]) - 1) / 2 for j in range(len(levels))], [f"{c} client(s)" for c in levels])
        ax.set_title(f"{w}: output tokens/s (all clients)")
        ax.legend(fontsize=7)
    la = doc["load_average_at_start"][0]
    fig.suptitle(f"Default assistant, greedy, max_tokens {doc['max_tokens']}, {doc['machine']['cpus']} CPUs, load avg {la:.1f} at start")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
