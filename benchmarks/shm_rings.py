"""What do smaller message rings cost? The same server with the host's /dev/shm (vLLM's default
rings: 16 MiB and 24 MiB chunks) and with Docker's default 64 MiB /dev/shm (rings shrunk to 2 MiB
chunks, lmi_server/shm_rings.py), measured with vLLM's own serving benchmark (`vllm bench serve`).

Both servers run at the same time with identical settings; the small one has a tmpfs of 64 MiB at
/dev/shm in a mount namespace of its own (`unshare -m`, root). For each concurrency (1, 8) and each
route (chat, completions) the runs go A B B A with a pause between, fresh seeded prompts per pair.

    python benchmarks/shm_rings.py [--quick] [--routes chat,completions] [--reuse DIR]

--reuse DIR summarises the per-run results a run left in DIR instead of running again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Server, free_port, machine, save  # noqa: E402
from benchmarks.serving_overhead import bench_serve, pooled  # noqa: E402

LEVELS = (1, 8)
ORDER = ("default", "64mib", "64mib", "default")
ROUTES = {"chat": ("openai-chat", "/v1/chat/completions"), "completions": ("openai", "/v1/completions")}
# (prompt log-probabilities, the largest messages, cannot be streamed: vllm bench serve streams)


def servers(work: Path, model: str) -> dict[str, Server]:
    (work / "serving.properties").write_text(
        f"option.model_id={model}\noption.served_model_name=demo\noption.cpu_kv_cache_space=2\n"
        "option.enforce_eager=true\noption.dtype=fp32\noption.max_model_len=4096\noption.max_num_seqs=16\n"
    )
    env = {"PYTHONHASHSEED": "0"}
    serve = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work), "--host", "127.0.0.1",
             "--log-level", "warning"]
    p1, p2 = free_port(), free_port()
    small = ("mount -t tmpfs -o size=64m tmpfs /dev/shm && exec " + " ".join(serve) + f" --port {p2}")
    return {
        "default": Server("default", [*serve, "--port", str(p1)], p1, "/ping", work / "default.log", env),
        "64mib": Server("64mib", ["unshare", "-m", "sh", "-c", small], p2, "/ping", work / "64mib.log", env),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--pause-s", type=float, default=3.0)
    ap.add_argument("--routes", default="chat,completions")
    ap.add_argument("--reuse", type=Path, default=None, help="a run's folder: summarise its per-run results")
    args = ap.parse_args()
    routes = {r: ROUTES[r] for r in args.routes.split(",") if r}
    if args.reuse is not None:
        return summarise(args, routes, args.reuse, {}, os.getloadavg(), time.monotonic(), run=None)

    from lmi_server.demo.builder import ensure_demo_model

    model = str(ensure_demo_model())
    work = Path(tempfile.mkdtemp(prefix="bench-shm-"))
    prompts = {1: 4, 8: 16} if args.quick else {1: 8, 8: 32}
    both = servers(work, model)
    t0, load_start = time.monotonic(), os.getloadavg()
    with both["default"], both["64mib"]:
        log = (work / "64mib.log").read_text()
        assert "rings shrunk" in log, "the 64 MiB server did not shrink its rings"
        for name, server in both.items():  # warm-up
            bench_serve(server.url, model, "openai-chat", "/v1/chat/completions", prompts=16, concurrency=8,
                        input_len=args.input_len, output_len=8, seed=0, out=work / f"warmup-{name}.json")

        def run(route: str, c: int, i: int, name: str, seed: int) -> None:
            backend, endpoint = ROUTES[route]
            time.sleep(args.pause_s)
            load = os.getloadavg()[0]
            result = bench_serve(both[name].url, model, backend, endpoint, prompts=prompts[c], concurrency=c,
                                 input_len=args.input_len, output_len=args.output_len, seed=seed,
                                 out=work / f"{route}-{c}-{i}-{name}.json")
            result["load_average_1m"] = load
            (work / f"{route}-{c}-{i}-{name}.json").write_text(json.dumps(result))

        starts = {name: s.start_s for name, s in both.items()}
        return summarise(args, routes, work, starts, load_start, t0, run=run)


def summarise(args, routes: dict, work: Path, starts: dict, load_start, t0: float, run) -> int:
    """Run (or, without `run`, read back) every route x concurrency x A B B A, then pool and save."""
    rows, ratios = [], []
    seed = 1
    for route in routes:
        for c in LEVELS:
            runs: dict[str, list[dict]] = {"default": [], "64mib": []}
            for i, name in enumerate(ORDER):
                if run is not None:
                    run(route, c, i, name, seed + i // 2)
                result = json.loads((work / f"{route}-{c}-{i}-{name}.json").read_text())
                result.setdefault("load_average_1m", None)  # a reused run from before loads were kept
                runs[name].append(result)
            seed += 2
            for name in ("default", "64mib"):
                row = {"route": route, "rings": name, "concurrency": c, **pooled(runs[name])}
                rows.append(row)
                print(f"{route:11s} {name:8s} c={c} tok/s={row['output_tokens_per_s']:7.1f} "
                      f"ttft={row['ttft_mean_s'] * 1000:7.1f} ms itl={row['itl_mean_s'] * 1000:6.2f} ms "
                      f"failed={row['failed']}", flush=True)
            small, big = rows[-1], rows[-2]
            ratios.append({"route": route, "concurrency": c,
                           "throughput_64mib_over_default": small["output_tokens_per_s"] / big["output_tokens_per_s"],
                           "ttft_64mib_over_default": small["ttft_mean_s"] / big["ttft_mean_s"],
                           "itl_64mib_over_default": small["itl_mean_s"] / big["itl_mean_s"]})
    prompts = {1: 4, 8: 16} if args.quick else {1: 8, 8: 32}
    doc = {
        "benchmark": "shm_rings", "tool": "vllm bench serve (benchmarks/bench_serve.py)", "machine": machine(),
        "rings": {"default": "broadcast 16 MiB x 10, response 24 MiB x 10 (host /dev/shm)",
                  "64mib": "broadcast 2 MiB x 10, response 2 MiB x 10 (/dev/shm 64 MiB)"},
        "input_len": args.input_len, "output_len": args.output_len, "order": ORDER, "prompts_per_run": prompts,
        "server_start_s": starts, "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
        "wall_s": time.monotonic() - t0, "rows": rows, "ratios": ratios,
    }
    path = save("shm_rings", doc)
    plot(doc, routes, path.with_suffix(".png"))
    print("wrote", path)
    return 0


def plot(doc: dict, routes: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(routes), figsize=(5.5 * len(routes), 4), squeeze=False)
    for ax, route in zip(axes[0], routes):
        width = 0.38
        for k, name in enumerate(("default", "64mib")):
            vals = [next(r["output_tokens_per_s"] for r in doc["rows"]
                         if r["route"] == route and r["rings"] == name and r["concurrency"] == c) for c in LEVELS]
            xs = [i + (k - 0.5) * width for i in range(len(LEVELS))]
            ax.bar(xs, vals, width, label=doc["rings"][name])
        ax.set_xticks(range(len(LEVELS)), [f"{c} client{'s' if c > 1 else ''}" for c in LEVELS])
        ax.set_ylabel("output tokens/s")
        ax.set_title(route, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"vLLM's message rings at their defaults vs shrunk to a 64 MiB /dev/shm ({doc['machine'].get('cpu', '')})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
