"""LMCache's CPU hit path on a CPU host: pickled hits vs a /dev/shm CPU tier (the default where it fits).

On CPU hosts LMCache's MP server runs in engine_driven transfer mode. Without shared memory every
hit is handed to the engine's worker as a pickle over ZMQ: the server clones each chunk and
pickles the list, the worker unpickles it and copies it into its paged KV cache. With
`--shm-name` (our LMCache file key `mp_shm`, on by default when /dev/shm can hold the tier) the CPU
tier lives in a /dev/shm segment that the worker maps, so a hit is one copy from the segment into
the paged KV cache.

Same model, documents and probes as benchmarks/long_doc_qa.py, small scale (5 documents, engine
KV of 128 MiB so that they leave vLLM's cache), once per mode, one after the other:
LMCache's own retrieve timings ("Retrieved N tokens in S seconds": from the end of the server's
PREPARE_RETRIEVE to the worker's COMMIT_RETRIEVE) and the TTFT of an LMCache hit minus the TTFT of
the vLLM-local hit of the same document right after it (this one also covers the server-side
clone + pickle of the pickle path), against a torch copy of the same bytes.

    python benchmarks/kv_hit_path.py              # results/kv_hit_path.{json,png}
    python benchmarks/kv_hit_path.py --plot-only  # redraw the PNG
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import long_doc_qa as ldqa  # noqa: E402
from benchmarks.common import machine, save  # noqa: E402


def pickle_path_costs(spec, tokens: int, chunk_size: int = 256, repeats: int = 5) -> dict:
    """Where the pickle path's time goes, step by step, in this process: the server's clone of
    each chunk and pickle.dumps of the list, the worker's pickle.loads, and the copy into a paged
    KV cache (what the SHM path does alone). Chunks are LMCache's engine_driven objects
    [2, layers, chunk, kv_heads*head_dim]; medians of a few repeats."""
    import pickle
    import statistics

    import torch

    dtype = getattr(torch, spec.torch_dtype)
    width = spec.num_key_value_heads * (spec.hidden_size // spec.num_attention_heads)
    n_chunks = tokens // chunk_size
    chunks = [torch.randn(2, spec.num_hidden_layers, chunk_size, width).to(dtype) for _ in range(n_chunks)]
    block = 128  # vLLM's KV block size on CPU (0.32; LMCache insists its chunk be a multiple of it)
    paged = torch.zeros(2, spec.num_hidden_layers, n_chunks * chunk_size // block + 8, block, width, dtype=dtype)
    ids = torch.randperm(paged.shape[2])[: n_chunks * chunk_size // block]

    def timed(fn):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    blob = pickle.dumps([c.clone() for c in chunks])

    def scatter():
        for i, c in enumerate(chunks):
            dst = ids[i * (chunk_size // block) : (i + 1) * (chunk_size // block)]
            paged.index_copy_(2, dst, c.view(2, spec.num_hidden_layers, chunk_size // block, block, width))

    # vLLM's CPU KV cache is head-major per block ([blocks, kv_heads, block, head_dim] for K and
    # for V, per layer) while a chunk is token-major: a hit must also transpose each block.
    heads = spec.num_key_value_heads
    head_dim = width // heads
    hnd = [torch.zeros(2, paged.shape[2], heads, block, head_dim, dtype=dtype) for _ in range(spec.num_hidden_layers)]

    def scatter_head_major():
        for i, c in enumerate(chunks):
            dst = ids[i * (chunk_size // block) : (i + 1) * (chunk_size // block)]
            for layer, kv in enumerate(hnd):
                for plane in (0, 1):
                    src = c[plane, layer].reshape(chunk_size // block, block, heads, head_dim).permute(0, 2, 1, 3)
                    kv[plane].index_copy_(0, dst, src)

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
            "worker_scatter_into_paged_kv_s": timed(scatter),
            "worker_scatter_head_major_s": timed(scatter_head_major),
        }
        out[f"torch_threads_{threads}"] = {**steps, "gb_per_s": {k.removesuffix("_s"): nbytes / v / 1e9 for k, v in steps.items()}}
    torch.set_num_threads(default_threads)
    return out


def plot(doc: dict, path: Path) -> None:
    """Bars of GB/s for one run: the plain copies, the vectorized scatter into a paged KV cache,
    and LMCache's retrieve in both transfer modes (its own timings)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = doc["pickle_path_steps"]
    bars = [
        ("torch copy\n2 threads", doc["copy"]["threads_2"]["gb_per_s_median"] if "threads_2" in doc["copy"] else doc["copy"]["gb_per_s_median"]),
        ("torch copy\n1 thread", doc["copy"].get("threads_1", {}).get("gb_per_s_median", float("nan"))),
        ("index_copy_ into\npaged KV, 1 thread", steps["torch_threads_1"]["gb_per_s"]["worker_scatter_into_paged_kv"]),
        ("same, transposed to\nvLLM's CPU layout", steps["torch_threads_1"]["gb_per_s"].get("worker_scatter_head_major", float("nan"))),
        ("LMCache retrieve\n/dev/shm tier", doc["modes"]["shm"]["hit_path"]["lmcache_retrieve_probe"]["gb_per_s"]),
        ("LMCache retrieve\npickled", doc["modes"]["pickle"]["hit_path"]["lmcache_retrieve_probe"]["gb_per_s"]),
    ]
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["grey", "grey", "tab:green", "tab:olive", "tab:blue", "tab:red"])
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
    modes = {}
    t0 = time.monotonic()
    for shm in (False, True):
        args.shm = shm
        row = ldqa.run_config("lmcache-cpu", model, docs, args, work / ("shm" if shm else "pickle"))
        hp = ldqa.hit_path({"lmcache-cpu": row}, bpt)["lmcache-cpu"]
        for key in ("lmcache_retrieve_probe", "lmcache_retrieve_query"):
            if key in hp:
                hp[key]["fraction_of_copy"] = hp[key]["gb_per_s"] / copy["gb_per_s_median"]
        if hp.get("gb_per_s"):
            hp["fraction_of_copy"] = hp["gb_per_s"] / copy["gb_per_s_median"]
        name = "shm" if shm else "pickle"
        modes[name] = {"hit_path": hp, "query": row["query"], "probe": row["probe"], "server_start_s": row.get("server_start_s")}
        rp = hp.get("lmcache_retrieve_probe", {})
        print(f"{name}: retrieve {rp.get('gb_per_s', float('nan')):.2f} GB/s (LMCache timings), "
              f"TTFT hit - local hit {hp['hit_path_s'] * 1000:.0f} ms, query TTFT mean {row['query']['ttft_mean_s']:.3f} s", flush=True)
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
    p, s = modes["pickle"]["hit_path"], modes["shm"]["hit_path"]
    if "lmcache_retrieve_probe" in p and "lmcache_retrieve_probe" in s:
        doc["speedup_retrieve_shm_over_pickle"] = s["lmcache_retrieve_probe"]["gb_per_s"] / p["lmcache_retrieve_probe"]["gb_per_s"]
    doc["ttft_hit_minus_local_s"] = {"pickle": p["hit_path_s"], "shm": s["hit_path_s"]}
    doc["pickle_path_steps"] = pickle_path_costs(spec, 5888, args.chunk_size)
    path = save("kv_hit_path", doc)
    plot(doc, path.with_suffix(".png"))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    print("wrote", path, "speedup", doc.get("speedup_retrieve_shm_over_pickle"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
