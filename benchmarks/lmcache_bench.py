"""LMCache's own engine benchmark (`lmcache bench engine`, unmodified) against the served product,
KV blending on and off, side by side in one run.

Workloads (LMCache's, run as its CLI runs them; the client sends ordinary chat requests, no
separator, no boundaries, no header):
  long-doc-permutator  a system prompt and N documents of single-token words joined by blank lines
                       in one user message, a new order per request: reuse beyond the prefix.
  long-doc-qa          long documents, several questions each: the prefix path blending must not
                       slow down.

Servers, one after the other, on the built-in assistant with LMCache's auto plan:
  prefix   blending off (LMCache and vLLM reuse prefixes only)
  blend    option.lmcache_blend=true and nothing else (the server's default recompute ratio)

Reported per server and workload: LMCache's summary (mean / p50 / p90 TTFT, throughput), and the
server's blend counters from /metrics. The tokenizer LMCache sizes its prompts with is the served
model's (a directory named after the served model in the working directory, since nothing can be
fetched here).

    python benchmarks/lmcache_bench.py                      # results/lmcache_bench.{json,png}
    python benchmarks/lmcache_bench.py --ldp-contexts 3 --ldp-context-length 500 --no-save   # quick
    python benchmarks/lmcache_bench.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.blend_rag import blend_counters  # noqa: E402
from benchmarks.common import RESULTS, Server, free_port, machine, save  # noqa: E402

CONFIGS = {
    "prefix": {},
    "blend": {"OPTION_LMCACHE_BLEND": "true", "OPTION_LMCACHE_BLEND_MODE": "cacheblend"},
    "epic": {"OPTION_LMCACHE_BLEND": "true", "OPTION_LMCACHE_BLEND_MODE": "epic"},
    "guided": {"OPTION_LMCACHE_BLEND": "true", "OPTION_LMCACHE_BLEND_MODE": "guided"},
}

DATASET = REPO / "benchmarks" / "data" / "rag_qa_answerable.jsonl"  # benchmarks/rag_qa_dataset.py
ARMS = {
    # rag-qa-quality arms per server: (cache salt, fields merged into every request body); each arm has
    # its own salt, so it reuses only the KV its own warm-up stored. "fresh": a new salt per request
    # (nothing is ever found: a full prefill).
    "prefix": {"full-prefill": ("fresh", {}), "prefix-only": ("prefix", {})},
    "blend": {"cacheblend-0.15": ("cb-0.15", {}),
              "cacheblend-0.05": ("cb-0.05", {"kv_transfer_params": {"lmi_blend_recompute_ratio": 0.05}}),
              "cacheblend-0": ("cb-0", {"kv_transfer_params": {"lmi_blend_recompute_ratio": 0.0}})},
    "epic": {"epic-default": ("epic", {}),
             "epic-8": ("epic-8", {"kv_transfer_params": {"lmi_blend_epic_tokens": 8}}),
             "epic-0": ("epic-0", {"kv_transfer_params": {"lmi_blend_epic_tokens": 0}})},
    "guided": {"guided-0.15": ("guided-0.15", {}),
               "guided-0.05": ("guided-0.05", {"kv_transfer_params": {"lmi_blend_recompute_ratio": 0.05}}),
               "guided-0": ("guided-0", {"kv_transfer_params": {"lmi_blend_recompute_ratio": 0.0}})},
}


def lmcache_cli() -> list[str]:
    exe = Path(sys.executable).with_name("lmcache")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "lmcache.cli.main"]


def workload_args(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        "long-doc-permutator": [
            "--ldp-num-contexts", str(args.ldp_contexts), "--ldp-context-length", str(args.ldp_context_length),
            "--ldp-system-prompt-length", str(args.ldp_system_length),
            "--ldp-num-permutations", str(args.ldp_permutations), "--ldp-max-output-length", str(args.max_output),
        ],
        "long-doc-qa": [
            "--ldqa-document-length", str(args.ldqa_document_length), "--ldqa-query-per-document", "2",
            "--ldqa-num-inflight-requests", "1", "--ldqa-max-output-length", str(args.max_output),
            # LMCache sizes the document set from the KV volume: this many documents
            "--kv-cache-volume", "1", "--tokens-per-gb-kvcache", str(args.ldqa_documents * args.ldqa_document_length),
        ],
    }


def run_workload(url: str, model: str, workload: str, extra: list[str], work: Path, seed: int) -> dict:
    out = work / f"{workload}-{time.monotonic_ns()}"
    out.mkdir(parents=True)
    argv = [*lmcache_cli(), "bench", "engine", "--engine-url", url, "--model", model, "--workload", workload,
            "--no-interactive", "--json", "--no-csv", "-q", "--seed", str(seed), "--output-dir", str(out)]
    if "--kv-cache-volume" not in extra:
        argv += ["--kv-cache-volume", "1", "--tokens-per-gb-kvcache", "100000"]
    env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1", "HF_HUB_OFFLINE": "1", "LMCACHE_TRACK_USAGE": "false"}
    t0 = time.monotonic()
    done = subprocess.run([*argv, *extra], cwd=work, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"lmcache bench engine {workload} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads((out / "bench_summary.json").read_text())
    summary["wall_s"] = time.monotonic() - t0
    summary["argv"] = [*argv[len(lmcache_cli()):], *extra]
    return summary


def run_quality_arms(name: str, url: str, model: str, work: Path, args: argparse.Namespace) -> dict:
    """`rag-qa-quality` once per arm of this server, through a proxy that adds the arm's cache salt and
    blend fields (the client has no way to send them)."""
    from benchmarks.body_proxy import BodyProxy

    arms: dict = {}
    for arm, (salt, fields) in ARMS[name].items():
        if args.arms and arm not in args.arms:
            continue
        counter = iter(range(10**9))

        def body(salt: str = salt, fields: dict = fields) -> dict:
            return {**fields, "cache_salt": f"{salt}-{next(counter)}" if salt == "fresh" else salt}

        extra = ["--rag-dataset", str(args.rag_dataset), "--rag-num-samples", str(args.rag_samples),
                 "--rag-max-output-length", str(args.rag_max_output), "--rag-output", str(work / f"rag-{arm}.json")]
        if salt == "fresh":
            extra.append("--no-warmup")  # nothing it stored could be found again
        with BodyProxy(url, free_port(), body) as proxy:
            before = blend_counters(url)
            summary = run_workload(proxy.url, model, "rag-qa-quality", extra, work, args.seed)
            after = blend_counters(url)
        summary["blend_metrics"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        summary["arm_fields"] = {"cache_salt": salt, **fields}
        summary["per_sample"] = json.loads((work / f"rag-{arm}.json").read_text())
        summary["own_scoring"] = score_texts(proxy.texts, args.rag_dataset, args.rag_samples)
        q = summary["per_sample"]["summary"]
        own = summary["own_scoring"]
        print(f"   rag-qa-quality {arm}: F1 {q['f1_mean']:.3f}, parsed {q['num_parsed']}/{q['num_samples']}; "
              f"whole-answer F1 {own['f1_mean']:.3f}, gold answer contained {own['contains_rate']:.3f}", flush=True)
        arms[arm] = summary
    return arms


def score_texts(texts: list[str], dataset: Path, n: int) -> dict:
    """LMCache's own scoring functions over the whole answer where it has no `<final_answer>` tags
    (the embedded 135M assistant never writes them, so LMCache's summary parses nothing): its token F1
    (`best_f1`) of the answer's first line against the gold answers, and whether the normalized gold
    answer is contained in it."""
    from lmcache.cli.commands.bench.engine_bench.quality.dataset import load_samples
    from lmcache.cli.commands.bench.engine_bench.quality.scoring import best_f1, extract_final_answer, normalize_answer

    samples = load_samples(str(dataset))[:n]
    rows = []
    for sample, text in zip(samples, texts):
        answer = extract_final_answer(text) or (text.strip().splitlines() or [""])[0]
        contained = any(normalize_answer(gold) in normalize_answer(answer) for gold in sample.answers)
        rows.append({"sample_id": sample.sample_id, "text": text, "f1": best_f1(answer, sample.answers),
                     "contains": contained})
    count = max(1, len(rows))
    return {"answers": len(rows), "f1_mean": sum(r["f1"] for r in rows) / count,
            "contains_rate": sum(r["contains"] for r in rows) / count, "per_sample": rows}


def run_server(name: str, options: dict[str, str], work: Path, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
    if name == "epic" and args.epic_tokens is not None:
        options = {**options, "OPTION_LMCACHE_BLEND_EPIC_TOKENS": str(args.epic_tokens)}
    env.update({"OPTION_LMCACHE_AUTO_CONFIG": "true", "OPTION_MAX_MODEL_LEN": str(args.max_model_len), **options})
    port = free_port()
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"),
            "--host", "127.0.0.1", "--port", str(port)]
    server = Server(name, argv, port, "/ping", work / f"{name}.log", env=env)
    print(f"== {name} {options}", flush=True)
    result: dict = {"options": options, "workloads": {}}
    with server:
        result["start_s"] = server.start_s
        served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
        link = work / served["id"]  # LMCache loads the tokenizer by the served name: the model's directory
        if not link.exists():
            link.symlink_to(served["root"])
        for workload, extra in workload_args(args).items():
            if workload not in args.workloads:
                continue
            before, seen = blend_counters(server.url), len(blend_lines(work / f"{name}.log"))
            summary = run_workload(server.url, served["id"], workload, extra, work, args.seed)
            after = blend_counters(server.url)
            summary["blend_metrics"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            # where each blended request's time went (load, place, forward, scatter, store)
            summary["server_log_blend_lines"] = blend_lines(work / f"{name}.log")[seen:]
            r = summary["results"]
            print(f"   {workload}: TTFT mean {r['mean_ttft_ms'] / 1000:.2f} s, p50 {r['p50_ttft_ms'] / 1000:.2f} s "
                  f"({r['successful_requests']}/{r['total_requests']} ok)", flush=True)
            summary["load_average_after"] = os.getloadavg()
            result["workloads"][workload] = summary
        if "rag-qa-quality" in args.workloads:
            result["quality_arms"] = run_quality_arms(name, server.url, served["id"], work, args)
    result["server_log_blend_lines"] = blend_lines(work / f"{name}.log")[-40:]
    return result


def blend_lines(log: Path) -> list[str]:
    """The server's per-request blend log lines, in order."""
    return [line for line in log.read_text(errors="replace").splitlines() if "blended request" in line]


def compare(doc: dict) -> None:
    prefix = doc["configs"]["prefix"]["workloads"]
    for name, run in doc["configs"].items():
        for workload, summary in run["workloads"].items():
            base = prefix.get(workload, {}).get("results")
            r = summary["results"]
            if base:
                summary["ttft_mean_speedup_vs_prefix"] = base["mean_ttft_ms"] / r["mean_ttft_ms"]
                summary["ttft_p50_speedup_vs_prefix"] = base["p50_ttft_ms"] / r["p50_ttft_ms"]


def plot(doc: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in ("long-doc-permutator", "long-doc-qa") if w in doc["configs"]["prefix"]["workloads"]]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        names = list(doc["configs"])
        for offset, (stat, label) in enumerate((("mean_ttft_ms", "mean"), ("p50_ttft_ms", "p50"))):
            values = [doc["configs"][n]["workloads"][workload]["results"][stat] / 1000 for n in names]
            bars = ax.bar([i + offset * 0.4 for i in range(len(names))], values, width=0.4, label=f"TTFT {label}")
            for bar, value in zip(bars, values):
                ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=8)
        ax.set_xticks([i + 0.2 for i in range(len(names))], names)
        ax.set_ylabel("seconds")
        ax.set_title(f"lmcache bench engine --workload {workload}", fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle("LMCache's engine benchmark on the served assistant: blending off vs on (one run)", fontsize=9)
    fig.tight_layout()
    out = RESULTS / f"{doc['args'].get('name', 'lmcache_bench')}.png"  # beside its JSON
    fig.savefig(out, dpi=110)
    return out


def host() -> dict:
    """CPU model and the flags that decide the kernels, and the versions that decide the numbers."""
    from importlib.metadata import version

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))]
    versions = {}
    for package in ("vllm", "lmcache", "torch", "transformers"):
        try:
            versions[package] = version(package)
        except Exception:  # noqa: BLE001 - a missing package is reported as such
            versions[package] = None
    return {"cpu_model": model, "cpu_flags": wanted, "versions": versions}


def quality_table(doc: dict) -> dict:
    """One row per rag-qa-quality arm: LMCache's score (mean token F1 of the parsed answers) and TTFT."""
    rows = {}
    for name, run in doc["configs"].items():
        for arm, summary in run.get("quality_arms", {}).items():
            q = summary["per_sample"]["summary"]
            own = summary["own_scoring"]
            rows[arm] = {"server": name, "lmcache_f1_mean": q["f1_mean"], "parsed": q["num_parsed"], "samples": q["num_samples"],
                         "f1_mean": own["f1_mean"], "contains_rate": own["contains_rate"],
                         "texts": {r["sample_id"]: r["text"] for r in own["per_sample"]},
                         "ttft_mean_s": summary["results"]["mean_ttft_ms"] / 1000,
                         "ttft_p50_s": summary["results"]["p50_ttft_ms"] / 1000,
                         "fields": summary["arm_fields"], "blend_metrics": summary["blend_metrics"],
                         }
    reference = rows.get("full-prefill", {}).get("texts")
    for row in rows.values():
        if reference:
            row["identical_to_full_prefill"] = sum(row["texts"].get(k) == v for k, v in reference.items()) / max(1, len(reference))
    return rows


def plot_quality(rows: dict, name: str, dataset: Path = DATASET) -> Path:
    """Per arm: LMCache's token F1 of the whole answer, the share of answers holding the gold one,
    and the share identical to the full prefill's (x 100), with the arm's mean TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(rows)
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(arms)), 4.2))
    series = (("f1_mean", "token F1", "tab:blue"), ("contains_rate", "gold answer contained", "tab:green"),
              ("identical_to_full_prefill", "identical to full prefill", "tab:gray"))
    width = 0.27
    for k, (key, label, colour) in enumerate(series):
        xs = [i + (k - 1) * width for i in range(len(arms))]
        bars = ax.bar(xs, [100 * rows[a].get(key, 0.0) for a in arms], width, label=label, color=colour)
        for bar in bars:
            ax.annotate(f"{bar.get_height():.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(arms)), [f"{a}\n{rows[a]['ttft_mean_s']:.2f} s" for a in arms], fontsize=7)
    ax.set_ylabel("score x 100")
    ax.set_ylim(0, 118)
    ax.legend(fontsize=7, loc="upper right")
    samples = max((rows[a]["samples"] for a in arms), default=0)
    ax.set_title(f"lmcache bench engine --workload rag-qa-quality ({dataset.name}, {samples} questions); "
                 "under each arm: TTFT mean", fontsize=8)
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["long-doc-permutator", "long-doc-qa"],
                    choices=["long-doc-permutator", "long-doc-qa", "rag-qa-quality"])
    ap.add_argument("--arms", nargs="*", default=None, help="rag-qa-quality arms to run (default: every arm of ARMS)")
    ap.add_argument("--rag-dataset", type=Path, default=DATASET)
    ap.add_argument("--rag-samples", type=int, default=24)
    ap.add_argument("--rag-max-output", type=int, default=24)
    ap.add_argument("--epic-tokens", type=int, default=None, help="option.lmcache_blend_epic_tokens of the epic server")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--ldp-contexts", type=int, default=6)
    ap.add_argument("--ldp-context-length", type=int, default=1000)
    ap.add_argument("--ldp-system-length", type=int, default=1000)
    ap.add_argument("--ldp-permutations", type=int, default=10)
    ap.add_argument("--ldqa-documents", type=int, default=3)
    ap.add_argument("--ldqa-document-length", type=int, default=2000)
    ap.add_argument("--max-output", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--name", default="lmcache_bench")
    args = ap.parse_args()
    if args.plot_only:
        print(plot(json.loads((RESULTS / f"{args.name}.json").read_text())))
        return 0
    work = Path(tempfile.mkdtemp(prefix="lmi-lmcache-bench-"))
    doc = {"benchmark": "lmcache_bench", "machine": {**machine(), **host()}, "load_average_at_start": os.getloadavg(),
           "args": vars(args), "configs": {}}
    started = time.monotonic()
    for name in args.configs:
        doc["configs"][name] = run_server(name, CONFIGS[name], work, args)
        if not args.no_save:
            save(f"{args.name}_partial", doc)  # a later server's failure keeps this one's figures
    doc["wall_s"] = time.monotonic() - started
    doc["load_average_at_end"] = os.getloadavg()
    if "prefix" in doc["configs"]:
        compare(doc)
    for name, run in doc["configs"].items():
        for workload, summary in run["workloads"].items():
            r = summary["results"]
            print(f"{name:7s} {workload:20s} TTFT mean {r['mean_ttft_ms'] / 1000:7.2f} s "
                  f"({summary.get('ttft_mean_speedup_vs_prefix', 1):.2f}x)  p50 {r['p50_ttft_ms'] / 1000:7.2f} s "
                  f"({summary.get('ttft_p50_speedup_vs_prefix', 1):.2f}x)")
    quality = quality_table(doc)
    for arm, row in quality.items():
        print(f"{arm:16s} F1 {row['f1_mean']:.3f}  contains {row['contains_rate']:.3f}  identical "
              f"{row.get('identical_to_full_prefill', float('nan')):.3f}  LMCache-parsed {row['parsed']}/{row['samples']}  "
              f"TTFT mean {row['ttft_mean_s']:.2f} s")
    if not args.no_save:
        print(save(args.name, doc))
        if "prefix" in doc["configs"] and any(run["workloads"] for run in doc["configs"].values()):
            print(plot(doc))
        if quality:
            print(save(f"{args.name}_quality", {"machine": doc["machine"], "load_average_at_start": doc["load_average_at_start"],
                                                 "load_average_at_end": doc["load_average_at_end"], "args": doc["args"],
                                                 "arms": quality}))
            print(plot_quality(quality, f"{args.name}_quality", args.rag_dataset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
