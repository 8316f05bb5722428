"""Multi-round QA across replicas (after LMCache's multi-round QA benchmark): U users, each with
their own long context, ask R rounds of questions; every round's prompt is the whole history so
far (context + earlier questions + the model's answers), so each request extends the previous one.

All requests go through vLLM's router (`vllm-router`) in front of two lmi-server replicas
(deploy/cluster.py, loopback only). Four configurations:

    routing      round_robin | consistent_hash (session-sticky on the X-Session-ID header)
    cache        local (each replica's own LMCache CPU tier) | shared (+ Redis remote tier)

Reported per configuration: prompt-token cache hit rate (usage.cached_tokens / prompt tokens,
which counts vLLM's own prefix cache and LMCache together), TTFT mean and p90 (all rounds, and
rounds >= 2 where a cache can help), how the replicas split the requests, and LMCache's L2 hits.

    python benchmarks/multi_round_qa.py [--users 5] [--rounds 4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine, pct, save, stream_completion  # noqa: E402
from deploy.cluster import DEMO_PROPS, Cluster  # noqa: E402

MODEL = "lmi-demo"
SOURCES = ["argparse.py", "json/decoder.py", "logging/__init__.py", "subprocess.py", "pathlib.py",
           "dataclasses.py", "typing.py", "inspect.py", "tarfile.py", "zipfile.py", "shutil.py", "ast.py"]
QUESTIONS = [
    "\n\n# Question: which function here is the entry point, and what does it return?\n# Answer:",
    "\n\n# Question: list the exceptions this module raises and when.\n# Answer:",
    "\n\n# Question: what would you refactor first, and why?\n# Answer:",
    "\n\n# Question: write a short docstring for the main class.\n# Answer:",
    "\n\n# Question: which parts are not thread safe?\n# Answer:",
    "\n\n# Question: summarise the module in two sentences.\n# Answer:",
]
POLICIES = ("round_robin", "consistent_hash")


def user_context(run: str, user: int, chars: int) -> str:
    """A distinct long document per user and per run (the first line differs, so no run can hit a
    previous run's cache: LMCache's chunk keys chain over the whole prefix)."""
    text = Path(sysconfig.get_paths()["stdlib"], SOURCES[user % len(SOURCES)]).read_text()
    return f"# run {run} user {user}\n" + text[:chars]


def metric_sum(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def replica_counters(cluster: Cluster) -> list[dict[str, float]]:
    return [
        {
            "requests": metric_sum(s.url, "lmi_requests_total", route="/v1/completions", status="200"),
            "l2_hit_tokens": metric_sum(s.url, "lmi_lmcache_lookup_hit_l2_tokens_total"),
            "lmcache_hit_tokens": metric_sum(s.url, "lmi_lmcache_lookup_hit_tokens_total"),
        }
        for s in cluster.servers
    ]


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> dict:
    """One streaming completion: TTFT, latency and the final usage (prompt and cached tokens)."""
    r = await stream_completion(client, url, body, headers)
    if not r.ok:
        return {"ok": False, "error": r.error}
    return {
        "ok": True, "error": "", "ttft_s": r.ttft_s, "latency_s": r.latency_s,
        "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
    }


async def run_config(router_url: str, users: int, rounds: int, context_chars: int, max_tokens: int, concurrency: int) -> dict:
    run = uuid.uuid4().hex[:8]
    history = [user_context(run, u, context_chars) for u in range(users)]
    records: list[dict] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def ask(u: int, r: int) -> None:
            prompt = history[u] + QUESTIONS[r % len(QUESTIONS)]
            body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            # The router's session key. (vllm-router 0.1.17 reads body keys such as OpenAI's
            # `user` only on its transparent proxy; on /v1/* it hashes the prompt text instead.)
            headers = {"X-Session-ID": f"user-{run}-{u}"}
            async with sem:
                res = await stream_request(client, router_url + "/v1/completions", body, headers)
            records.append({"user": u, "round": r, **res})

        t0 = time.perf_counter()
        for r in range(rounds):
            await asyncio.gather(*(ask(u, r) for u in range(users)))
            # Extend each history with this round's question and a fixed-length answer stand-in
            # (greedy output of the toy model is noise; its length is what matters for the cache).
            for u in range(users):
                history[u] += QUESTIONS[r % len(QUESTIONS)] + " " + "x = y  # noted\n" * (max_tokens // 6 + 1)
        wall = time.perf_counter() - t0
    return {"records": records, "wall_s": wall}


def summarise(records: list[dict]) -> dict:
    ok = [r for r in records if r["ok"]]
    later = [r for r in ok if r["round"] >= 1]
    total_prompt = sum(r["prompt_tokens"] for r in ok)
    total_cached = sum(r["cached_tokens"] for r in ok)
    later_prompt = sum(r["prompt_tokens"] for r in later)
    later_cached = sum(r["cached_tokens"] for r in later)
    ttft = [r["ttft_s"] for r in ok]
    ttft_later = [r["ttft_s"] for r in later]
    return {
        "requests": len(records),
        "failed": len(records) - len(ok),
        "errors": sorted({r["error"] for r in records if not r["ok"]})[:3],
        "prompt_tokens": total_prompt,
        "cached_tokens": total_cached,
        "hit_rate": total_cached / total_prompt if total_prompt else 0.0,
        "hit_rate_rounds_2plus": later_cached / later_prompt if later_prompt else 0.0,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"),
        "ttft_p90_s": pct(ttft, 90),
        "ttft_mean_rounds_2plus_s": statistics.fmean(ttft_later) if ttft_later else float("nan"),
        "ttft_p90_rounds_2plus_s": pct(ttft_later, 90),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['routing']}\n{r['cache']}" for r in results]
    x = range(len(results))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.bar(x, [100 * r["summary"]["hit_rate_rounds_2plus"] for r in results], color="tab:green")
    ax1.set_xticks(list(x), labels, fontsize=8)
    ax1.set_ylabel("prompt tokens from cache, rounds >= 2 (%)")
    ax1.set_ylim(0, 100)
    ax1.set_title("Cache hit rate")
    w = 0.38
    ax2.bar([i - w / 2 for i in x], [r["summary"]["ttft_mean_rounds_2plus_s"] for r in results], w, label="mean")
    ax2.bar([i + w / 2 for i in x], [r["summary"]["ttft_p90_rounds_2plus_s"] for r in results], w, label="p90")
    ax2.set_xticks(list(x), labels, fontsize=8)
    ax2.set_ylabel("TTFT, rounds >= 2 (s)")
    ax2.set_title("Time to first token")
    ax2.legend()
    fig.suptitle("Multi-round QA through vllm-router, 2 lmi-server replicas (CPU, demo model)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=5, help="odd, so that round-robin over 2 replicas does not pin each user by accident")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--context-chars", type=int, default=9000, help="characters of source text per user (~2k tokens)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="3 users x 3 rounds (a smoke run)")
    ap.add_argument("--out", default="multi_round_qa")
    args = ap.parse_args()
    if args.quick:
        args.users, args.rounds = 3, 3

    results = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-mrqa-") as tmp:
        for shared in (False, True):
            state = Path(tmp) / ("shared" if shared else "local")
            state.mkdir()
            cluster = Cluster(state_dir=state, replicas=2, shared_cache=shared, props=DEMO_PROPS)
            try:
                t0 = time.monotonic()
                cluster.up(with_router=False)
                print(f"replicas ({'shared' if shared else 'local'} tier) ready in {time.monotonic() - t0:.0f} s", flush=True)
                for policy in POLICIES:
                    cluster.start_router(policy)
                    before = replica_counters(cluster)
                    run = asyncio.run(run_config(cluster.router.url, args.users, args.rounds, args.context_chars, args.max_tokens, args.concurrency))
                    after = replica_counters(cluster)
                    cluster.stop_router()
                    summary = summarise(run["records"])
                    summary["wall_s"] = run["wall_s"]
                    per_replica = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
                    row = {"routing": policy, "cache": "shared (Redis)" if shared else "local", "summary": summary,
                           "replicas": per_replica}
                    results.append(row)
                    print(f"{policy:>16} {row['cache']:<15} hit {summary['hit_rate_rounds_2plus']:.0%} "
                          f"TTFT mean {summary['ttft_mean_rounds_2plus_s']:.3f} s p90 {summary['ttft_p90_rounds_2plus_s']:.3f} s "
                          f"failed {summary['failed']} split {[int(p['requests']) for p in per_replica]}", flush=True)
            finally:
                cluster.down()

    doc = {
        "benchmark": "multi_round_qa",
        "description": __doc__.strip().split("\n\n")[0],
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine(),
        "note": "CPU host shared with other jobs; toy demo model (vLLM prefix caching on, LMCache CPU tier 1 GiB per "
                "replica). Round 1 is cold in every configuration; rounds >= 2 show what routing and the shared tier buy.",
        "results": results,
        "total_s": time.monotonic() - t_start,
    }
    path = save(args.out, doc)
    plot(results, RESULTS / f"{args.out}.png")
    print(f"wrote {path} and {RESULTS / (args.out + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
