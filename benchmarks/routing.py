"""KV-aware routing, measured: vllm-router's policies side by side in front of the loopback cluster
of deploy/cluster.py (2 replicas of the demo model, LMCache with the Redis shared tier, vllm-router).

The replicas start once; only the router is restarted between policies. Each policy's requests
carry text no other policy sent (a run tag opens every prompt, and vLLM's and LMCache's prefix keys
chain over the whole prefix), so every policy starts from cold caches: what the previous policy
left in the replicas' prefix caches, LMCache tiers and Redis cannot be hit.

    round_robin       alternate replicas
    consistent_hash   hash ring on the X-Session-ID header (the cluster's default today)
    cache_aware       the router's approximate radix tree of the prompts it sent to each replica
    kv_aware          the router's index of each replica's KV blocks, fed by vLLM's KV events
                      (kv_events_config: a ZMQ publisher per replica, --kv-event-source per worker)

Workloads, per policy:
    multi_round_qa    U users, each a conversation of R rounds on one shared long system prompt
                      plus the user's own history (X-Session-ID = the user)
    shared_docs       D documents of ~1,500 tokens, Q questions each, arriving shuffled, from
                      several users (X-Session-ID = the user, who asks about any document)
    replica_death     shared_docs on fresh documents; replica 1 is SIGKILLed after K requests
                      completed; errors and TTFT before and after (the replica is restarted before
                      the next policy)

Recorded: TTFT p50/p99, prompt-token hit rate (usage.cached_tokens / prompt tokens: vLLM's prefix
cache and LMCache together), vLLM's prefix-cache queries/hits and LMCache hit tokens from each
replica's /metrics, requests per replica, errors.

    python benchmarks/routing.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine, pct, save, stream_completion  # noqa: E402
from benchmarks.multi_round_qa import QUESTIONS, metric_sum, user_context  # noqa: E402
from deploy import chart as helm_chart  # noqa: E402
from deploy.cluster import DEMO_PROPS, Cluster, ClusterError, free_port  # noqa: E402

MODEL = "lmi-demo"
POLICIES = ("round_robin", "consistent_hash", "cache_aware", "kv_aware")
# The chart's router with the health checks these runs have always used (every 2 s, one failure
# takes a replica out), so that replica_death stays comparable with the recorded results.
FAST_FAILOVER = {"router": {"healthCheck": {"intervalSecs": 2, "timeoutSecs": 2, "failureThreshold": 1, "successThreshold": 1}}}
DOC_SOURCES = ["collections/__init__.py", "functools.py", "enum.py", "textwrap.py", "heapq.py", "csv.py",
               "configparser.py", "difflib.py", "gettext.py", "optparse.py", "pprint.py", "calendar.py"]
DOC_QUESTIONS = [
    "\n\n# Question: what does this module do?\n# Answer:",
    "\n\n# Question: name one public function and its arguments.\n# Answer:",
    "\n\n# Question: which exceptions can it raise?\n# Answer:",
    "\n\n# Question: what is the most complex function here?\n# Answer:",
    "\n\n# Question: is any state global?\n# Answer:",
    "\n\n# Question: what would a unit test check first?\n# Answer:",
    "\n\n# Question: which imports does it need?\n# Answer:",
    "\n\n# Question: give a one-line summary.\n# Answer:",
]
VLLM_COUNTERS = {
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "external_prefix_queries": "vllm:external_prefix_cache_queries_total",
    "external_prefix_hits": "vllm:external_prefix_cache_hits_total",
    "lmcache_hit_tokens": "lmi_lmcache_lookup_hit_tokens_total",
    "lmcache_l2_hit_tokens": "lmi_lmcache_lookup_hit_l2_tokens_total",
}


# ---------------------------------------------------------------------------------------------
# Replica counters
# ---------------------------------------------------------------------------------------------


def replica_counters(url: str) -> dict[str, float] | None:
    """One replica's counters, or None when it does not answer (killed)."""
    try:
        out = {k: metric_sum(url, name) for k, name in VLLM_COUNTERS.items()}
        out["requests"] = metric_sum(url, "lmi_requests_total", route="/v1/completions", status="200")
        return out
    except httpx.HTTPError:
        return None


def snapshot(cluster: Cluster) -> list[dict[str, float] | None]:
    return [replica_counters(s.url) for s in cluster.servers]


def diff(after: list[dict | None], before: list[dict | None]) -> list[dict | None]:
    return [{k: a[k] - b[k] for k in a} if a is not None and b is not None else None for a, b in zip(after, before)]


def metrics_summary(per_replica: list[dict | None]) -> dict:
    live = [p for p in per_replica if p is not None]
    q = sum(p["prefix_queries"] for p in live)
    h = sum(p["prefix_hits"] for p in live)
    return {
        "requests_per_replica": [int(p["requests"]) if p is not None else None for p in per_replica],
        "vllm_prefix_queries": q,
        "vllm_prefix_hits": h,
        "vllm_prefix_hit_rate": h / q if q else None,
        "lmcache_hit_tokens": sum(p["lmcache_hit_tokens"] for p in live),
        "lmcache_l2_hit_tokens": sum(p["lmcache_l2_hit_tokens"] for p in live),
        "per_replica": per_replica,
    }


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------


def text_of(source: str, chars: int, offset: int = 0) -> str:
    text = Path(sysconfig.get_paths()["stdlib"], source).read_text()
    return text[offset:offset + chars]


def documents(tag: str, n: int, chars: int, first: int = 0) -> list[str]:
    return [f"# {tag} document {d}\n" + text_of(DOC_SOURCES[(first + d) % len(DOC_SOURCES)], chars) for d in range(n)]


async def one(client: httpx.AsyncClient, url: str, prompt: str, session: str, max_tokens: int, meta: dict) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    t_start = time.monotonic()
    r = await stream_completion(client, url + "/v1/completions", body, {"X-Session-ID": session})
    rec = {**meta, "ok": r.ok, "error": r.error, "t_start": t_start, "t_end": time.monotonic()}
    if r.ok:
        rec.update(ttft_s=r.ttft_s, latency_s=r.latency_s, prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens)
    return rec


async def multi_round_qa(url: str, tag: str, args) -> list[dict]:
    system = f"# {tag} shared system prompt\n" + text_of("argparse.py", args.system_chars, 2000)
    history = [f"\n# user {u}\n" + user_context(tag, u + 3, args.user_chars) for u in range(args.users)]
    records: list[dict] = []
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def ask(u: int, r: int) -> None:
            async with sem:
                records.append(await one(client, url, system + history[u] + QUESTIONS[r % len(QUESTIONS)],
                                         f"user-{tag}-{u}", args.max_tokens, {"user": u, "round": r}))

        for r in range(args.rounds):
            await asyncio.gather(*(ask(u, r) for u in range(args.users)))
            for u in range(args.users):  # this round's question and a fixed-length answer stand-in
                history[u] += QUESTIONS[r % len(QUESTIONS)] + " " + "x = y  # noted\n" * (args.max_tokens // 6 + 1)
    return records


def doc_requests(tag: str, docs: list[str], questions: int, users: int, seed: int) -> list[tuple[int, int, str]]:
    """(document, question, session) in a shuffled order; session = one of `users` users."""
    reqs = [(d, q) for d in range(len(docs)) for q in range(questions)]
    rng = random.Random(seed)
    rng.shuffle(reqs)
    return [(d, q, f"user-{tag}-{rng.randrange(users)}") for d, q in reqs]


async def shared_docs(url: str, tag: str, args, on_done=None, first_doc: int = 0) -> list[dict]:
    docs = documents(tag, args.docs, args.doc_chars, first_doc)
    # The same arrival order for every policy (only the text differs): which requests of one document
    # arrive together decides how many of them miss before the first one has been cached.
    plan = doc_requests(tag, docs, args.questions, args.doc_users, seed=args.seed + first_doc)
    records: list[dict] = []
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def ask(i: int, d: int, q: int, session: str) -> None:
            async with sem:
                rec = await one(client, url, docs[d] + DOC_QUESTIONS[q % len(DOC_QUESTIONS)], session, args.max_tokens,
                                {"i": i, "doc": d, "question": q})
            records.append(rec)
            if on_done is not None:
                on_done(len(records))

        await asyncio.gather(*(ask(i, d, q, s) for i, (d, q, s) in enumerate(plan)))
    return records


def summarise(records: list[dict]) -> dict:
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    return {
        "requests": len(records),
        "failed": len(records) - len(ok),
        "errors": sorted({r["error"] for r in records if not r["ok"]})[:3],
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "ttft_p50_ci90_s": bootstrap_ci(ttft),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else None,
    }


def bootstrap_ci(values: list[float], n: int = 2000, seed: int = 0) -> list[float] | None:
    """90 % bootstrap interval of the median (the noise band the default is chosen against)."""
    if len(values) < 3:
        return None
    rng = random.Random(seed)
    meds = sorted(pct([rng.choice(values) for _ in values], 50) for _ in range(n))
    return [meds[int(0.05 * n)], meds[int(0.95 * n)]]


# ---------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------


def kv_router_args(cluster: Cluster, zmq_ports: list[int], block_size: int) -> list[str]:
    args = []
    for server, port in zip(cluster.servers, zmq_ports):
        args += ["--kv-event-source", f"{server.url}=tcp://127.0.0.1:{port}"]
    # info: the router logs its KV-event subscriptions and prefix decisions
    return args + ["--kv-event-block-size", str(block_size), "--kv-event-model", MODEL, "--log-level", "info"]


def router_metrics(port: int) -> list[str]:
    """The router's own Prometheus lines about routing decisions, KV events and caches."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError as e:
        return [f"unavailable: {e!r}"]
    words = ("kv", "prefix", "cache", "policy", "decision", "worker", "event", "index")
    return [line for line in text.splitlines() if not line.startswith("#") and any(w in line.lower() for w in words)][:120]


def probe_render(url: str) -> dict:
    """kv_aware's router asks a worker for a prompt's token ids (vLLM's render API) before it can
    match them against the KV blocks that worker reported: what does a replica answer?"""
    out = {}
    for path, body in (("/v1/completions/render", {"model": MODEL, "prompt": "def f(x):"}),
                       ("/v1/chat/completions/render", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})):
        try:
            r = httpx.post(url + path, json=body, timeout=30)
            out[path] = f"{r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            out[path] = repr(e)
    return out


def labelled(lines: list[str], name: str) -> dict[str, float]:
    """{labels: value} of one metric in Prometheus text lines."""
    out = {}
    for line in lines:
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name:
            out[head[len(name):] or "{}"] = float(value)
    return out


def kv_aware_verdict(row: dict, render_probe: dict) -> dict:
    """Did kv_aware route on KV blocks? From the router's own counters of its decisions."""
    lines = row.get("router_metrics", [])
    decisions = labelled(lines, "vllm_router_prefix_routing_decisions_total")
    inputs = labelled(lines, "vllm_router_kv_routing_inputs_total")
    total = sum(decisions.values())
    missing = sum(v for k, v in decisions.items() if "missing_tokens" in k)
    verdict = {"decisions": decisions, "routing_inputs": inputs, "render_probe": render_probe}
    if "error" in row and "shared_docs" not in row:
        verdict.update(worked=False, why=row["error"])
    elif total and missing == total:
        verdict.update(worked=False, why=(
            f"the router started, subscribed to every replica's KV events (--kv-event-source) and served "
            f"every request, but all {int(total)} kv_aware decisions were 'missing_tokens' (routing inputs "
            f"{inputs}): before it can match a prompt against the KV blocks a worker reported, vllm-router "
            f"0.1.17 asks that worker for the prompt's token ids (POST /v1/completions/render, "
            f"/v1/chat/completions/render: vLLM's render API, vllm/entrypoints/scale_out/render), and "
            f"lmi-server does not serve it: {render_probe}. Without token ids kv_aware falls back to "
            f"load-based choice, so it was measured as a load balancer, not as KV-aware routing."))
    elif total:
        verdict.update(worked=True, why=f"{int(total - missing)} of {int(total)} decisions had token ids to match")
    else:
        verdict.update(worked=None, why="the router exposed no kv_aware decision counters")
    return verdict


def router_log_digest(log: str, offset: int) -> dict:
    """What the router logged during one policy's run (from `offset`): counts of its KV-index and
    routing-decision lines and a few distinct examples (ANSI colours stripped)."""
    import re

    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
    keys = ("kv_index", "KV prefix", "kv_aware", "KvAware", "event", "subscriber", "prefix decision", "ERROR", "WARN")
    counts = {k: sum(k in line for line in lines) for k in keys}
    examples, seen = [], set()
    for line in lines:
        if any(k in line for k in keys):
            shape = re.sub(r"[0-9]+", "N", line.split(" ", 2)[-1])[:120]
            if shape not in seen:
                seen.add(shape)
                examples.append(line[:600])
    return {"counts": counts, "examples": examples[:25]}


def engine_view(model_dir: Path) -> dict:
    """What `lmi-server config` resolves for a replica: the model directory and block size."""
    out = subprocess.run([sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(model_dir)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    doc = json.loads(out[out.index("{"):])
    return doc["vllm_engine_args"]


async def replica_death(cluster: Cluster, tag: str, args) -> dict:
    victim = cluster.servers[1]
    killed: dict = {}

    def on_done(n: int) -> None:
        if n == args.kill_after and not killed:
            killed["t"] = time.monotonic()
            victim.kill()  # SIGKILL the server and everything under it (engine, LMCache server)

    records = await shared_docs(cluster.router.url, tag, args, on_done=on_done, first_doc=args.docs)
    t_kill = killed.get("t", float("inf"))
    before = [r for r in records if r["t_end"] <= t_kill]
    inflight = [r for r in records if r["t_start"] < t_kill < r["t_end"]]
    after = [r for r in records if r["t_start"] >= t_kill]
    return {
        "killed": victim.name,
        "kill_after_completed": args.kill_after,
        "before": summarise(before),
        "in_flight_at_kill": summarise(inflight),
        "after": summarise(after),
        "after_errors": [r["error"] for r in after + inflight if not r["ok"]][:5],
        "records": records,
    }


def run_policy(cluster: Cluster, policy: str, args, zmq_ports: list[int], block_size: int) -> dict:
    prom_port = free_port()
    extra = ["--prometheus-port", str(prom_port)]  # after the cluster's own: the last one wins
    if policy == "kv_aware":
        extra += kv_router_args(cluster, zmq_ports, block_size)
    row: dict = {"policy": policy, "router_args": extra}
    router_log = cluster.state_dir / "router.log"
    log_offset = router_log.stat().st_size if router_log.exists() else 0
    try:
        cluster.start_router(policy, extra_args=extra)
    except ClusterError as e:
        row["error"] = f"router did not start: {e}"
        return row
    try:
        if not cluster.router.alive:
            raise ClusterError(f"router exited: {cluster.router.log_tail()}")
        for name, fn in (("multi_round_qa", multi_round_qa), ("shared_docs", shared_docs)):
            tag = f"{policy}-{name}-{uuid.uuid4().hex[:6]}"
            before = snapshot(cluster)
            t0 = time.monotonic()
            records = asyncio.run(fn(cluster.router.url, tag, args))
            wall = time.monotonic() - t0
            m = metrics_summary(diff(snapshot(cluster), before))
            s = summarise(records)
            row[name] = {**s, **m, "wall_s": wall, "records": records}
            print(f"{policy:>16} {name:<15} TTFT p50 {s['ttft_p50_s']:.3f} s p99 {s['ttft_p99_s']:.3f} s "
                  f"hit {s['hit_rate'] or 0:.0%} (vLLM prefix {m['vllm_prefix_hit_rate'] or 0:.0%}, LMCache "
                  f"{m['lmcache_hit_tokens']:.0f} tok) split {m['requests_per_replica']} failed {s['failed']}", flush=True)
        if args.death:
            tag = f"{policy}-death-{uuid.uuid4().hex[:6]}"
            before = snapshot(cluster)
            death = asyncio.run(replica_death(cluster, tag, args))
            death.update(metrics_summary(diff(snapshot(cluster), before)))
            row["replica_death"] = death
            a = death["after"]
            print(f"{policy:>16} replica death   before p50 {death['before']['ttft_p50_s']:.3f} s, after p50 "
                  f"{a['ttft_p50_s']:.3f} s p99 {a['ttft_p99_s']:.3f} s, failed in flight "
                  f"{death['in_flight_at_kill']['failed']}/{death['in_flight_at_kill']['requests']}, after "
                  f"{a['failed']}/{a['requests']} {death['after_errors'][:1]}", flush=True)
    except Exception as e:  # record and go on to the next policy
        row["error"] = f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()[-2000:]
        row["router_log_tail"] = cluster.router.log_tail(30) if cluster.router else ""
        print(f"{policy}: {row['error']}", flush=True)
    finally:
        if cluster.router is not None:
            row["router_metrics"] = router_metrics(prom_port)
            row["router_log"] = router_log_digest(str(router_log), log_offset)
            row["router_log_tail"] = row.get("router_log_tail") or cluster.router.log_tail(30)
        cluster.stop_router()
    return row


# ---------------------------------------------------------------------------------------------
# Verdict and chart
# ---------------------------------------------------------------------------------------------


def winner(rows: list[dict]) -> dict:
    """The best shared-documents TTFT p50 (hit rate breaks ties); "clear" when its 90 % bootstrap
    interval lies below every other policy's."""
    ok = [r for r in rows if "shared_docs" in r and r["shared_docs"]["ttft_p50_s"] == r["shared_docs"]["ttft_p50_s"]]
    if not ok:
        return {"policy": None, "clear": False, "why": "no policy measured"}
    ranked = sorted(ok, key=lambda r: (round(r["shared_docs"]["ttft_p50_s"], 3), -(r["shared_docs"]["hit_rate"] or 0)))
    best, rest = ranked[0], ranked[1:]
    ci = best["shared_docs"]["ttft_p50_ci90_s"]
    clear = bool(ci) and all(r["shared_docs"]["ttft_p50_ci90_s"] and ci[1] < r["shared_docs"]["ttft_p50_ci90_s"][0] for r in rest)
    return {
        "policy": best["policy"], "clear": clear,
        "ranking": [(r["policy"], r["shared_docs"]["ttft_p50_s"], r["shared_docs"]["ttft_p50_ci90_s"], r["shared_docs"]["hit_rate"]) for r in ranked],
        "rule": "lowest shared_docs TTFT p50, hit rate as tie-break; clear = its 90 % bootstrap interval of the "
                "median lies below every other policy's interval",
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if "shared_docs" in r]
    labels = [r["policy"] for r in measured]
    x = list(range(len(measured)))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    w = 0.2
    for k, (name, key) in enumerate((("multi_round_qa", "ttft_p50_s"), ("multi_round_qa", "ttft_p99_s"),
                                     ("shared_docs", "ttft_p50_s"), ("shared_docs", "ttft_p99_s"))):
        axes[0].bar([i + (k - 1.5) * w for i in x], [r[name][key] for r in measured], w, label=f"{name} {key[5:8]}")
    axes[0].set_xticks(x, labels, fontsize=8)
    axes[0].set_ylabel("TTFT (s)")
    axes[0].set_title("Time to first token")
    axes[0].legend(fontsize=7)
    for k, name in enumerate(("multi_round_qa", "shared_docs")):
        axes[1].bar([i + (k - 0.5) * 0.38 for i in x], [100 * (r[name]["hit_rate"] or 0) for r in measured], 0.38, label=name)
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set_ylim(0, 100)
    axes[1].set_ylabel("prompt tokens from cache (%)")
    axes[1].set_title("Hit rate")
    axes[1].legend(fontsize=7)
    dead = [r for r in measured if "replica_death" in r]
    dx = list(range(len(dead)))
    axes[2].bar([i - 0.2 for i in dx], [r["replica_death"]["before"]["ttft_p50_s"] for r in dead], 0.4, label="TTFT p50 before kill")
    axes[2].bar([i + 0.2 for i in dx], [r["replica_death"]["after"]["ttft_p50_s"] for r in dead], 0.4, label="TTFT p50 after kill")
    for i, r in zip(dx, dead):
        failed = r["replica_death"]["in_flight_at_kill"]["failed"] + r["replica_death"]["after"]["failed"]
        axes[2].annotate(f"{failed} failed", (i, 0), ha="center", va="bottom", fontsize=7)
    axes[2].set_xticks(dx, [r["policy"] for r in dead], fontsize=8)
    axes[2].set_ylabel("TTFT (s)")
    axes[2].set_title("Replica SIGKILLed mid-run (shared docs)")
    axes[2].legend(fontsize=7)
    fig.suptitle("vllm-router policies, 2 lmi-server replicas + Redis tier (CPU, demo model)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def strip_records(rows: list[dict]) -> list[dict]:
    """Keep per-request records compact in the JSON (ttft, tokens, error)."""
    keep = ("user", "round", "doc", "question", "ok", "error", "ttft_s", "prompt_tokens", "cached_tokens")
    out = []
    for r in rows:
        r = dict(r)
        for name in ("multi_round_qa", "shared_docs", "replica_death"):
            if name in r:
                r[name] = {**r[name], "records": [{k: rec.get(k) for k in keep if k in rec} for rec in r[name]["records"]]}
        out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--system-chars", type=int, default=4000, help="shared system prompt (~1k tokens)")
    ap.add_argument("--user-chars", type=int, default=1500)
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--doc-chars", type=int, default=5000, help="characters per document (~1,500 tokens)")
    ap.add_argument("--questions", type=int, default=8, help="questions per document")
    ap.add_argument("--doc-users", type=int, default=7)
    ap.add_argument("--kill-after", type=int, default=8, help="replica death run: completed requests before the SIGKILL")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="arrival order of the shared-documents requests (same for every policy)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--no-death", dest="death", action="store_false")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 users x 2 rounds, 2 docs x 3 questions")
    ap.add_argument("--out", default="routing")
    args = ap.parse_args()
    if args.quick:
        args.users, args.rounds, args.docs, args.questions, args.kill_after = 2, 2, 2, 3, 3
    policies = args.policies.split(",")

    t_start = time.monotonic()
    zmq_ports = [free_port(), free_port()]
    rows: list[dict] = []
    notes: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        # Every replica publishes KV events (whatever the policy, so all policies pay the same),
        # each on its own loopback port; only kv_aware's router subscribes.
        cluster = Cluster(
            state_dir=Path(tmp), replicas=2, shared_cache=True, props=DEMO_PROPS, chart=helm_chart.load(overrides=FAST_FAILOVER),
            replica_props=lambda i: {"option.kv_events_config": json.dumps(
                {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{zmq_ports[i]}"})},
        )
        try:
            t0 = time.monotonic()
            cluster.up(with_router=False)
            notes["replicas_ready_s"] = round(time.monotonic() - t0, 1)
            engine = engine_view(Path(tmp) / "replica-0")
            from lmi_server.preflight import engine_block_size

            block_size = engine_block_size(engine, gpu=False)
            # The router tokenizes prompts itself to match them against the replicas' KV blocks.
            cluster.router_env = {"VLLM_ROUTER_TOKENIZER": engine.get("tokenizer") or engine["model"]}
            notes.update(block_size=block_size, router_tokenizer=cluster.router_env["VLLM_ROUTER_TOKENIZER"],
                         kv_events_config=cluster.replica_properties(0, Path(tmp) / "lmcache.yaml")["option.kv_events_config"])
            notes["render_probe"] = probe_render(cluster.servers[0].url)
            print(f"replicas ready in {notes['replicas_ready_s']} s; block size {block_size}; render API: "
                  f"{notes['render_probe']}", flush=True)
            for s in cluster.servers:  # first request of a fresh engine (warm-up, not measured)
                httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "warm up", "max_tokens": 2}, timeout=300)
            for policy in policies:
                for i, s in enumerate(cluster.servers):
                    if not s.alive:
                        t0 = time.monotonic()
                        cluster.restart_replica(i)
                        httpx.post(cluster.servers[i].url + "/v1/completions",
                                   json={"model": MODEL, "prompt": "warm up", "max_tokens": 2}, timeout=300)
                        print(f"{s.name} restarted in {time.monotonic() - t0:.0f} s", flush=True)
                rows.append(run_policy(cluster, policy, args, zmq_ports, block_size))
        finally:
            cluster.down()

    doc = {
        "benchmark": "routing",
        "description": __doc__.strip().split("\n\n")[0],
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine(),
        "setup": notes,
        "warm_caches": "replicas start once and only the router restarts between policies; every policy's prompts "
                       "open with a run tag no other policy sent, so no policy can hit what an earlier one cached "
                       "(vLLM prefix cache, LMCache CPU tier, Redis); KV events are published by every replica in "
                       "every run (equal cost), only kv_aware subscribes",
        "note": "CPU host (2 cores) shared with other jobs; toy demo model; one run per policy, run one after "
                "another: absolute times are noisy, see ttft_p50_ci90_s (bootstrap over requests).",
        "results": strip_records(rows),
        "kv_aware": next((kv_aware_verdict(r, notes.get("render_probe", {})) for r in rows if r["policy"] == "kv_aware"), None),
        "winner_shared_docs": winner(rows),
        "total_s": time.monotonic() - t_start,
    }
    path = save(args.out, doc)
    plot(rows, RESULTS / f"{args.out}.png")
    print(json.dumps({"kv_aware": doc["kv_aware"], "winner": doc["winner_shared_docs"]}, indent=1))
    print(f"wrote {path} and {RESULTS / (args.out + '.png')} in {doc['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
