"""Long-document QA (issue 3): what does LMCache buy when the working set exceeds the engine's KV?

Modelled on LMI's / LMCache's long-document-QA benchmark: D documents of L tokens each, whose KV
together exceeds the engine's own KV cache (`option.cpu_kv_cache_space`), are sent twice through
the HTTP API (`/v1/completions`, streaming): a warm-up round (each document once, with one short
question) and a query round (each document again, with a different short question), C requests
in flight, N output tokens each. Only the query round is reported. Three configurations of
lmi-server, measured one after the other in one run on the same model and workload:

  1. vllm-prefix   vLLM with automatic prefix caching only (no LMCache): the engine's LRU cache
                   holds fewer documents than the round visits, so every query-round request is
                   a miss and is prefilled again;
  2. lmcache-cpu   + LMCache (multiprocess cache server) with a CPU RAM tier that holds the
                   working set;
  3. lmcache-disk  + LMCache with a CPU tier deliberately too small for the working set and a
                   disk tier (LMCache's fs L2 adapter, O_DIRECT) under a temporary directory, so
                   part of the hits are served from disk.

Hit path: after each query round the script sends, one at a time, documents that are no longer
in vLLM's own prefix cache but are in LMCache (a full hit but for the short question), and in
configuration 1 documents that are still in vLLM's prefix cache (a local hit: same remainder to
prefill, no transfer). The difference of the two TTFTs is the time LMCache's hit path takes to
bring the hit tokens' KV into the engine; KV bytes / that time is the hit path's bandwidth. It is
compared with a plain torch tensor copy of the same number of bytes on the same machine.

The model is a random-weight Llama (`lmi_server.demo.builder`) large enough that one L-token
prefill takes seconds on a CPU, built once and cached.

    python benchmarks/long_doc_qa.py                # full run (about 15 minutes on 2 cores)
    python benchmarks/long_doc_qa.py --quick        # a smoke run (small D and L)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from benchmarks.common import Server, free_port, machine, run_concurrent, save, stream_completion, summarise  # noqa: E402

CONFIGS = ("vllm-prefix", "lmcache-cpu", "lmcache-disk")
LABELS = {
    "vllm-prefix": "1: vLLM\nprefix caching",
    "lmcache-cpu": "2: + LMCache\nCPU tier",
    "lmcache-disk": "3: + LMCache small\nCPU + disk tiers",
}
QUESTIONS = {
    "warmup": "\n\nQuestion: Which function in the document above is called most often? Answer:",
    "query": "\n\nQuestion: Summarise what the first class in the document above is for. Answer:",
    "probe": "\n\nQuestion: Which modules does the document above import? Answer:",
    "probe-local": "\n\nQuestion: Which constants does the document above define? Answer:",
}


# ---------------------------------------------------------------------------------------------
# Model and documents
# ---------------------------------------------------------------------------------------------


def model_spec(args):
    from lmi_server.demo.builder import DemoModelSpec

    return DemoModelSpec(
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=16384,
        torch_dtype=args.dtype,
    )


def ensure_model(spec, cache: Path) -> Path:
    """Build (once) a random-weight Llama of this spec; cached by the spec's hash."""
    from lmi_server.demo.builder import build_demo_model

    tag = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:10]
    target = cache / f"long-doc-qa-model-{tag}"
    if (target / "model.safetensors").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix="ldqa-build-", dir=cache))
    build_demo_model(tmp, spec)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def kv_bytes_per_token(spec) -> int:
    head_dim = spec.hidden_size // spec.num_attention_heads
    dtype_bytes = 2 if spec.torch_dtype in ("bfloat16", "float16") else 4
    return 2 * spec.num_hidden_layers * spec.num_key_value_heads * head_dim * dtype_bytes


def make_documents(model_dir: Path, n_docs: int, doc_tokens: int) -> list[str]:
    """n_docs distinct documents of about doc_tokens tokens each: disjoint slices of the Python
    standard library's sources (tokenized with the model's tokenizer, cut, decoded)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    root = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    need = n_docs * doc_tokens + 1000
    for path in sorted(root.glob("**/*.py")):
        if "test" in path.parts or "idlelib" in path.parts:
            continue
        try:
            ids.extend(tok.encode(path.read_text(encoding="utf-8"), add_special_tokens=False))
        except (UnicodeDecodeError, OSError):
            continue
        if len(ids) >= need:
            break
    docs = []
    for i in range(n_docs):
        body = tok.decode(ids[i * doc_tokens : (i + 1) * doc_tokens - 16])
        docs.append(f"# Document {i}\n{body}")
    return docs


# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------


def write_server_dir(work: Path, name: str, model: Path, args, disk_dir: Path) -> tuple[Path, int]:
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    metrics_port = free_port()
    props = {
        "option.model_id": str(model),
        "option.served_model_name": "ldqa",
        # Engine KV capacity in bytes (vLLM's kv_cache_memory_bytes): option.cpu_kv_cache_space is
        # whole GiB, which would force a working set (and prefill work) several times larger.
        "option.kv_cache_memory_bytes": str(args.engine_kv_mib * 2**20),
        "option.enforce_eager": "true",
        "option.dtype": "bf16" if args.dtype == "bfloat16" else "fp32",
        "option.max_model_len": str(args.doc_tokens + 512),
        "option.max_rolling_batch_size": str(max(args.concurrency, 4)),
        "option.enable_prefix_caching": "true",
        "option.max_request_bytes": str(4 * 1024 * 1024),
    }
    shm = f"mp_shm: {'true' if args.shm else 'false'}\n"  # explicit: the default depends on /dev/shm
    if name == "lmcache-cpu":
        (d / "lmcache.yaml").write_text(
            f"chunk_size: {args.chunk_size}\nlocal_cpu: true\nmax_local_cpu_size: {args.cpu_tier_gib}\ncache_policy: LRU\n{shm}"
        )
    elif name == "lmcache-disk":
        (d / "lmcache.yaml").write_text(
            f"chunk_size: {args.chunk_size}\nlocal_cpu: true\nmax_local_cpu_size: {args.small_cpu_tier_gib}\n"
            f"local_disk: \"file://{disk_dir}/\"\nmax_local_disk_size: {args.disk_tier_gib}\ncache_policy: LRU\n"
            f"extra_config:\n  use_odirect: true\n{shm}"
        )
    if name != "vllm-prefix":
        props["option.lmcache_config_file"] = str(d / "lmcache.yaml")
        props["option.lmcache_metrics_port"] = str(metrics_port)
    (d / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return d, metrics_port


def scrape(url: str) -> dict[str, float]:
    """A few counters from the server's /metrics (vLLM's and the re-exported LMCache ones)."""
    from prometheus_client.parser import text_string_to_metric_families

    want = (
        "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
        "vllm:external_prefix_cache_hits", "vllm:prompt_tokens", "lmi_lmcache_lookup_hit_tokens",
        "lmi_lmcache_lookup_hit_l1_tokens", "lmi_lmcache_lookup_hit_l2_tokens", "lmi_lmcache_stored_bytes",
    )
    out: dict[str, float] = {}
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            base = s.name.removesuffix("_total")
            if base in want:
                key = base + ("{tier=%s}" % s.labels["tier"] if "tier" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


RETRIEVED = re.compile(r"Retrieved (\d+) tokens in ([0-9.]+) seconds")


def log_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def retrieves(lines: list[str]) -> dict:
    """LMCache's own timing of each retrieve (engine_driven_transfer.py: from the end of the
    server's PREPARE_RETRIEVE to the worker's COMMIT_RETRIEVE, i.e. the hand-over to the worker,
    the worker's copy into its paged KV cache and the commit round trip)."""
    rows = [(int(m.group(1)), float(m.group(2))) for line in lines if (m := RETRIEVED.search(line))]
    tokens = sum(r[0] for r in rows)
    seconds = sum(r[1] for r in rows)
    return {"count": len(rows), "tokens": tokens, "seconds": seconds, "each": rows}


def body(doc: str, question: str, max_tokens: int) -> dict:
    return {"model": "ldqa", "prompt": doc + question, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


async def sequential(url: str, bodies: list[dict]) -> list:
    async with httpx.AsyncClient(timeout=900) as client:
        return [await stream_completion(client, url, b) for b in bodies]


def run_config(name: str, model: Path, docs: list[str], args, work: Path) -> dict:
    disk_dir = Path(tempfile.mkdtemp(prefix="ldqa-disk-", dir=args.disk_parent))
    d, _ = write_server_dir(work, name, model, args, disk_dir)
    port = free_port()
    env = {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", **getattr(args, "server_env", {})}
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(d), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = Server(name, argv, port, "/ping", d / "server.log", env)
    url = server.url + "/v1/completions"
    out: dict = {"config": name, "label": LABELS[name]}
    try:
        with server:
            out["server_start_s"] = server.start_s
            asyncio.run(sequential(url, [body("hello", "", 2)]))  # first-request overheads
            print(f"[{name}] up in {server.start_s:.0f} s; warm-up round", flush=True)
            res, wall = asyncio.run(run_concurrent(url, [body(doc, QUESTIONS["warmup"], args.output_tokens) for doc in docs], args.concurrency, 1800))
            out["warmup"] = summarise(res, wall)
            if name == "lmcache-disk":
                time.sleep(args.disk_settle_s)  # let the asynchronous L2 writes land
            m0 = scrape(server.url)
            n_log = len(log_lines(server.log))
            print(f"[{name}] warm-up: ttft {out['warmup']['ttft_mean_s']:.2f} s, wall {wall:.0f} s; query round", flush=True)
            res, wall = asyncio.run(run_concurrent(url, [body(doc, QUESTIONS["query"], args.output_tokens) for doc in docs], args.concurrency, 1800))
            out["query"] = summarise(res, wall)
            out["query"]["cached_tokens"] = [r.cached_tokens for r in res]
            m1 = scrape(server.url)
            out["query_metrics_delta"] = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
            lines = log_lines(server.log)
            out["query_retrieves"] = retrieves(lines[n_log:])
            n_log = len(lines)
            q = out["query"]
            print(f"[{name}] query: ttft mean {q['ttft_mean_s']:.3f} p90 {q['ttft_p90_s']:.3f}  latency mean {q['latency_mean_s']:.2f} "
                  f"p90 {q['latency_p90_s']:.2f}  failed {q['failed']}  cached/doc {q['cached_tokens_mean']:.0f}", flush=True)
            # Hit-path probes, one request at a time (short output: only the TTFT matters). For an
            # LMCache configuration each probe is a pair on a document that has left vLLM's cache
            # but is in LMCache: first an LMCache hit, then at once the same document with another
            # question, now a vLLM-local hit (same remainder to prefill, no transfer). In
            # configuration 1 only local hits (the most recent documents).
            k = args.probes
            if name == "vllm-prefix":
                picks = list(range(len(docs) - 1, len(docs) - 1 - k, -1))
                kinds = ["probe-local"]
            else:
                picks = list(range(k))
                kinds = ["probe", "probe-local"]
            m0 = scrape(server.url)
            bodies = [body(docs[i], QUESTIONS[kind], 2) for i in picks for kind in kinds]
            probe = asyncio.run(sequential(url, bodies))
            m1 = scrape(server.url)
            out["probe"] = {
                "docs": picks,
                "kinds": kinds,
                "ttft_s": [r.ttft_s for r in probe],
                "cached_tokens": [r.cached_tokens for r in probe],
                "ok": all(r.ok for r in probe),
                "metrics_delta": {k2: m1.get(k2, 0.0) - m0.get(k2, 0.0) for k2 in m1},
                "retrieves": retrieves(log_lines(server.log)[n_log:]),
            }
            print(f"[{name}] probes ({'/'.join(kinds)}): ttft {[round(t, 3) for t in out['probe']['ttft_s']]} "
                  f"cached {out['probe']['cached_tokens']}", flush=True)
            if name == "lmcache-disk":
                out["disk_bytes"] = sum(f.stat().st_size for f in disk_dir.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# Copy bandwidth and hit-path bandwidth
# ---------------------------------------------------------------------------------------------


def copy_bandwidth(n_bytes: int, repeats: int = 7) -> dict:
    """A plain torch tensor copy of n_bytes into a preallocated tensor, with one torch thread
    (what vLLM's CPU worker runs with on this machine) and with the default thread count; the
    faster of the two medians is the reference (on a loaded 2-core machine two OpenMP threads are
    often slower than one)."""
    import torch

    src = torch.randn(n_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    default_threads = torch.get_num_threads()
    out: dict = {"bytes": n_bytes}
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        out[f"threads_{threads}"] = {"median_s": statistics.median(times), "best_s": min(times),
                                     "gb_per_s_median": n_bytes / statistics.median(times) / 1e9}
    torch.set_num_threads(default_threads)
    best = max((v for k, v in out.items() if k.startswith("threads_")), key=lambda v: v["gb_per_s_median"])
    out.update(median_s=best["median_s"], gb_per_s_median=best["gb_per_s_median"])
    return out


def hit_path(rows: dict[str, dict], bytes_per_token: int) -> dict:
    """Hit-path time = TTFT of an LMCache hit - TTFT of the vLLM-local hit of the same document
    right after it (same remainder to prefill, no transfer); median over the probe pairs."""
    out: dict = {"kv_bytes_per_token": bytes_per_token}
    local = rows.get("vllm-prefix", {}).get("probe")
    if local and local["ok"]:
        out["vllm_prefix_local_hit_ttft_s"] = statistics.median(local["ttft_s"])
    for name in ("lmcache-cpu", "lmcache-disk"):
        p = rows.get(name, {}).get("probe")
        if not p or not p["ok"] or len(p["kinds"]) != 2:
            continue
        hit, loc = p["ttft_s"][0::2], p["ttft_s"][1::2]
        tokens = statistics.median(p["cached_tokens"][0::2])
        diffs = [h - lo for h, lo in zip(hit, loc)]
        seconds = statistics.median(diffs)
        resolvable = seconds >= 0.02  # below that the difference is lost in the TTFT noise
        out[name] = {
            "hit_ttft_s": hit,
            "local_hit_ttft_s": loc,
            "hit_tokens": tokens,
            "hit_bytes": tokens * bytes_per_token,
            "hit_path_s_pairs": diffs,
            "hit_path_s": seconds,
            "gb_per_s": tokens * bytes_per_token / seconds / 1e9 if resolvable else None,
            "note": None if resolvable else "hit and local-hit TTFTs equal within noise (< 20 ms apart)",
        }
        # LMCache's own retrieve timings (probes: one request at a time; query round: C in flight).
        for phase, rec in (("probe", p.get("retrieves")), ("query", rows[name].get("query_retrieves"))):
            if rec and rec["count"] and rec["seconds"] > 0:
                per = sorted(t * bytes_per_token / s / 1e9 for t, s in rec["each"] if s > 0)
                out[name][f"lmcache_retrieve_{phase}"] = {
                    "count": rec["count"],
                    "bytes": rec["tokens"] * bytes_per_token,
                    "seconds": rec["seconds"],
                    "gb_per_s": rec["tokens"] * bytes_per_token / rec["seconds"] / 1e9,
                    "gb_per_s_median": per[len(per) // 2] if per else None,
                }
    return out


# ---------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=16, help="D documents")
    ap.add_argument("--doc-tokens", type=int, default=6000, help="L tokens per document")
    ap.add_argument("--concurrency", type=int, default=4, help="C requests in flight")
    ap.add_argument("--output-tokens", type=int, default=32, help="N output tokens per request")
    ap.add_argument("--engine-kv-mib", type=int, default=512, help="engine KV cache (option.kv_cache_memory_bytes), MiB")
    ap.add_argument("--cpu-tier-gib", type=float, default=4.0, help="config 2: LMCache CPU tier")
    ap.add_argument("--small-cpu-tier-gib", type=float, default=0.5, help="config 3: LMCache CPU tier (too small)")
    ap.add_argument("--disk-tier-gib", type=float, default=8.0, help="config 3: LMCache disk tier")
    ap.add_argument("--disk-parent", default=None, help="where the disk tier's temporary directory goes (default: TMPDIR)")
    ap.add_argument("--disk-settle-s", type=float, default=5.0)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--shm", action=argparse.BooleanOptionalAction, default=True,
                    help="mp_shm: true in the LMCache files (CPU tier in /dev/shm); --no-shm: mp_shm: false (pickled hits)")
    ap.add_argument("--probes", type=int, default=5, help="hit-path probe requests per configuration")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--intermediate-size", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    ap.add_argument("--model-cache", default=os.environ.get("LMI_SERVER_CACHE") or os.path.expanduser("~/.cache/lmi_server"))
    ap.add_argument("--quick", action="store_true", help="smoke run: D=4, L=1500, small KV")
    ap.add_argument("--out", default="long_doc_qa", help="results name under benchmarks/results/")
    return ap


def main() -> int:
    if sys.argv[1:2] == ["--plot-only"]:  # redraw the PNG from the saved JSON
        from benchmarks.common import RESULTS

        path = RESULTS / "long_doc_qa.json"
        doc = json.loads(path.read_text())
        plot(doc, path.with_suffix(".png"))
        return 0
    args = parser().parse_args()
    if args.quick:
        args.docs, args.doc_tokens, args.output_tokens, args.probes = 4, 1500, 8, 2

    configs = [c for c in args.configs.split(",") if c]
    cache = Path(args.model_cache)
    cache.mkdir(parents=True, exist_ok=True)
    spec = model_spec(args)
    t0 = time.monotonic()
    model = ensure_model(spec, cache)
    docs = make_documents(model, args.docs, args.doc_tokens)
    bpt = kv_bytes_per_token(spec)
    working_set = args.docs * args.doc_tokens * bpt
    print(f"model {model} ({spec.num_hidden_layers} layers, hidden {spec.hidden_size}, {spec.torch_dtype}); "
          f"KV {bpt} B/token; working set {working_set / 2**30:.2f} GiB vs engine KV {args.engine_kv_mib} MiB; "
          f"load {os.getloadavg()}", flush=True)
    load_start = os.getloadavg()
    copy = copy_bandwidth(args.doc_tokens * bpt)
    print(f"torch copy of {copy['bytes'] / 1e6:.0f} MB: {copy['gb_per_s_median']:.1f} GB/s (median)", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-ldqa-"))
    rows: dict[str, dict] = {}
    for name in configs:
        rows[name] = run_config(name, model, docs, args, work)
    hp = hit_path(rows, bpt)
    for name in ("lmcache-cpu", "lmcache-disk"):
        if name in hp:
            if hp[name]["gb_per_s"]:
                hp[name]["fraction_of_copy"] = hp[name]["gb_per_s"] / copy["gb_per_s_median"]
                print(f"hit path {name} (TTFT difference): {hp[name]['hit_bytes'] / 1e6:.0f} MB in {hp[name]['hit_path_s'] * 1000:.0f} ms = "
                      f"{hp[name]['gb_per_s']:.2f} GB/s ({hp[name]['fraction_of_copy'] * 100:.0f} % of copy)", flush=True)
            else:
                print(f"hit path {name} (TTFT difference): {hp[name]['hit_path_s'] * 1000:.0f} ms, {hp[name]['note']}", flush=True)
            for phase in ("probe", "query"):
                rec = hp[name].get(f"lmcache_retrieve_{phase}")
                if rec:
                    rec["fraction_of_copy"] = rec["gb_per_s"] / copy["gb_per_s_median"]
                    print(f"hit path {name} (LMCache retrieve timings, {phase}): {rec['count']} retrieves, "
                          f"{rec['bytes'] / 1e6:.0f} MB in {rec['seconds'] * 1000:.0f} ms = {rec['gb_per_s']:.2f} GB/s "
                          f"({rec['fraction_of_copy'] * 100:.0f} % of copy)", flush=True)
    ratios = {}
    base = rows.get("vllm-prefix", {}).get("query")
    for name in ("lmcache-cpu", "lmcache-disk"):
        q = rows.get(name, {}).get("query")
        if base and q:
            ratios[name] = {
                "ttft_mean_ratio": base["ttft_mean_s"] / q["ttft_mean_s"],
                "ttft_p90_ratio": base["ttft_p90_s"] / q["ttft_p90_s"],
                "latency_mean_ratio": base["latency_mean_s"] / q["latency_mean_s"],
                "latency_p90_ratio": base["latency_p90_s"] / q["latency_p90_s"],
            }
    doc = {
        "benchmark": "long_doc_qa",
        "machine": machine(),
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "wall_s": time.monotonic() - t0,
        "workload": {
            "docs": args.docs, "doc_tokens": args.doc_tokens, "concurrency": args.concurrency,
            "output_tokens": args.output_tokens, "engine_kv_mib": args.engine_kv_mib,
            "working_set_gib": working_set / 2**30, "lmcache_cpu_tier_gib": args.cpu_tier_gib,
            "lmcache_small_cpu_tier_gib": args.small_cpu_tier_gib, "lmcache_disk_tier_gib": args.disk_tier_gib,
            "chunk_size": args.chunk_size, "prefix_caching": True, "lmcache_mp_shm": args.shm,
        },
        "model": {**asdict(spec), "kv_bytes_per_token": bpt, "path": str(model)},
        "configs": rows,
        "ratios_vs_vllm_prefix": ratios,
        "hit_path": hp,
        "copy": copy,
    }
    try:
        from benchmarks.common import RESULTS

        kv = json.loads((RESULTS / "kv_hit_path.json").read_text())
        doc["hit_path_pickle_gb_per_s"] = kv["modes"]["pickle"]["hit_path"]["lmcache_retrieve_probe"]["gb_per_s"]
    except (OSError, KeyError, ValueError):
        pass
    path = save(args.out, doc)
    plot(doc, path.with_suffix(".png"))
    print(json.dumps({"ratios": ratios}, indent=1))
    print("wrote", path)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [doc["configs"][c] for c in CONFIGS if c in doc["configs"] and "query" in doc["configs"][c]]
    labels = [LABELS.get(r["config"], r["label"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, key, title in ((axes[0], "ttft", "query round TTFT (s)"), (axes[1], "latency", "query round request latency (s)")):
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["query"][f"{key}_mean_s"] for r in rows], 0.4, label="mean")
        ax.bar([i + 0.2 for i in x], [r["query"][f"{key}_p90_s"] for r in rows], 0.4, label="p90")
        for i, r in enumerate(rows):
            ax.text(i - 0.2, r["query"][f"{key}_mean_s"], f"{r['query'][f'{key}_mean_s']:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3, axis="y")
    hp, copy = doc["hit_path"], doc["copy"]
    names = [n for n in ("lmcache-cpu", "lmcache-disk") if n in hp and "lmcache_retrieve_probe" in hp[n]]
    vals = [hp[n]["lmcache_retrieve_probe"]["gb_per_s"] for n in names]
    ticks = [f"hit path\n{n}\n(mp_shm)" for n in names]
    colors = ["tab:green"] * len(names)
    pickle = doc.get("hit_path_pickle_gb_per_s")
    if pickle:  # LMCache's default transfer, from benchmarks/results/kv_hit_path.json
        vals.insert(0, pickle)
        ticks.insert(0, "hit path, CPU\npickled (LMCache\ndefault; kv_hit_path)")
        colors.insert(0, "tab:red")
    vals.append(copy["gb_per_s_median"])
    ticks.append("torch copy\n(same bytes)")
    colors.append("tab:gray")
    axes[2].bar(range(len(vals)), vals, color=colors)
    axes[2].set_xticks(range(len(vals)), ticks, fontsize=7)
    for i, v in enumerate(vals):
        axes[2].text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    axes[2].set_title("KV bandwidth, GB/s (hit path: LMCache's retrieve timings)", fontsize=9)
    axes[2].grid(alpha=0.3, axis="y")
    w = doc["workload"]
    fig.suptitle(
        f"Long-document QA: {w['docs']} docs x {w['doc_tokens']} tokens ({w['working_set_gib']:.1f} GiB KV vs "
        f"{w['engine_kv_mib']} MiB engine KV), C={w['concurrency']}, {w['output_tokens']} output tokens; "
        f"{doc['model']['num_hidden_layers']}-layer h{doc['model']['hidden_size']} Llama, {doc['model']['torch_dtype']}; "
        f"load {doc['load_avg_start'][0]:.1f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
