#!/usr/bin/env python
"""The overhead floor of speculative decoding on the shipped assistant: the best speed-up vLLM's
CPU speculation path can give at all, measured with n-gram drafts that are always right.

    python benchmarks/spec_ceiling.py                    # writes benchmarks/results/spec_ceiling.{json,png}
    python benchmarks/spec_ceiling.py --configs plain ngram-k3 --requests 1 --max-tokens 64 --name smoke

Each configuration starts `lmi-server serve` with no model option (the default assistant, as
`make serve`: float32, eager, no LMCache) and adds only the OPTION_* variables of its speculation.
The configurations run back to back in one invocation, plain first and plain again last (drift).
Each server start takes the shared engine lock (`--lock`, flock(2) on the same file as
`flock /tmp/engine.lock ...`), so that no other engine shares the two cores while it measures.

Per configuration, at one client, greedy, `ignore_eos`, a fixed `max_tokens`:
  - repeat: /v1/completions on a prompt that is one sentence written many times over, so that the
    greedy continuation is the sentence again and prompt lookup (n-gram) drafts are accepted
    (acceptance ~100%); recorded: decode tokens/s ((tokens - 1) / (t_last - t_first) per request),
    output tokens/s over the level, per-token latency, and vLLM's spec-decode counters from /metrics
    (diffed): acceptance rate, mean acceptance length L (tokens per engine step), accepted per
    draft position. Time per engine step = L / decode tokens/s; its ratio to a plain step is
    what a verify step of k+1 tokens (plus drafting and rejection sampling) costs.
  - prefill proxy (plain servers): a 256-token prompt is cached (prefix caching, block 128), then
    the same prompt plus m new tokens is sent with max_tokens=1: the time to first token is one
    engine step over m tokens (plus the HTTP round trip, the same for every m), m = 1, 2, 4, 6, 9
    (k + 1 for k = 1, 3, 5, 8).
  - profile (--profile): py-spy samples the engine core process during one more repeat request;
    the functions with the most samples (own and inclusive) go into the JSON.
  - batch (on the last plain server): the assistant's own answers to chat questions, 32 in flight,
    natural length (max 384 tokens), temperature 0.7: tokens/s and answers/s, to size a corpus the assistant writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    RESULTS, Server, free_port, machine, run_concurrent, save, stream_completion,
)
from benchmarks.default_model import QUESTIONS  # noqa: E402


def spec_env(method: str, k: int) -> dict[str, str]:
    return {"OPTION_SPECULATIVE_METHOD": method, "OPTION_NUM_SPECULATIVE_TOKENS": str(k)}


CONFIGS = {  # the only environment each configuration adds to `make serve`'s
    "plain": {},
    **{f"ngram-k{k}": spec_env("ngram", k) for k in (1, 3, 5, 8)},
    **{f"eagle-k{k}": spec_env("eagle", k) for k in (1, 3)},
}
DEFAULT_ORDER = ["plain", "ngram-k1", "ngram-k3", "ngram-k5", "ngram-k8", "eagle-k3", "plain"]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the old river bank.",
    "Every morning the baker opens his small shop and sells fresh bread to the town.",
    "A red kite flies high above the green hills while the children run below.",
]
PROXY_M = (1, 2, 4, 6, 9)
COUNTER_PREFIX = "vllm:spec_decode_"


def repeat_prompt(sentence: str, times: int = 12) -> str:
    return " ".join([sentence] * times)


def metrics(url: str) -> dict[str, float]:
    """vLLM's spec-decode counters (summed over label sets), per-position ones keyed by position."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if not line.startswith(COUNTER_PREFIX) or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0][len(COUNTER_PREFIX):].removesuffix("_total")
        if 'position="' in name:
            base += "@" + name.split('position="', 1)[1].split('"', 1)[0]
        out[base] = out.get(base, 0.0) + float(value)
    return out


def counter_summary(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts, draft_tokens, accepted = d.get("num_drafts", 0), d.get("num_draft_tokens", 0), d.get("num_accepted_tokens", 0)
    if not drafts:
        return {}
    per_pos = {k.split("@")[1]: v for k, v in d.items() if k.startswith("num_accepted_tokens_per_pos@")}
    return {
        "drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / draft_tokens, 4),
        "mean_acceptance_length": round(1 + accepted / drafts, 3),
        "accepted_per_position": {p: round(v / drafts, 3) for p, v in sorted(per_pos.items(), key=lambda x: int(x[0]))},
    }


async def sequential(url: str, bodies: list[dict]) -> list:
    async with httpx.AsyncClient(timeout=600) as client:
        out = []
        for b in bodies:
            r = await stream_completion(client, url, b)
            if not r.ok:
                raise RuntimeError(r.error)
            out.append(r)
        return out


def repeat_level(url: str, requests: int, max_tokens: int) -> dict:
    bodies = [{"prompt": repeat_prompt(SENTENCES[i % len(SENTENCES)]), "max_tokens": max_tokens,
               "temperature": 0, "ignore_eos": True} for i in range(requests)]
    before = metrics(url)
    t0 = time.perf_counter()
    res = asyncio.run(sequential(url + "/v1/completions", bodies))
    wall = time.perf_counter() - t0
    after = metrics(url)
    tokens = sum(r.output_tokens for r in res)
    decode_s = [r.latency_s - r.ttft_s for r in res]
    # first chunk to last: every token but the first (the prefill's) is decoded in that time
    decode_tps = [(r.output_tokens - 1) / sum(r.itl_s) for r in res if r.itl_s]
    out = {
        "requests": len(res), "output_tokens": tokens, "wall_s": round(wall, 2),
        "output_tokens_per_s": round(tokens / wall, 2),
        "decode_tokens_per_s": round(statistics.fmean(decode_tps), 2),
        "per_token_ms": round(1000 / statistics.fmean(decode_tps), 2),
        "mean_ttft_ms": round(1000 * statistics.fmean(r.ttft_s for r in res), 1),
        "chunks_per_request": round(statistics.fmean(r.chunks for r in res), 1),
        "mean_decode_s": round(statistics.fmean(decode_s), 3),
        **counter_summary(before, after),
    }
    return out


def prefill_proxy(url: str, tok_ids: list[int], repeats: int) -> dict:
    """TTFT of a cached 256-token prefix plus m new tokens, max_tokens=1 (non-streamed)."""
    prefix = tok_ids[:256]
    tail_pool = tok_ids[256:]
    with httpx.Client(timeout=120) as client:
        def ask(ids):
            t0 = time.perf_counter()
            r = client.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 1, "temperature": 0})
            r.raise_for_status()
            usage = r.json()["usage"]
            return time.perf_counter() - t0, (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

        ask(prefix + tail_pool[:1])  # caches the two full blocks of the prefix
        out = {}
        for m in PROXY_M:
            times, cached = [], []
            for i in range(repeats):
                # a different tail each time so that nothing past the prefix is cached
                tail = tail_pool[(i * 11 + m) % 40:][:m]
                dt, c = ask(prefix + tail)
                times.append(dt)
                cached.append(c)
            out[str(m)] = {"median_ms": round(1000 * statistics.median(times), 2),
                           "min_ms": round(1000 * min(times), 2), "cached_tokens": statistics.median(cached)}
    return out


def engine_processes(server: Server) -> dict[str, int]:
    """The engine's processes under the server: the engine core (scheduler, output processing)
    and the worker (model runner: forward, rejection sampler, drafting)."""
    out = {}
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(server.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                title = p.name() + " " + " ".join(p.cmdline()[:1])
                for key, marker in (("engine_core", "EngineCor"), ("worker", "Worker")):
                    if marker in title and key not in out:
                        out[key] = p.pid
        if "engine_core" in out and "worker" not in out:  # the worker is the engine core's busiest child
            kids = [k for k in psutil.Process(out["engine_core"]).children() if "resource_tracker" not in " ".join(k.cmdline())]
            if kids:
                out["worker"] = max(kids, key=lambda k: sum(k.cpu_times()[:2])).pid
    return out


WAIT_MARKERS = ("acquire_read", "SpinCondition.wait", "process_input_sockets", "_recv", "poll (", "select (")


def profile(server: Server, max_tokens: int, out_dir: Path, name: str) -> dict | None:
    """py-spy on the engine core and the worker during one more repeat request; per process the
    share of samples spent waiting for the other side (shm_broadcast spin, zmq), and the functions
    with the most samples among the busy ones (own and inclusive)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    pids = engine_processes(server)
    if not pids or not Path(spy).exists():
        return None
    body = {"prompt": repeat_prompt(SENTENCES[0]), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    procs = {}
    for role, pid in pids.items():
        raw = out_dir / f"{name}-{role}.folded"
        procs[role] = (raw, subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(raw),
                                              "--rate", "100", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    time.sleep(1.0)
    asyncio.run(sequential(server.url + "/v1/completions", [body]))
    for _, proc in procs.values():
        proc.send_signal(2)
    out = {}
    for role, (raw, proc) in procs.items():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        out[role] = fold(raw) if raw.exists() else {"error": (proc.stderr.read() or b"").decode()[-300:]}
        out[role]["pid"] = pids[role]
    return out


def fold(raw: Path) -> dict:
    own, incl, total, waiting = Counter(), Counter(), 0, 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n = int(n)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        if any(m in f for f in frames for m in WAIT_MARKERS):
            waiting += n
            continue
        own[short(frames[-1])] += n
        for f in {short(f) for f in frames}:
            incl[f] += n
    busy = total - waiting
    return {
        "samples": total, "waiting_share": round(waiting / total, 3) if total else None,
        "busy_samples": busy,
        "top_own_of_busy": [[f, round(v / busy, 4)] for f, v in own.most_common(20)] if busy else [],
        "top_inclusive_of_busy": [[f, round(v / busy, 4)] for f, v in incl.most_common(50)] if busy else [],
    }


def short(frame: str) -> str:
    """`func (path/to/site-packages/vllm/x.py:12)` -> `func (vllm/x.py)`."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{func} ({where})"


def batch_level(url: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    bodies = [{"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], "max_tokens": max_tokens,
               "temperature": 0.7, "seed": i} for i in range(requests)]
    results, wall = asyncio.run(run_concurrent(url + "/v1/chat/completions", bodies, concurrency))
    ok = [r for r in results if r.ok]
    if len(ok) != len(results):
        raise RuntimeError(f"failed requests: {[r.error for r in results if not r.ok][:3]}")
    tokens = sum(r.output_tokens for r in ok)
    return {
        "concurrency": concurrency, "requests": len(ok), "max_tokens": max_tokens, "output_tokens": tokens,
        "wall_s": round(wall, 2), "output_tokens_per_s": round(tokens / wall, 2),
        "answers_per_s": round(len(ok) / wall, 3), "mean_answer_tokens": round(tokens / len(ok), 1),
        "answers_per_hour": round(3600 * len(ok) / wall),
    }


@contextlib.contextmanager
def engine_lock(path: str | None):
    if not path:
        yield 0.0
        return
    t0 = time.monotonic()
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=DEFAULT_ORDER, choices=sorted(CONFIGS))
    ap.add_argument("--requests", type=int, default=3, help="repeat requests per configuration (one client)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--proxy-repeats", type=int, default=5)
    ap.add_argument("--profile", nargs="*", default=["plain", "ngram-k5", "eagle-k3"],
                    help="configurations to sample with py-spy (first occurrence only)")
    ap.add_argument("--batch-concurrency", type=int, default=32)
    ap.add_argument("--batch-requests", type=int, default=64, help="0: no batch level")
    ap.add_argument("--lock", default="/tmp/engine.lock", help="flock this file around each server ('' for none)")
    ap.add_argument("--name", default="spec_ceiling")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lmi-ceiling-"))
    print(f"logs in {work}", flush=True)
    from transformers import AutoTokenizer

    from lmi_server.demo.assistant import default_dir as assistant_dir

    tok = AutoTokenizer.from_pretrained(str(assistant_dir()))
    proxy_ids = tok(" ".join(QUESTIONS * 4), add_special_tokens=False)["input_ids"]
    load_start = os.getloadavg()
    runs, profiled = [], set()
    last_plain = max(i for i, c in enumerate(args.configs) if c == "plain") if "plain" in args.configs else None
    for i, name in enumerate(args.configs):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
        env.update(CONFIGS[name])
        port = free_port()
        argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"),
                "--host", "127.0.0.1", "--port", str(port)]
        server = Server(f"lmi-{name}", argv, port, "/ping", work / f"{i}-{name}.log", env=env)
        server.env = {**env, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        with engine_lock(args.lock) as waited, server:
            run = {"config": name, "env": CONFIGS[name], "lock_wait_s": round(waited, 1),
                   "start_s": round(server.start_s, 1), "load_average": os.getloadavg()[0]}
            asyncio.run(sequential(server.url + "/v1/completions", [  # warm-up
                {"prompt": repeat_prompt(SENTENCES[-1]), "max_tokens": 16, "temperature": 0, "ignore_eos": True}]))
            run["repeat"] = repeat_level(server.url, args.requests, args.max_tokens)
            print(f"{name}: {run['repeat']}", flush=True)
            sample = httpx.post(server.url + "/v1/completions", timeout=120, json={
                "prompt": repeat_prompt(SENTENCES[0]), "max_tokens": 40, "temperature": 0}).json()
            run["continuation_sample"] = sample["choices"][0]["text"]
            if name == "plain":
                run["prefill_proxy"] = prefill_proxy(server.url, proxy_ids, args.proxy_repeats)
                print(f"{name} proxy: {run['prefill_proxy']}", flush=True)
            if name in (args.profile or []) and name not in profiled:
                run["profile"] = profile(server, args.max_tokens, work, f"{i}-{name}")
                profiled.add(name)
                for role, prof in (run["profile"] or {}).items():
                    print(f"{name} profile {role}: wait {prof.get('waiting_share')}, {prof.get('top_own_of_busy', [])[:8]}", flush=True)
            if i == last_plain and args.batch_requests:
                run["batch"] = batch_level(server.url, args.batch_concurrency, args.batch_requests, 384)
                print(f"{name} batch: {run['batch']}", flush=True)
        runs.append(run)
    doc = {"benchmark": "spec_ceiling", "machine": machine(), "load_average_at_start": load_start,
           "load_average_at_end": os.getloadavg(), "max_tokens": args.max_tokens,
           "prompt": f"{repeat_prompt(SENTENCES[0])[:80]}... (one of {len(SENTENCES)} sentences x 12)",
           "runs": runs}
    summarise(doc)
    path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    print(f"wrote {path}", flush=True)
    for row in doc["table"]:
        print(row, flush=True)
    return 0


def summarise(doc: dict) -> None:
    """Speed-up over the mean of the plain runs, time per engine step and its ratio to a plain step."""
    plain = [r["repeat"]["decode_tokens_per_s"] for r in doc["runs"] if r["config"] == "plain"]
    base = statistics.fmean(plain) if plain else None
    proxy = next((r["prefill_proxy"] for r in doc["runs"] if r.get("prefill_proxy")), None)
    table = []
    for r in doc["runs"]:
        rep = r["repeat"]
        L = rep.get("mean_acceptance_length", 1.0)
        step_ms = 1000 * L / rep["decode_tokens_per_s"]
        k = int(r["config"].split("-k")[1]) if "-k" in r["config"] else 0
        row = {"config": r["config"], "k": k, "decode_tokens_per_s": rep["decode_tokens_per_s"],
               "speedup": round(rep["decode_tokens_per_s"] / base, 3) if base else None,
               "mean_acceptance_length": L, "acceptance_rate": rep.get("acceptance_rate"),
               "step_ms": round(step_ms, 2)}
        if base:
            row["step_vs_plain"] = round(step_ms / (1000 / base), 3)
        if proxy and k and str(k + 1) in proxy:
            row["proxy_prefill_ms_k_plus_1"] = proxy[str(k + 1)]["median_ms"]
        rep.update({kk: row[kk] for kk in ("speedup", "step_ms") if row.get(kk) is not None})
        table.append(row)
    doc["table"] = table
    spec = [t for t in table if t["k"] and t["config"].startswith("ngram")]
    if spec and base:
        best = max(spec, key=lambda t: t["speedup"])
        doc["ceiling"] = {"config": best["config"], "speedup": best["speedup"],
                          "mean_acceptance_length": best["mean_acceptance_length"],
                          "plain_decode_tokens_per_s": round(base, 2),
                          "plain_drift": [round(p, 2) for p in plain]}


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    t = doc["table"]
    labels = [f"{r['config']}\n#{i}" if [x["config"] for x in t].count(r["config"]) > 1 else r["config"] for i, r in enumerate(t)]
    xs = range(len(t))
    axes[0].bar(xs, [r["decode_tokens_per_s"] for r in t], color=["grey" if r["k"] == 0 else "C0" if r["config"].startswith("ngram") else "C1" for r in t])
    for x, r in zip(xs, t):
        axes[0].text(x, r["decode_tokens_per_s"], f"{r['speedup']:.2f}x\nL={r['mean_acceptance_length']:.2f}", ha="center", va="bottom", fontsize=7)
    axes[0].set_title("decode tokens/s at 1 client (repeating prompt)")
    axes[1].bar(xs, [r["step_ms"] for r in t], color="C2", label="engine step (L / tokens/s)")
    axes[1].plot([x for x, r in zip(xs, t) if "proxy_prefill_ms_k_plus_1" in r],
                 [r["proxy_prefill_ms_k_plus_1"] for r in t if "proxy_prefill_ms_k_plus_1" in r], "ko", label="prefill of k+1 tokens (TTFT proxy)")
    axes[1].set_title("time per engine step (ms)")
    axes[1].legend(fontsize=7)
    for ax in axes[:2]:
        ax.set_xticks(list(xs), labels, fontsize=7, rotation=30)
    proxy = next((r["prefill_proxy"] for r in doc["runs"] if r.get("prefill_proxy")), None)
    if proxy:
        ms = sorted(proxy, key=int)
        axes[2].plot([int(m) for m in ms], [proxy[m]["median_ms"] for m in ms], "o-")
        axes[2].set_xlabel("new tokens m after a cached 256-token prefix")
        axes[2].set_title("TTFT with max_tokens=1 (ms): one step over m tokens")
    la = doc["load_average_at_start"][0]
    fig.suptitle(f"Speculation ceiling on the default assistant (float32, eager), {doc['machine']['cpus']} CPUs, load {la:.1f} at start")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
