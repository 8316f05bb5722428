#!/usr/bin/env python
"""Fair admission under multi-tenant load, against FIFO, side by side in one run.

    python benchmarks/fairness.py            # writes benchmarks/results/fairness.{json,png}
    python benchmarks/fairness.py --reserved-slots 1 --name fairness_reserve1
    python benchmarks/fairness.py --tenants adapters   # benchmarks/results/fairness_adapters{,_series}.png + .json

`--tenants adapters`: one LoRA adapter floods, another probes, tenants named by the adapters, by API
keys, and by the adapters with LMCache on (`benchmarks/fairness_tenants.py`). Otherwise:

For each admission policy (`option.admission_policy=fifo`, then `fair`) the built-in assistant
(`make serve`'s model) is started with `option.max_num_seqs=8` (fair: plus `option.reserved_slots`, default 2) and `option.tenant_header=x-tenant-id`;
three tenants send streaming chat requests (greedy, `ignore_eos`, the same length each):

  1. A idle: tenants B and C each send one request every `--interval` seconds for `--baseline-s`;
  2. flood: tenant A sends `--flood` requests at once while B and C go on as before, until every
     request of A has ended (completed, or refused with 429).

Recorded per policy and phase: TTFT p50/p99 of B and C, what became of A's requests (completed,
429, other failures), and output tokens/s of all tenants over the flood phase.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import fairness_tenants  # noqa: E402
from benchmarks.common import RESULTS, RequestResult, builtin_server, machine, pct, save, stream_completion  # noqa: E402

QUESTIONS = [
    "What is the capital of France?", "How do I reverse a list in Python?", "Why do we have day and night?",
    "What is photosynthesis?", "How does a bicycle stay upright?", "What are the three states of water?",
    "Write a haiku about autumn leaves.", "What does HTTP stand for?", "Why is the ocean salty?",
]


def body(i: int, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


async def one(client: httpx.AsyncClient, url: str, tenant: str, i: int, max_tokens: int, sent_at: float) -> dict:
    r: RequestResult = await stream_completion(client, url + "/v1/chat/completions", body(i, max_tokens), {"x-tenant-id": tenant})
    status = 200 if r.ok else int(r.error.split(":")[0]) if r.error[:3].isdigit() else 0
    return {"tenant": tenant, "ok": r.ok, "status": status, "ttft_s": r.ttft_s, "latency_s": r.latency_s,
            "tokens": r.output_tokens, "sent_s": sent_at, "ended_s": sent_at + r.latency_s, "error": r.error[:120]}


async def ticker(client, url, tenant, offset_s, interval_s, stop: asyncio.Event, max_tokens: int, t0: float) -> list:
    tasks = []
    await asyncio.sleep(offset_s)
    i = 0
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(client, url, tenant, i, max_tokens, time.perf_counter() - t0)))
        i += 1
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass
    return list(await asyncio.gather(*tasks))


async def queue_waits(client: httpx.AsyncClient, url: str) -> dict:
    """Per tenant, how many admitted requests waited for an engine slot more than 0.1 / 0.5 s, from
    the server's own histogram (idle phase included): tells a wait for a slot from a slow engine step."""
    text = (await client.get(url + "/metrics")).text
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("lmi_tenant_queue_wait_seconds_bucket{"):
            continue
        labels, value = line[line.index("{") + 1:line.index("}")], float(line.split()[-1])
        fields = dict(part.split("=", 1) for part in labels.split(","))
        tenant, le = fields["tenant"].strip('"'), fields["le"].strip('"')
        out.setdefault(tenant, {})[le] = value
    result = {}
    for tenant, buckets in out.items():
        total = buckets.get("+Inf", 0.0)
        result[tenant] = {"admitted": total, "waited_over_0.1_s": total - buckets.get("0.1", 0.0),
                          "waited_over_0.5_s": total - buckets.get("0.5", 0.0)}
    return result


def summary(results: list[dict]) -> dict:
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    return {"requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
            "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3),
            "ttft_max_s": round(max(ttft), 3) if ttft else None}


async def run_policy(url: str, args) -> dict:
    limits = httpx.Limits(max_connections=args.flood + 32, max_keepalive_connections=args.flood + 32)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        await one(client, url, "warmup", 0, args.max_tokens, 0.0)
        # 1. A idle
        t0 = time.perf_counter()
        stop = asyncio.Event()
        b = asyncio.create_task(ticker(client, url, "B", 0.0, args.interval, stop, args.max_tokens, t0))
        c = asyncio.create_task(ticker(client, url, "C", args.interval / 2, args.interval, stop, args.max_tokens, t0))
        await asyncio.sleep(args.baseline_s)
        stop.set()
        idle = {"B": summary(await b), "C": summary(await c)}
        print(f"  A idle: {idle}", flush=True)
        # 2. flood
        t0 = time.perf_counter()
        stop = asyncio.Event()
        b = asyncio.create_task(ticker(client, url, "B", 0.5, args.interval, stop, args.max_tokens, t0))
        c = asyncio.create_task(ticker(client, url, "C", 0.5 + args.interval / 2, args.interval, stop, args.max_tokens, t0))
        flood = await asyncio.gather(*(one(client, url, "A", i, args.max_tokens, 0.0) for i in range(args.flood)))
        a_end = time.perf_counter() - t0
        stop.set()
        rb, rc = await b, await c
        wall = time.perf_counter() - t0
        waits = await queue_waits(client, url)
        everyone = flood + rb + rc
        tokens = sum(r["tokens"] for r in everyone)
        a_statuses: dict[str, int] = {}
        for r in flood:
            a_statuses[str(r["status"])] = a_statuses.get(str(r["status"]), 0) + 1
        out = {
            "A_idle": idle,
            "flood": {"B": summary(rb), "C": summary(rc), "A": summary(flood) | {"statuses": a_statuses},
                      "A_done_s": round(a_end, 1), "wall_s": round(wall, 1), "output_tokens": tokens,
                      "output_tokens_per_s": round(tokens / wall, 2),
                      "A_errors": sorted({r["error"] for r in flood if not r["ok"] and r["status"] != 429})[:3],
                      "queue_wait": waits},
            "timeline": {t: [[round(r["sent_s"], 2), round(r["ttft_s"], 3)] for r in everyone if r["tenant"] == t and r["ok"]]
                         for t in ("B", "C")},
        }
        print(f"  flood: {out['flood']}", flush=True)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", nargs="+", default=["fifo", "fair"], choices=["fifo", "fair"])
    ap.add_argument("--flood", type=int, default=150)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--baseline-s", type=float, default=16.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--reserved-slots", type=int, default=None, help="option.reserved_slots (default: the server's)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="another option.KEY for both servers (e.g. max_num_batched_tokens=96)")
    ap.add_argument("--name", default=None, help="results name (default: fairness, or fairness_adapters)")
    ap.add_argument("--tenants", choices=["header", "adapters"], default="header",
                    help="header: tenants A/B/C by x-tenant-id, FIFO vs fair; adapters: flood on one adapter, probes on another")
    ap.add_argument("--variants", nargs="+", default=list(fairness_tenants.VARIANTS), choices=fairness_tenants.VARIANTS,
                    help="--tenants adapters: tenants by adapter, by API key, by adapter with LMCache on")
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="--tenants adapters: solo probes + flood, this many times per server")
    ap.add_argument("--probe-every", type=float, default=1.5)
    ap.add_argument("--probe-delay", type=float, default=1.0, help="seconds into the flood the first probe is sent")
    ap.add_argument("--scrape-every", type=float, default=0.5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lmi-fair-"))
    load_start = os.getloadavg()
    if args.tenants == "adapters":
        return adapters_main(args, work, load_start)
    args.name = args.name or "fairness"
    runs = {}
    for policy in args.policies:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
        env.update({"OPTION_MAX_NUM_SEQS": str(args.max_num_seqs), "OPTION_ADMISSION_POLICY": policy,
                    "OPTION_TENANT_HEADER": "x-tenant-id"})
        if args.reserved_slots is not None:
            env["OPTION_RESERVED_SLOTS"] = str(args.reserved_slots)
        for option in args.option:
            key, _, value = option.partition("=")
            env["OPTION_" + key.removeprefix("option.").upper()] = value
        server = builtin_server(policy, work, env)
        print(f"policy {policy}", flush=True)
        with server:
            runs[policy] = asyncio.run(run_policy(server.url, args))
    doc = {"benchmark": "fairness", "machine": machine(), "load_average_at_start": load_start,
           "load_average_at_end": os.getloadavg(), "args": vars(args), "runs": runs}
    if "fifo" in runs and "fair" in runs:
        doc["fair_vs_fifo_tokens_per_s"] = round(
            runs["fair"]["flood"]["output_tokens_per_s"] / runs["fifo"]["flood"]["output_tokens_per_s"], 3)
        for p in runs:
            for t in ("B", "C"):
                idle = runs[p]["A_idle"][t]
                flood = runs[p]["flood"][t]
                runs[p]["flood"][t]["ttft_p50_vs_idle"] = round(flood["ttft_p50_s"] / idle["ttft_p50_s"], 2)
                runs[p]["flood"][t]["ttft_p99_vs_idle"] = round(flood["ttft_p99_s"] / idle["ttft_p99_s"], 2)
    path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    print(f"wrote {path}")
    return 0


def adapters_main(args, work: Path, load_start) -> int:
    args.name = args.name or "fairness_adapters"

    def argv_for(port: int) -> list[str]:
        return [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"),
                "--host", "127.0.0.1", "--port", str(port)]

    def document(runs: dict) -> dict:
        return {"benchmark": "fairness_adapters", "machine": machine() | {"cpu_flags": fairness_tenants.cpu_flags()},
                "engine_cpu_env": fairness_tenants.engine_cpu_env(),
                "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(), "args": vars(args), "runs": runs}

    doc = document(fairness_tenants.run(args, work, argv_for, lambda runs: save(args.name, document(runs))))
    path = save(args.name, doc)
    fairness_tenants.plot(doc, args.name)
    print(f"wrote {path}")
    return 0


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    groups = [(f"A idle, {p}", p, runs[p]["A_idle"]) for p in runs] + [(f"flood, {p}", p, runs[p]["flood"]) for p in runs]
    labels, xs = [], []
    for j, (label, _, phase) in enumerate(groups):
        for k, (t, stat) in enumerate([(t, s) for t in ("B", "C") for s in ("ttft_p50_s", "ttft_p99_s")]):
            x = j * 5 + k
            axes[0].bar(x, phase[t][stat], color=("tab:blue" if t == "B" else "tab:green"), alpha=1.0 if "p50" in stat else 0.5)
        labels.append(label)
        xs.append(j * 5 + 1.5)
    axes[0].set_yscale("log")
    axes[0].set_xticks(xs, labels, rotation=15)
    axes[0].set_ylabel("TTFT (s), log scale")
    axes[0].set_title("TTFT of B (blue) and C (green): p50 solid, p99 light")
    for p, color in (("fifo", "tab:red"), ("fair", "tab:blue")):
        if p not in runs:
            continue
        for t, marker in (("B", "o"), ("C", "s")):
            pts = runs[p]["timeline"][t]
            axes[1].plot([a for a, _ in pts], [b for _, b in pts], marker=marker, linestyle="-", color=color,
                         label=f"{p} {t}", markersize=3, alpha=0.8)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("request sent at (s after the flood began)")
    axes[1].set_ylabel("TTFT (s)")
    tps = ", ".join(f"{p} {runs[p]['flood']['output_tokens_per_s']} tok/s" for p in runs)
    axes[1].set_title(f"during A's flood of {doc['args']['flood']} ({tps})")
    axes[1].legend(fontsize=8)
    la = doc["load_average_at_start"][0]
    reserve = doc["args"].get("reserved_slots")
    fig.suptitle(f"Fair admission vs FIFO, assistant, max_num_seqs={doc['args']['max_num_seqs']}, "
                 f"reserved_slots={'default' if reserve is None else reserve}, "
                 f"{doc['machine']['cpus']} CPUs, load avg {la:.1f} at start")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
