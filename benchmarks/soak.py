#!/usr/bin/env python
"""Soak: N streaming chat clients for D minutes, bad requests mixed in, the cache server killed
half-way; what happens over time, per 10-second window.

    python benchmarks/soak.py                          # 64 clients, 10 minutes, demo model
    python benchmarks/soak.py --clients 16 --minutes 2 --name soak_short

The server is `lmi-server serve` on the demo model with the LMCache CPU tier
(lmcache_configs/cpu.yaml with a 2 GiB CPU tier). Each client loops: a streaming chat request (a shared system prompt
plus its own question, so the cache sees reuse), and every fifth round one bad request (malformed
JSON, unknown model, out-of-range parameter, oversized body: each must get a 4xx). Half-way the
LMCache cache server is SIGKILLed (the supervisor must bring it back; requests must keep
succeeding). Recorded per window: completed and failed requests by kind, TTFT and inter-token
latency p50/p99, the queue depth (lmi_queue_depth) and the cache-server restarts from /metrics,
and the RSS of the whole server process tree. The client is the benchmarks' one streaming
client (benchmarks/common.py): the windows, the fault and the bad requests are what a generic
load tool (vLLM's `bench serve`, locust) would not do without as much glue.
Results: benchmarks/results/NAME.json and NAME.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, RESULTS, Server, free_port, machine, pct, save, stream_completion  # noqa: E402

WINDOW_S = 10
SYSTEM = "You are a careful assistant that answers questions about Python code. " * 20
BAD_REQUESTS = [
    ("malformed_json", {"content": b'{"model": "lmi-demo", "messages": [', "headers": {"content-type": "application/json"}}),
    ("unknown_model", {"json": {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}}),
    ("bad_parameter", {"json": {"model": "lmi-demo", "messages": [{"role": "user", "content": "hi"}], "temperature": -3}}),
    ("oversized_body", {"content": b'{"x": "' + b"a" * 500_000 + b'"}', "headers": {"content-type": "application/json"}}),
]


def role_of(proc: psutil.Process, root_pid: int) -> str:
    """api (the server process), cache_server (LMCache), engine_core (vLLM's scheduler process) or
    engine_worker (the process that holds the weights and the KV cache)."""
    if proc.pid == root_pid:
        return "api"
    cmd = " ".join(proc.cmdline())
    if "lmcache" in cmd and "multiprocess" in cmd:
        return "cache_server"
    return "engine_core" if "EngineCore" in proc.name() else "engine_worker"


def tree_memory(pid: int) -> dict[str, float]:
    """MB of the server's process tree: RSS summed, and PSS by role. PSS counts a shared page once
    (split among the processes mapping it): the engine and the cache server share the CPU tier's
    /dev/shm segment, which summed RSS counts twice as soon as both have touched it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: dict[str, float] = defaultdict(float)
    for p in procs:
        try:
            info = p.memory_full_info()
            role = role_of(p, pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out["rss_mb"] += info.rss / 1e6
        out["pss_mb"] += info.pss / 1e6
        out[f"pss_{role}_mb"] += info.pss / 1e6
    return {k: round(v, 1) for k, v in out.items()}


def scrape(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


class Recorder:
    def __init__(self, start: float):
        self.start = start
        self.windows: dict[int, dict] = defaultdict(lambda: {"ok": 0, "failed": defaultdict(int), "ttft": [], "itl": [], "bad": defaultdict(int), "bad_5xx": 0})

    def window(self) -> dict:
        return self.windows[int((time.monotonic() - self.start) // WINDOW_S)]


async def client_loop(i: int, url: str, deadline: float, rec: Recorder, max_tokens: int) -> None:
    async with httpx.AsyncClient(timeout=300) as client:
        rnd = 0
        while time.monotonic() < deadline:
            rnd += 1
            body = {
                "model": "lmi-demo",
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}-{rnd}: what does def do?"}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            res = await stream_completion(client, url + "/v1/chat/completions", body)
            w = rec.window()
            if res.ok:
                w["ok"] += 1
                w["ttft"].append(res.ttft_s)
                w["itl"].extend(res.itl_s)
            else:
                w["failed"][res.error.split(":")[0][:40]] += 1
            if rnd % 5 == 0:
                kind, kwargs = BAD_REQUESTS[(i + rnd) % len(BAD_REQUESTS)]
                try:
                    r = await client.post(url + "/v1/chat/completions", **kwargs)
                    code = r.status_code
                except httpx.HTTPError:
                    code = 599
                w = rec.window()
                w["bad"][f"{kind}:{code}"] += 1
                if code >= 500:
                    w["bad_5xx"] += 1


async def monitor(server: Server, deadline: float, rec: Recorder, kill_at: float, samples: list) -> None:
    killed = False
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not killed and now >= kill_at:
                for child in psutil.Process(server.proc.pid).children(recursive=True):
                    try:
                        if "lmcache" in " ".join(child.cmdline()) and "multiprocess" in " ".join(child.cmdline()):
                            child.send_signal(signal.SIGKILL)
                            killed = True
                    except psutil.NoSuchProcess:
                        pass
                samples.append({"t": round(now - rec.start, 1), "event": "cache server SIGKILLed" if killed else "no cache server found"})
            try:
                text = (await client.get(server.url + "/metrics")).text
                ping = (await client.get(server.url + "/ping")).status_code
            except httpx.HTTPError:
                text, ping = "", 0
            samples.append({
                "t": round(now - rec.start, 1),
                **tree_memory(server.proc.pid),
                "queue_depth": scrape(text, "lmi_queue_depth"),
                "in_engine": scrape(text, "lmi_requests_in_engine"),
                "cache_restarts": scrape(text, "lmi_lmcache_server_restarts_total") or scrape(text, "lmi_lmcache_server_restarts"),
                "ping": ping,
            })
            await asyncio.sleep(5)


def summarise(rec: Recorder, samples: list, warmup_s: float) -> dict:
    windows = []
    for idx in sorted(rec.windows):
        w = rec.windows[idx]
        windows.append({
            "t_start": idx * WINDOW_S, "completed": w["ok"], "failed": dict(w["failed"]), "bad": dict(w["bad"]), "bad_5xx": w["bad_5xx"],
            "ttft_p50_s": pct(w["ttft"], 50), "ttft_p99_s": pct(w["ttft"], 99), "itl_p50_s": pct(w["itl"], 50), "itl_p99_s": pct(w["itl"], 99),
        })
    all_ttft = [x for idx in rec.windows for x in rec.windows[idx]["ttft"] if idx * WINDOW_S >= warmup_s]
    all_itl = [x for idx in rec.windows for x in rec.windows[idx]["itl"] if idx * WINDOW_S >= warmup_s]
    mem = [s for s in samples if "pss_mb" in s and s["t"] >= warmup_s]
    rss = [s["rss_mb"] for s in mem]
    pss = [s["pss_mb"] for s in mem]
    failed = sum(sum(w["failed"].values()) for w in rec.windows.values())
    bad = sum(sum(w["bad"].values()) for w in rec.windows.values())
    return {
        "completed": sum(w["ok"] for w in rec.windows.values()),
        "failed": failed,
        "bad_requests": bad,
        "bad_requests_5xx": sum(w["bad_5xx"] for w in rec.windows.values()),
        "ttft_p50_s": pct(all_ttft, 50), "ttft_p99_s": pct(all_ttft, 99),
        "ttft_p99_over_p50": pct(all_ttft, 99) / pct(all_ttft, 50) if all_ttft else float("nan"),
        "itl_p50_s": pct(all_itl, 50), "itl_p99_s": pct(all_itl, 99),
        "rss_mb_after_warmup_first": rss[0] if rss else None, "rss_mb_last": rss[-1] if rss else None,
        "rss_growth_after_warmup": (rss[-1] - rss[0]) / rss[0] if len(rss) > 1 else None,
        "pss_mb_after_warmup_first": pss[0] if pss else None, "pss_mb_last": pss[-1] if pss else None,
        "pss_growth_after_warmup": (pss[-1] - pss[0]) / pss[0] if len(pss) > 1 else None,
        "pss_growth_by_role_mb": {
            k[4:-3]: round(mem[-1].get(k, 0) - mem[0].get(k, 0), 1) for k in mem[-1] if k.startswith("pss_") and k != "pss_mb"
        } if len(mem) > 1 else {},
        "cache_restarts": max((s.get("cache_restarts", 0) for s in samples), default=0),
        "windows": windows,
    }


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = doc["summary"]["windows"]
    t = [x["t_start"] for x in w]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(t, [x["ttft_p50_s"] for x in w], label="TTFT p50")
    axes[0].plot(t, [x["ttft_p99_s"] for x in w], label="TTFT p99")
    axes[0].set_ylabel("seconds")
    axes[0].legend()
    axes[1].bar(t, [x["completed"] for x in w], width=WINDOW_S * 0.8, label="completed")
    axes[1].bar(t, [sum(x["failed"].values()) for x in w], width=WINDOW_S * 0.8, color="red", label="failed")
    axes[1].set_ylabel(f"requests / {WINDOW_S} s")
    axes[1].legend()
    samples = [s for s in doc["samples"] if "pss_mb" in s]
    ax = axes[2]
    ax.plot([s["t"] for s in samples], [s["pss_mb"] for s in samples], label="memory of the process tree (PSS, MB)")
    for role in ("api", "engine_core", "engine_worker", "cache_server"):
        ax.plot([s["t"] for s in samples], [s.get(f"pss_{role}_mb", 0) for s in samples], linewidth=0.8, label=role)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_ylabel("MB")
    ax2 = ax.twinx()
    ax2.plot([s["t"] for s in samples], [s["queue_depth"] for s in samples], color="black", linestyle=":", label="queue depth (right axis)")
    ax2.set_ylabel("queue depth")
    for s in doc["samples"]:
        if "event" in s:
            for a in axes:
                a.axvline(s["t"], color="grey", linestyle="--")
    axes[2].set_xlabel("seconds since start")
    c = doc["config"]
    fig.suptitle(f"Soak: {c['clients']} streaming clients, {c['minutes']} min, cache server killed at {c['kill_at_s']:.0f} s")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE", help="extra serving.properties line")
    ap.add_argument("--name", default="soak")
    ap.add_argument("--cpu-tier-gb", type=float, default=2, help="LMCache CPU tier (GiB); 0: no LMCache (nothing to kill)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lmi-soak-"))
    props = {
        "option.model_id": "lmi-demo", "option.cpu_kv_cache_space": "1", "option.dtype": "fp32",
        "option.max_model_len": "4096", "option.max_request_bytes": "200000",
        "option.lmcache_config_file": "lmcache.yaml",
    }
    # The ready cpu.yaml asks for 20 GiB of RAM: too much beside 64 clients on a 24 GiB machine.
    (work / "lmcache.yaml").write_text(
        (REPO / "lmcache_configs" / "cpu.yaml").read_text().replace("max_local_cpu_size: 20", f"max_local_cpu_size: {args.cpu_tier_gb}")
    )
    if args.cpu_tier_gb == 0:  # no LMCache at all: what the engine alone does over time
        del props["option.lmcache_config_file"]
    props.update(dict(p.split("=", 1) for p in args.prop))
    (work / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    port = free_port()
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work), "--host", "127.0.0.1", "--port", str(port)]
    duration = args.minutes * 60
    with Server("lmi-server", argv, port, "/ping", work / "server.log", env={"PYTHONHASHSEED": "0"}) as server:
        start = time.monotonic()
        rec = Recorder(start)
        samples: list = []
        deadline = start + duration
        load = os.getloadavg()

        async def run() -> None:
            clients = [client_loop(i, server.url, deadline, rec, args.max_tokens) for i in range(args.clients)]
            await asyncio.gather(monitor(server, deadline, rec, start + duration / 2, samples), *clients)

        asyncio.run(run())
        ping_end = httpx.get(server.url + "/ping", timeout=10).status_code
    doc = {
        "benchmark": "soak",
        "machine": machine(),
        "load_average_at_start": load,
        "load_average_at_end": os.getloadavg(),
        "config": {"clients": args.clients, "minutes": args.minutes, "max_tokens": args.max_tokens, "kill_at_s": duration / 2, "props": props, "warmup_s": args.warmup_s},
        "ping_at_end": ping_end,
        "summary": summarise(rec, samples, args.warmup_s),
        "samples": samples,
    }
    path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    s = doc["summary"]
    print(
        f"completed {s['completed']}, failed {s['failed']}, bad {s['bad_requests']} ({s['bad_requests_5xx']} answered 5xx), "
        f"TTFT p50 {s['ttft_p50_s']:.2f} s p99 {s['ttft_p99_s']:.2f} s, PSS growth {s['pss_growth_after_warmup']} "
        f"{s['pss_growth_by_role_mb']}, "
        f"cache restarts {s['cache_restarts']}, /ping at end {ping_end}; wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
