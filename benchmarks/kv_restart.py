"""KV that survives a restart: TTFT of a ~4,000-token document cold, warm, and after a restart.

The embedded assistant (`lmi-server serve` with no model option), greedy, vLLM's own prefix
cache off so that every hit goes through LMCache. For each persistent tier:

  disk   option.lmcache_auto_config=true + option.lmcache_cache_dir=DIR (the auto plan's disk tier)
  redis  an LMCache file with a CPU tier and remote_url=redis://... (a local redis-server)

server 1 (empty tier): document A + question, cold (prefill) then warm (an LMCache CPU-tier hit,
three times, median); the same for document B; stop. Server 2 (a restart on the same directory or
Redis; a new container given the same volume is the same case): A first (the first request after
start: the engine's own first-request costs are in it), then B (a hit from the persistent tier on
a warmed engine), then B again (a CPU-tier hit again). Every answer is checked to be the same text.

    python benchmarks/kv_restart.py             # both tiers (4 engine starts, ~10 min on 2 cores)
    python benchmarks/kv_restart.py --tiers disk
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from benchmarks.common import RESULTS, Server, free_port, machine, save, stream_completion  # noqa: E402
from deploy.cluster import redis_server_binary, resp_command  # noqa: E402

QUESTION = "\n\nIn one sentence: what does the code above do?"
DOCS = {"A": "argparse.py", "B": "typing.py"}


def document(name: str, chars: int) -> str:
    return Path(sysconfig.get_paths()["stdlib"], name).read_text()[:chars]


async def ask(url: str, doc: str, max_tokens: int) -> dict:
    body = {"model": "assistant", "messages": [{"role": "user", "content": doc + QUESTION}],
            "max_tokens": max_tokens, "temperature": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        models = (await client.get(url + "/v1/models")).json()["data"]
        body["model"] = models[0]["id"]
        r = await stream_completion(client, url + "/v1/chat/completions", body)
    if not r.ok:
        raise RuntimeError(r.error)
    return {"ttft_s": round(r.ttft_s, 4), "cached_tokens": r.cached_tokens, "prompt_tokens": r.prompt_tokens,
            "text": r.text}


def serve(work: Path, name: str, props: dict[str, str]) -> Server:
    model_dir = work / name
    model_dir.mkdir(exist_ok=True)
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    port = free_port()
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port)]
    return Server(name, argv, port, "/ping", work / f"{name}.log", env={"PYTHONHASHSEED": "0"})


def tier_props(tier: str, work: Path, redis_port: int | None) -> dict[str, str]:
    # small footprints: one 4,000-token request at a time needs little KV room, and the host is shared
    base = {"option.enable_prefix_caching": "false", "option.cpu_kv_cache_space": "1"}
    if tier == "disk":
        # the CPU tier sized like the redis run's (the auto plan would take most of the free RAM)
        return {**base, "option.lmcache_auto_config": "true", "option.lmcache_cache_dir": str(work / "kv-volume"),
                "option.lmcache_cpu_size_gb": "1"}
    cfg = work / "lmcache-redis.yaml"
    # the chunk size the auto plan takes on a CPU host (lmi_server/kvcache/planner.py, CPU_CHUNK_TOKENS)
    cfg.write_text(f"chunk_size: 128\nmax_local_cpu_size: 1\nremote_url: \"redis://127.0.0.1:{redis_port}\"\n")
    return {**base, "option.lmcache_config_file": str(cfg)}


def run_tier(tier: str, work: Path, docs: dict[str, str], max_tokens: int, redis_port: int | None) -> dict:
    props = tier_props(tier, work, redis_port)
    first: dict[str, dict] = {}
    with serve(work, f"{tier}-1", props) as s1:
        for key, doc in docs.items():
            cold = asyncio.run(ask(s1.url, doc, max_tokens))
            warm = [asyncio.run(ask(s1.url, doc, max_tokens)) for _ in range(3)]
            first[key] = {"cold": cold, "warm": warm}
        start1 = s1.start_s
        time.sleep(5)  # the last stores reach the persistent tier
    with serve(work, f"{tier}-2", props) as s2:
        after = {key: asyncio.run(ask(s2.url, doc, max_tokens)) for key, doc in docs.items()}
        again_b = asyncio.run(ask(s2.url, docs["B"], max_tokens))
        start2 = s2.start_s
    texts = {first[k]["cold"]["text"] for k in docs} | set()
    same = all(
        {first[k]["cold"]["text"], after[k]["text"], *(w["text"] for w in first[k]["warm"])} == {first[k]["cold"]["text"]}
        for k in docs
    ) and again_b["text"] == first["B"]["cold"]["text"]
    cold = statistics.median(first[k]["cold"]["ttft_s"] for k in docs)
    warm = statistics.median(w["ttft_s"] for k in docs for w in first[k]["warm"])
    restart_hit = after["B"]["ttft_s"]
    return {
        "tier": tier, "props": props, "start_s": [round(start1, 1), round(start2, 1)],
        "prompt_tokens": {k: first[k]["cold"]["prompt_tokens"] for k in docs},
        "server1": first, "server2": {"A_first_request": after["A"], "B": after["B"], "B_again": again_b},
        "same_answers": same, "answers": sorted(texts),
        "summary": {
            "cold_prefill_ttft_s": cold, "warm_hit_ttft_s": warm,
            "restart_first_request_ttft_s": after["A"]["ttft_s"], "restart_hit_ttft_s": restart_hit,
            "restart_hit_vs_warm": round(restart_hit / warm, 2), "cold_vs_restart_hit": round(cold / restart_hit, 1),
            "restart_cached_tokens": after["B"]["cached_tokens"],
        },
    }


def start_redis(work: Path) -> tuple[subprocess.Popen, int]:
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server is not installed (Debian: apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if resp_command(port, "PING").startswith(b"+PONG"):
                return proc, port
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("redis-server did not start")


def plot(doc: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    labels = ["cold prefill", "warm hit\n(CPU tier)", "after restart,\n1st request", "after restart,\nhit"]
    keys = ["cold_prefill_ttft_s", "warm_hit_ttft_s", "restart_first_request_ttft_s", "restart_hit_ttft_s"]
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        values = [run["summary"][k] for k in keys]
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(keys))]
        bars = ax.bar(xs, values, width, label=f"{run['tier']} tier")
        for b, v in zip(bars, values):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylabel("TTFT (s)")
    tokens = runs[0]["summary"]["restart_cached_tokens"]
    ax.set_title(f"Assistant, {tokens:,} cached document tokens, {doc['machine']['cpus']} CPUs: KV across a restart",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / "kv_restart.png"
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiers", nargs="+", default=["disk", "redis"], choices=["disk", "redis"])
    ap.add_argument("--chars", type=int, default=14500, help="document length in characters (~4,000 tokens)")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    docs = {k: document(v, args.chars) for k, v in DOCS.items()}
    work = Path(tempfile.mkdtemp(prefix="kv-restart-"))
    redis = None
    try:
        runs = []
        for tier in args.tiers:
            port = None
            if tier == "redis":
                redis, port = start_redis(work)
            runs.append(run_tier(tier, work, docs, args.max_tokens, port))
            print(json.dumps(runs[-1]["summary"]), flush=True)
            doc = {"benchmark": "kv_restart", "machine": machine(), "chars": args.chars, "runs": runs}
            print(save("kv_restart", doc), plot(doc), flush=True)  # after each tier: a later failure keeps it
    finally:
        if redis is not None:
            redis.terminate()
        shutil.rmtree(work / "kv-volume", ignore_errors=True)  # the servers' logs stay in `work`
        print(f"logs: {work}")


if __name__ == "__main__":
    main()
