#!/usr/bin/env python
"""LoRA adapters through the HTTP API of the real server (demo model, CPU):

  1. first-call latency of a cold adapter (load + generate) vs the same call once warm;
  2. throughput with requests spread round-robin over 1, 4 and 16 adapters vs the base alone;
  3. memory per resident adapter (adapter weight bytes, and the server's RSS growth per load).

    python benchmarks/lora.py [--requests 24] [--concurrency 4] [--max-tokens 32]

Writes benchmarks/results/lora.json and lora.png. The adapters are copies of the committed
`hello-printer` example (same size as any rank-8 adapter of the demo model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.support.server import DEMO_PROPS, ServerProcess, server_env, write_properties  # noqa: E402

BASE_PROPS = {k: v for k, v in DEMO_PROPS.items() if k != "option.max_request_bytes"}
PROMPTS = ["def main():", "import os\n", "class Parser:", "for i in range(10):", "# read the file\n", "x = []"]


def tree_rss(pid: int) -> int:
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


def call(base_url: str, adapter: str | None, prompt: str, max_tokens: int) -> tuple[float, int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, "ignore_eos": True, "details": True}}
    if adapter:
        body["adapters"] = adapter
    start = time.perf_counter()
    r = httpx.post(base_url + "/invocations", json=body, timeout=600)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed, r.json()["details"]["generated_tokens"]


def throughput(base_url: str, adapters: list[str | None], n: int, conc: int, max_tokens: int) -> dict:
    jobs = [(adapters[i % len(adapters)], PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    start = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        results = list(pool.map(lambda j: call(base_url, j[0], j[1], max_tokens), jobs))
    wall = time.perf_counter() - start
    tokens = sum(t for _, t in results)
    lat = sorted(x for x, _ in results)
    return {
        "requests": n, "concurrency": conc, "wall_s": round(wall, 3), "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2), "requests_per_s": round(n / wall, 3),
        "latency_p50_s": round(statistics.median(lat), 3), "latency_max_s": round(lat[-1], 3),
    }


def metric_sum(base_url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cold-samples", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    root = work / "adapters"
    root.mkdir()
    names = [f"bench-{i:02d}" for i in range(16)]
    for n in names:
        shutil.copytree(REPO / "adapters" / "hello-printer", root / n)
    props = {**BASE_PROPS, "option.enable_lora": "true", "option.max_loras": "4", "option.max_cpu_loras": "16",
             "option.max_lora_rank": "8", "option.adapters_path": str(root)}
    write_properties(work, props)
    server = ServerProcess(work, work / "server.log", env=server_env()).start()
    result: dict = {"config": {k: v for k, v in props.items() if k != "option.adapters_path"}, "args": vars(args) | {"out": str(args.out)}}
    try:
        server.wait_ready()
        url = server.base_url
        t0 = time.perf_counter()
        listed = httpx.get(url + "/adapters").json()["adapters"]
        result["registered"] = len(listed)
        result["list_latency_s"] = round(time.perf_counter() - t0, 4)
        weight_bytes = listed[0]["weight_bytes"]
        call(url, None, PROMPTS[0], 4)  # warm the engine itself

        # 1. cold vs warm first call (memory measured around the cold loads)
        cold, warm = [], []
        rss_before = tree_rss(server.proc.pid)
        for n in names[: args.cold_samples]:
            cold.append(call(url, n, PROMPTS[0], 8)[0])
            warm.append(call(url, n, PROMPTS[0], 8)[0])
        base_lat = [call(url, None, PROMPTS[0], 8)[0] for _ in range(args.cold_samples)]
        # load the remaining adapters to measure memory growth per resident adapter
        for n in names[args.cold_samples:]:
            call(url, n, PROMPTS[0], 1)
        rss_after = tree_rss(server.proc.pid)
        result["first_call"] = {
            "cold_s": [round(x, 3) for x in cold], "warm_s": [round(x, 3) for x in warm],
            "base_s": [round(x, 3) for x in base_lat],
            "cold_median_s": round(statistics.median(cold), 3), "warm_median_s": round(statistics.median(warm), 3),
            "base_median_s": round(statistics.median(base_lat), 3),
            "load_overhead_s": round(statistics.median(cold) - statistics.median(warm), 3),
            "max_new_tokens": 8,
        }
        result["memory"] = {
            "adapter_weight_bytes": weight_bytes,
            "server_rss_growth_bytes_per_adapter": int((rss_after - rss_before) / len(names)),
            "resident_after": sum(a["status"] == "loaded" for a in httpx.get(url + "/adapters").json()["adapters"]),
            "note": "weights are float32 rank-8 LoRA on 7 projections x all layers; RSS growth is noisy at this size",
        }
        # 2. throughput
        loads_before = metric_sum(url, "lmi_adapter_loads_total")
        result["throughput"] = {}
        for label, adapters in (("base", [None]), ("1 adapter", names[:1]), ("4 adapters", names[:4]), ("16 adapters", names)):
            result["throughput"][label] = throughput(url, adapters, args.requests, args.concurrency, args.max_tokens)
            print(label, result["throughput"][label], flush=True)
        result["reloads_during_throughput"] = metric_sum(url, "lmi_adapter_loads_total") - loads_before
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora.json").write_text(json.dumps(result, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    fc = result["first_call"]
    a1.bar(["base", "adapter warm", "adapter cold"], [fc["base_median_s"], fc["warm_median_s"], fc["cold_median_s"]],
           color=["gray", "tab:blue", "tab:red"])
    a1.set_ylabel("latency (s), 8 new tokens")
    a1.set_title("First call: cold vs warm adapter")
    tp = result["throughput"]
    a2.bar(list(tp), [v["tokens_per_s"] for v in tp.values()], color=["gray", "tab:blue", "tab:blue", "tab:blue"])
    a2.set_ylabel("generated tokens / s")
    a2.set_title(f"Throughput ({args.requests} requests, {args.concurrency} in flight, max_loras=4)")
    fig.tight_layout()
    fig.savefig(args.out / "lora.png", dpi=110)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
