"""LMCache's CPU hit path on a CPU host: pickled hits vs a /dev/shm CPU tier (the default where it fits).

On CPU hosts LMCache's MP server runs in engine_driven transfer mode. Without shared memory every
hit is handed to the engine's worker as a pickle over ZMQ: the server clones each chunk and
pickles the list, the worker unpickles it and copies it into its paged KV cache. With
`--shm-name` (our LMCache file key `mp_shm`, on by default when /dev/shm can hold the tier) the CPU
tier lives in a /dev/shm segment that the worker maps, so a hit is one copy from the segment into
the paged KV cache.

In both modes the worker then copies each hit into vLLM's CPU KV cache, which is head-major inside
each block while LMCache's chunks are token-major: a transposing scatter. The /dev/shm tier runs
twice with LMCache's own copy kernel and twice with ours (lmi_server/kvcache/block_copy.py,
installed by the connector), A B B A, probes pooled per mode.

Same model, documents and probes as benchmarks/long_doc_qa.py, small scale (5 documents, engine
KV of 128 MiB so that they leave vLLM's cache):
LMCache's own retrieve timings ("Retrieved N tokens in S seconds": from the end of the server's
PREPARE_RETRIEVE to the worker's COMMIT_RETRIEVE) and the TTFT of an LMCache hit minus the TTFT of
the vLLM-local hit of the same document right after it (this one also covers the server-side
clone + pickle of the pickle path), against a torch copy of the same bytes.

    python benchmarks/kv_hit_path.py              # results/kv_hit_path.{json,png}
    python benchmarks/kv_hit_path.py --plot-only  # redraw the PNG
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import long_doc_qa as ldqa  # noqa: E402
from benchmarks.common import machine, save  # noqa: E402
from tests.support import worker_hook  # noqa: E402


def pickle_path_costs(spec, tokens: int, chunk_size: int = 256, repeats: int = 5) -> dict:
    """Where the pickle path's time goes, step by step, in this process: the server's clone of
    each chunk and pickle.dumps of the list, the worker's pickle.loads, and the copy into a paged
    KV cache (what the SHM path does alone). Chunks are LMCache's engine_driven objects for vLLM's
    CPU KV cache, [layers, chunk, kv_heads * 2*head_dim] (the bytes of whole blocks; inside a block and
    head vLLM's CPU kernels keep K dimension-major, then V token-major); medians of a few repeats."""
    import pickle
    import statistics

    import torch

    dtype = getattr(torch, spec.torch_dtype)
    heads = spec.num_key_value_heads
    head_dim = spec.hidden_size // spec.num_attention_heads
    n_chunks = tokens // chunk_size
    chunks = [torch.randn(spec.num_hidden_layers, chunk_size, heads * 2 * head_dim).to(dtype) for _ in range(n_chunks)]
    block = 128  # vLLM's KV block size on CPU (0.32; LMCache insists its chunk be a multiple of it)

    def timed(fn):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    blob = pickle.dumps([c.clone() for c in chunks])

    # What the worker does with the bytes of a hit (scatter) or a store (gather), through LMCache's
    # own entry points on vLLM's CPU KV cache (per layer [blocks, kv_heads, block, 2*head_dim]:
    # head-major inside each block, so both directions transpose), with LMCache's kernel and with
    # ours (lmi_server/kvcache/block_copy.py).
    from lmcache.v1.multiprocess.transfer_context.base import gather_paged_kv_to_cpu, scatter_cpu_to_paged_kv
    from lmcache.v1.platform.torch_ops import mp_mem_kernels

    from lmi_server.kvcache import block_copy

    n_blocks = n_chunks * chunk_size // block
    kv = {f"layer.{i}": torch.zeros(n_blocks + 8, heads, block, 2 * head_dim, dtype=dtype) for i in range(spec.num_hidden_layers)}
    block_ids = list(range(n_blocks + 7, 7, -1))  # descending, as a running engine often hands them out
    lmcache_kernel = mp_mem_kernels._transfer_per_layer_fused
    lmcache_kernel = getattr(lmcache_kernel, "lmcache_kernel", lmcache_kernel)

    def with_kernel(ours: bool, fn):
        def run():
            if ours:
                block_copy.install()
            else:
                mp_mem_kernels._transfer_per_layer_fused = lmcache_kernel
            try:
                fn()
            finally:
                mp_mem_kernels._transfer_per_layer_fused = lmcache_kernel
        return run

    def scatter():
        scatter_cpu_to_paged_kv(kv, block_ids, chunks, chunk_size // block)

    def gather():
        gather_paged_kv_to_cpu(kv, block_ids, chunk_size // block, out=chunks)

    nbytes = sum(c.numel() * c.element_size() for c in chunks)
    out: dict = {"bytes": nbytes, "chunks": n_chunks}
    default_threads = torch.get_num_threads()
    # The MP server runs torch with its default thread count (2 here); vLLM's CPU worker with 1.
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        steps = {
            "server_clone_s": timed(lambda: [c.clone() for c in chunks]),
            "server_pickle_dumps_s": timed(lambda: pickle.dumps(chunks)),
            "worker_pickle_loads_s": timed(lambda: pickle.loads(blob)),
            "worker_hit_scatter_lmcache_kernel_s": timed(with_kernel(False, scatter)),
            "worker_hit_scatter_block_copy_s": timed(with_kernel(True, scatter)),
            "worker_store_gather_lmcache_kernel_s": timed(with_kernel(False, gather)),
            "worker_store_gather_block_copy_s": timed(with_kernel(True, gather)),
        }
        out[f"torch_threads_{threads}"] = {**steps, "gb_per_s": {k.removesuffix("_s"): nbytes / v / 1e9 for k, v in steps.items()}}
    torch.set_num_threads(default_threads)
    return out


# Run inside each server's engine processes (tests/support/worker_hook.py): times the worker's copy
# of each LMCache hit into a file; with LMI_BENCH_LMCACHE_KERNEL=1 the worker also keeps LMCache's
# own copy kernel.
WORKER_TIMING = """\
import os
import time


def on_connector_import():
    from lmcache.v1.multiprocess.transfer_context import worker_transfer

    if os.environ.get("LMI_BENCH_LMCACHE_KERNEL") == "1":
        from lmi_server.kvcache import block_copy

        block_copy.install = lambda: False
    scatter = worker_transfer.scatter_cpu_to_paged_kv
    log = os.environ["LMI_BENCH_SCATTER_LOG"]

    def timed_scatter(*args, **kwargs):
        t0 = time.perf_counter()
        scatter(*args, **kwargs)
        with open(log, "a") as f:
            f.write(f"{time.perf_counter() - t0:.6f}\\n")

    worker_transfer.scatter_cpu_to_paged_kv = timed_scatter
"""


def worker_scatter_times(path: Path) -> list[float]:
    """Seconds of each hit's copy inside the engine worker, in order (see WORKER_TIMING)."""
    try:
        return [float(x) for x in path.read_text().split()]
    except OSError:
        return []


def pool_probes(rows: list[dict]) -> dict:
    """One row whose probes and retrieve records are those of all runs of a mode, in order."""
    probe = {**rows[0]["probe"], "ttft_s": [], "cached_tokens": [], "ok": all(r["probe"]["ok"] for r in rows)}
    retrieves = {"count": 0, "tokens": 0, "seconds": 0.0, "each": []}
    query_retrieves = {"count": 0, "tokens": 0, "seconds": 0.0, "each": []}
    for r in rows:
        probe["ttft_s"] += r["probe"]["ttft_s"]
        probe["cached_tokens"] += r["probe"]["cached_tokens"]
        for pooled, rec in ((retrieves, r["probe"].get("retrieves")), (query_retrieves, r.get("query_retrieves"))):
            for key in ("count", "tokens", "seconds"):
                pooled[key] += (rec or {}).get(key, 0)
            pooled["each"] += (rec or {}).get("each", [])
    probe["retrieves"] = retrieves
    return {"probe": probe, "query_retrieves": query_retrieves}


def plot(doc: dict, path: Path) -> None:
    """Bars of GB/s for one run: the plain copies, the engine worker's copy of a hit into vLLM's
    CPU KV cache with LMCache's kernel and block-wise (timed inside the worker), and LMCache's
    retrieve as its server timed it (the worker's copy plus the hand-over and commit round trip)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = doc["modes"]
    retrieve = {m: modes[m]["hit_path"]["lmcache_retrieve_probe"]["gb_per_s"] for m in modes}
    worker = {m: modes[m]["hit_path"].get("worker_scatter", {}).get("gb_per_s", float("nan")) for m in modes}
    bars = [
        ("torch copy\n2 threads", doc["copy"]["threads_2"]["gb_per_s_median"]),
        ("torch copy\n1 thread", doc["copy"]["threads_1"]["gb_per_s_median"]),
        ("worker's copy,\nLMCache kernel", worker["shm_lmcache_kernel"]),
        ("worker's copy,\nblock-wise", worker["shm"]),
        ("retrieve /dev/shm,\nLMCache kernel", retrieve["shm_lmcache_kernel"]),
        ("retrieve /dev/shm,\nblock-wise", retrieve["shm"]),
        ("retrieve\npickled", retrieve["pickle"]),
    ]
    colors = ["grey", "grey", "tab:olive", "tab:green", "tab:cyan", "tab:blue", "tab:red"]
    fig, ax = plt.subplots(figsize=(11.5, 4.8))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=colors)
    for i, (_, v) in enumerate(bars):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel("GB/s")
    mb = doc["modes"]["shm"]["hit_path"]["hit_bytes"] / 1e6
    ax.set_title(f"KV hit path on CPU: {mb:.0f} MB hits, load {doc['load_avg_start'][0]:.1f} -> {doc['load_avg_end'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    if "--plot-only" in sys.argv:  # redraw the PNG from the saved JSON
        import json

        from benchmarks.common import RESULTS

        plot(json.loads((RESULTS / "kv_hit_path.json").read_text()), RESULTS / "kv_hit_path.png")
        return 0
    if "--breakdown-only" in sys.argv:  # add the step costs to an existing kv_hit_path.json
        import json

        from benchmarks.common import RESULTS

        args = ldqa.parser().parse_args([])
        path = RESULTS / "kv_hit_path.json"
        doc = json.loads(path.read_text())
        doc["pickle_path_steps"] = pickle_path_costs(ldqa.model_spec(args), 5888)
        doc["pickle_path_steps"]["load_avg"] = os.getloadavg()
        path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
        print(json.dumps(doc["pickle_path_steps"], indent=1))
        return 0
    args = ldqa.parser().parse_args(
        ["--docs", "5", "--engine-kv-mib", "128", "--concurrency", "2", "--probes", "3",
         "--output-tokens", "4", "--cpu-tier-gib", "1", *sys.argv[1:]]
    )
    spec = ldqa.model_spec(args)
    cache = Path(args.model_cache)
    cache.mkdir(parents=True, exist_ok=True)
    model = ldqa.ensure_model(spec, cache)
    docs = ldqa.make_documents(model, args.docs, args.doc_tokens)
    bpt = ldqa.kv_bytes_per_token(spec)
    load_start = os.getloadavg()
    copy = ldqa.copy_bandwidth(args.doc_tokens * bpt)
    print(f"torch copy {copy['bytes'] / 1e6:.0f} MB: {copy['gb_per_s_median']:.2f} GB/s; load {load_start}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-kvhit-"))
    # Every server of this run starts with a sitecustomize that times the worker's copy of each hit
    # (LMCache's scatter_cpu_to_paged_kv, inside the engine process) into a file; for the
    # side-by-side, the shm_lmcache_kernel servers also turn down block_copy.install(), so their
    # worker keeps LMCache's own copy kernel.
    shim_path = worker_hook.install(work / "worker-hook", WORKER_TIMING)

    def env_for(i: int, name: str) -> dict:
        env = {"PYTHONPATH": shim_path, "LMI_BENCH_SCATTER_LOG": str(work / f"{i}-{name}-scatter.log")}
        if name == "shm_lmcache_kernel":
            env["LMI_BENCH_LMCACHE_KERNEL"] = "1"
        return env

    # pickled hits once; the /dev/shm tier with LMCache's copy kernel and with the block-wise copy,
    # A B B A, probes pooled per mode
    runs = [("pickle", False), ("shm_lmcache_kernel", True), ("shm", True), ("shm", True), ("shm_lmcache_kernel", True)]
    runs = [(name, shm, env_for(i, name)) for i, (name, shm) in enumerate(runs)]
    rows: dict[str, list[dict]] = {}
    t0 = time.monotonic()
    for i, (name, shm, env) in enumerate(runs):
        args.shm, args.server_env = shm, env
        row = ldqa.run_config("lmcache-cpu", model, docs, args, work / f"{i}-{name}")
        row["worker_scatter_s"] = worker_scatter_times(Path(env["LMI_BENCH_SCATTER_LOG"]))
        rows.setdefault(name, []).append(row)
        rp = ldqa.hit_path({"lmcache-cpu": row}, bpt)["lmcache-cpu"].get("lmcache_retrieve_probe", {})
        print(f"{name}: retrieve {rp.get('gb_per_s', float('nan')):.2f} GB/s (LMCache timings), "
              f"query TTFT mean {row['query']['ttft_mean_s']:.3f} s", flush=True)
    modes = {}
    for name, mode_rows in rows.items():
        pooled = pool_probes(mode_rows)
        hp = ldqa.hit_path({"lmcache-cpu": pooled}, bpt)["lmcache-cpu"]
        for key in ("lmcache_retrieve_probe", "lmcache_retrieve_query"):
            if key in hp:
                hp[key]["fraction_of_copy"] = hp[key]["gb_per_s"] / copy["gb_per_s_median"]
                hp[key]["fraction_of_copy_1_thread"] = hp[key]["gb_per_s"] / copy["threads_1"]["gb_per_s_median"]
        if hp.get("gb_per_s"):
            hp["fraction_of_copy"] = hp["gb_per_s"] / copy["gb_per_s_median"]
        # the worker's own copy of the probes' LMCache hits: the last `probes` scatters of each run
        # (a probe's vLLM-local partner loads nothing)
        scatters = [t for r in mode_rows for t in r["worker_scatter_s"][-args.probes:]]
        if scatters:
            hp["worker_scatter"] = {
                "seconds": scatters,
                "median_s": statistics.median(scatters),
                "gb_per_s": hp["hit_bytes"] / statistics.median(scatters) / 1e9,
            }
            hp["worker_scatter"]["fraction_of_copy"] = hp["worker_scatter"]["gb_per_s"] / copy["gb_per_s_median"]
            hp["worker_scatter"]["fraction_of_copy_1_thread"] = hp["worker_scatter"]["gb_per_s"] / copy["threads_1"]["gb_per_s_median"]
        modes[name] = {"runs": len(mode_rows), "hit_path": hp, "query": [r["query"] for r in mode_rows],
                       "probe": [r["probe"] for r in mode_rows], "server_start_s": [r.get("server_start_s") for r in mode_rows]}
    doc = {
        "benchmark": "kv_hit_path",
        "machine": machine(),
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "wall_s": time.monotonic() - t0,
        "model": {"kv_bytes_per_token": bpt, "layers": spec.num_hidden_layers, "hidden": spec.hidden_size,
                  "kv_heads": spec.num_key_value_heads, "dtype": spec.torch_dtype},
        "workload": {"docs": args.docs, "doc_tokens": args.doc_tokens, "engine_kv_mib": args.engine_kv_mib,
                     "chunk_size": args.chunk_size, "probes": args.probes},
        "copy": copy,
        "modes": modes,
    }
    p, s, k = (modes[m]["hit_path"] for m in ("pickle", "shm", "shm_lmcache_kernel"))
    if all("lmcache_retrieve_probe" in h for h in (p, s, k)):
        doc["speedup_retrieve_shm_over_pickle"] = s["lmcache_retrieve_probe"]["gb_per_s"] / p["lmcache_retrieve_probe"]["gb_per_s"]
        doc["speedup_retrieve_block_copy_over_lmcache_kernel"] = s["lmcache_retrieve_probe"]["gb_per_s"] / k["lmcache_retrieve_probe"]["gb_per_s"]
    doc["ttft_hit_minus_local_s"] = {m: modes[m]["hit_path"]["hit_path_s"] for m in modes}
    doc["pickle_path_steps"] = pickle_path_costs(spec, 5888, args.chunk_size)
    path = save("kv_hit_path", doc)
    plot(doc, path.with_suffix(".png"))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    print("wrote", path, "speedup", doc.get("speedup_retrieve_shm_over_pickle"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
