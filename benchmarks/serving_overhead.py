"""What does our layer cost? The same demo model served by lmi-server and by vLLM's own server,
measured with vLLM's own serving benchmark (`vllm bench serve`).

Both servers run at the same time with identical engine settings. For each route
(`/v1/chat/completions`, `/invocations`) and each concurrency (1, 8, 32) the tool runs against
them in the order A B B A, so that machine noise falls on both alike, with a pause between runs
(vLLM's engine keeps polling for a second after its last step). The same seeded random prompts go
to both: each pair of runs (A B, then B A) gets its own seed, so that no server ever sees a prompt
twice and every TTFT includes a full prefill. Per-request TTFT and inter-token gaps of the two runs are pooled; the result has TTFT
mean / p90 / p99, ITL mean / p90, output tokens/s, the ratios lmi-server / vLLM and the load
average at each run.

    python benchmarks/serving_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, Server, free_port, machine, pct, save  # noqa: E402

ROUTES = {  # route label -> (vLLM bench backend, endpoint)
    "chat": ("openai-chat", "/v1/chat/completions"),
    "invocations": ("openai", "/invocations"),
}
LEVELS = (1, 8, 32)
ORDER = ("lmi-server", "vllm", "vllm", "lmi-server")


def bench_serve(url: str, model: str, backend: str, endpoint: str, *, prompts: int, concurrency: int,
                input_len: int, output_len: int, seed: int, out: Path, extra: list[str] | tuple[str, ...] = ()) -> dict:
    """One `vllm bench serve` run (benchmarks/bench_serve.py); its detailed JSON result."""
    argv = [
        sys.executable, str(REPO / "benchmarks" / "bench_serve.py"),
        "--base-url", url, "--backend", backend, "--endpoint", endpoint, "--model", "demo", "--tokenizer", model,
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--ignore-eos", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
        "--result-dir", str(out.parent), "--result-filename", out.name, *extra,
    ]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def pooled(runs: list[dict]) -> dict:
    """Per-request figures of several runs pooled into one row."""
    ttft = [t for r in runs for t, error in zip(r["ttfts"], r["errors"]) if not error and t > 0]
    itl = [g for r in runs for gaps in r["itls"] for g in gaps]
    tokens = sum(r["total_output_tokens"] for r in runs)
    duration = sum(r["duration"] for r in runs)
    return {
        "requests": sum(r["num_prompts"] for r in runs),
        "failed": sum(r["num_prompts"] - r["completed"] for r in runs),
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p90_s": pct(ttft, 90),
        "ttft_p99_s": pct(ttft, 99),
        "ttft_max_s": max(ttft),
        "itl_mean_s": statistics.fmean(itl),
        "itl_p90_s": pct(itl, 90),
        "output_tokens_per_s": tokens / duration,
        "load_average_1m": [r["load_average_1m"] for r in runs],
    }


RATIOS = {"ttft_mean": "ttft_mean_s", "ttft_p90": "ttft_p90_s", "itl_mean": "itl_mean_s", "throughput": "output_tokens_per_s"}


def ratio_row(route: str, concurrency: int, lmi: dict, vllm: dict) -> dict:
    """lmi-server / vLLM for each headline figure (below 1 is better for latencies, above 1 for throughput)."""
    return {"route": route, "concurrency": concurrency, **{f"{name}_ratio": lmi[key] / vllm[key] for name, key in RATIOS.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--pause-s", type=float, default=3.0, help="quiet time between runs")
    ap.add_argument("--routes", default="chat,invocations")
    ap.add_argument("--name", default="serving_overhead")
    ap.add_argument("--scale", type=int, default=1, help="multiply the requests per run (longer, less noisy)")
    args = ap.parse_args()

    from lmi_server.demo.builder import ensure_demo_model

    model = str(ensure_demo_model())
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    (work / "serving.properties").write_text(
        f"option.model_id={model}\noption.served_model_name=demo\noption.cpu_kv_cache_space=2\n"
        "option.enforce_eager=true\noption.dtype=fp32\noption.max_model_len=4096\noption.max_num_seqs=32\n"
    )
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONHASHSEED": "0"}
    lmi = Server("lmi-server", [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work), "--host", "127.0.0.1", "--port", str(p1 := free_port()), "--log-level", "warning"], p1, "/ping", work / "lmi.log", env)
    vllm = Server("vllm", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "demo", "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "32", "--host", "127.0.0.1", "--port", str(p2 := free_port()), "--disable-uvicorn-access-log"], p2, "/health", work / "vllm.log", env)
    prompts = {1: 4, 8: 16, 32: 32} if args.quick else {c: n * args.scale for c, n in {1: 24, 8: 64, 32: 128}.items()}
    routes = [r for r in args.routes.split(",") if r]
    rows, ratios = [], []
    load_start = os.getloadavg()
    t_start = time.monotonic()
    with lmi, vllm:
        servers = {"lmi-server": lmi, "vllm": vllm}
        for name, server in servers.items():  # warm-up: every batch size the runs will see
            backend, endpoint = ROUTES["chat"]
            bench_serve(server.url, model, backend, endpoint, prompts=64, concurrency=32, input_len=args.input_len,
                        output_len=8, seed=0, out=work / f"warmup-{name}.json")
        seed = 1
        for route in routes:
            backend, endpoint = ROUTES[route]
            for c in LEVELS:
                runs: dict[str, list[dict]] = {"lmi-server": [], "vllm": []}
                for i, name in enumerate(ORDER):
                    time.sleep(args.pause_s)
                    load = os.getloadavg()[0]
                    result = bench_serve(servers[name].url, model, backend, endpoint, prompts=prompts[c], concurrency=c,
                                         input_len=args.input_len, output_len=args.output_len, seed=seed + i // 2,
                                         out=work / f"{route}-{c}-{i}-{name}.json")
                    result["load_average_1m"] = load
                    runs[name].append(result)
                seed += 2
                for name in servers:
                    row = {"route": route, "server": name, "concurrency": c, **pooled(runs[name])}
                    rows.append(row)
                    print(f"{route:11s} {name:10s} c={c:2d} ttft={row['ttft_mean_s']*1000:7.1f} ms p90={row['ttft_p90_s']*1000:7.1f} ms "
                          f"max={row['ttft_max_s']*1000:7.1f} ms itl={row['itl_mean_s']*1000:6.2f} ms tok/s={row['output_tokens_per_s']:7.1f} "
                          f"failed={row['failed']}", flush=True)
                ratios.append(ratio_row(route, c, rows[-2], rows[-1]))
        starts = {name: s.start_s for name, s in servers.items()}
    doc = {
        "benchmark": "serving_overhead", "tool": "vllm bench serve (benchmarks/bench_serve.py)", "machine": machine(),
        "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
        "input_len": args.input_len, "output_len": args.output_len, "order": ORDER, "server_start_s": starts,
        "prompts_per_run": prompts, "wall_s": time.monotonic() - t_start,
        "rows": rows, "ratios_lmi_over_vllm": ratios,
    }
    path = save(args.name, doc)
    plot(doc, path.with_suffix(".png"))
    print("wrote", path)
    return 0


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routes = sorted({r["route"] for r in doc["rows"]}, key=list(ROUTES).index)
    metrics = (("ttft_mean_s", "mean TTFT (ms)", 1000), ("ttft_p90_s", "TTFT p90 (ms)", 1000),
               ("itl_mean_s", "mean inter-token latency (ms)", 1000), ("output_tokens_per_s", "output tokens/s", 1))
    fig, axes = plt.subplots(len(routes), len(metrics), figsize=(16, 3.6 * len(routes)), squeeze=False)
    for row_axes, route in zip(axes, routes):
        for ax, (key, label, scale) in zip(row_axes, metrics):
            for name, marker in (("lmi-server", "o"), ("vllm", "s")):
                pts = [(r["concurrency"], r[key] * scale) for r in doc["rows"] if r["server"] == name and r["route"] == route]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streaming clients")
            ax.set_title(f"{route}: {label}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend()
    load = doc["load_average_at_start"][0], doc["load_average_at_end"][0]
    fig.suptitle(f"lmi-server vs vLLM's own server, vllm bench serve, demo model, same engine settings "
                 f"(load average {load[0]:.1f} -> {load[1]:.1f})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
