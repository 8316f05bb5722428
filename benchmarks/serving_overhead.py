"""What does our layer cost? The same demo model served by lmi-server and by vLLM's own server.

Both servers run at the same time with identical engine settings; for each concurrency level the
script alternates between them (A B B A) so that machine noise falls on both alike, and reports
TTFT (mean, p90), inter-token latency and output tokens/s, plus the ratios lmi-server / vLLM.

    python benchmarks/serving_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Server, free_port, machine, run_concurrent, save, summarise  # noqa: E402

PROMPTS = [
    "def read_config(path):\n    ",
    "class LRUCache:\n    def __init__(self, capacity):\n        ",
    "import os\nimport sys\n\ndef main(argv):\n    ",
    "    for key, value in sorted(items.items()):\n        ",
]


def bodies(model: str, n: int, max_tokens: int) -> list[dict]:
    return [
        {"model": model, "prompt": PROMPTS[i % len(PROMPTS)] * 8, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        for i in range(n)
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    from lmi_server.demo.builder import ensure_demo_model

    model = str(ensure_demo_model())
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    (work / "serving.properties").write_text(
        f"option.model_id={model}\noption.served_model_name=demo\noption.cpu_kv_cache_space=2\n"
        "option.enforce_eager=true\noption.dtype=fp32\noption.max_model_len=4096\noption.max_num_seqs=32\n"
    )
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONHASHSEED": "0"}
    lmi = Server("lmi-server", [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work), "--host", "127.0.0.1", "--port", str(p1 := free_port()), "--log-level", "warning"], p1, "/ping", work / "lmi.log", env)
    vllm = Server("vllm", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "demo", "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "32", "--host", "127.0.0.1", "--port", str(p2 := free_port()), "--disable-uvicorn-access-log"], p2, "/health", work / "vllm.log", env)
    levels = [1, 8, 32]
    per_level = {1: 8, 8: 32, 32: 64} if not args.quick else {1: 2, 8: 8, 32: 32}
    rows = []
    with lmi, vllm:
        servers = {"lmi-server": lmi, "vllm": vllm}
        for server in servers.values():  # warm-up
            asyncio.run(run_concurrent(server.url + "/v1/completions", bodies("demo", 4, 8), 4))
        for c in levels:
            raw: dict[str, list] = {"lmi-server": [], "vllm": []}
            walls: dict[str, float] = {"lmi-server": 0.0, "vllm": 0.0}
            for name in ("lmi-server", "vllm", "vllm", "lmi-server"):
                res, wall = asyncio.run(run_concurrent(servers[name].url + "/v1/completions", bodies("demo", per_level[c], args.max_tokens), c))
                raw[name] += res
                walls[name] += wall
            for name in servers:
                row = {"server": name, "concurrency": c, **summarise(raw[name], walls[name])}
                rows.append(row)
                print(f"{name:10s} c={c:2d} ttft={row['ttft_mean_s']*1000:7.1f} ms p90={row['ttft_p90_s']*1000:7.1f} ms "
                      f"itl={row['itl_mean_s']*1000:6.2f} ms tok/s={row['output_tokens_per_s']:7.1f} failed={row['failed']}")
        starts = {name: s.start_s for name, s in servers.items()}
    ratios = []
    for c in levels:
        a = next(r for r in rows if r["server"] == "lmi-server" and r["concurrency"] == c)
        b = next(r for r in rows if r["server"] == "vllm" and r["concurrency"] == c)
        ratios.append({
            "concurrency": c,
            "ttft_mean_ratio": a["ttft_mean_s"] / b["ttft_mean_s"],
            "itl_mean_ratio": a["itl_mean_s"] / b["itl_mean_s"],
            "throughput_ratio": a["output_tokens_per_s"] / b["output_tokens_per_s"],
        })
    doc = {"benchmark": "serving_overhead", "machine": machine(), "max_tokens": args.max_tokens, "server_start_s": starts, "rows": rows, "ratios_lmi_over_vllm": ratios}
    path = save("serving_overhead", doc)
    plot(doc, path.with_suffix(".png"))
    print("wrote", path)
    return 0


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, label, scale in (
        (axes[0], "ttft_mean_s", "mean TTFT (ms)", 1000),
        (axes[1], "itl_mean_s", "mean inter-token latency (ms)", 1000),
        (axes[2], "output_tokens_per_s", "output tokens/s", 1),
    ):
        for name, marker in (("lmi-server", "o"), ("vllm", "s")):
            pts = [(r["concurrency"], r[key] * scale) for r in doc["rows"] if r["server"] == name]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("lmi-server vs vLLM's own server, demo model, same engine settings")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
