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

CONFIGS = {"prefix": {}, "blend": {"OPTION_LMCACHE_BLEND": "true"}}


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


def run_server(name: str, options: dict[str, str], work: Path, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
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
            before = blend_counters(server.url)
            summary = run_workload(server.url, served["id"], workload, extra, work, args.seed)
            after = blend_counters(server.url)
            summary["blend_metrics"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            r = summary["results"]
            print(f"   {workload}: TTFT mean {r['mean_ttft_ms'] / 1000:.2f} s, p50 {r['p50_ttft_ms'] / 1000:.2f} s "
                  f"({r['successful_requests']}/{r['total_requests']} ok)", flush=True)
            result["workloads"][workload] = summary
    return result


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["long-doc-permutator", "long-doc-qa"])
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
    doc = {"benchmark": "lmcache_bench", "machine": machine(), "load_average_at_start": os.getloadavg(),
           "args": vars(args), "configs": {}}
    started = time.monotonic()
    for name in args.configs:
        doc["configs"][name] = run_server(name, CONFIGS[name], work, args)
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
    if not args.no_save:
        print(save(args.name, doc))
        if "prefix" in doc["configs"]:
            print(plot(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
