"""A two-node group against one node, on this CPU host: the demo model as one vLLM engine with pipeline
parallelism 2 over two `lmi-server serve` processes on loopback (leader + worker, LeaderWorkerSet
variables), against the same model on one server.

Measured: time for the group to form (start of both processes to both /ping 200) against one node's
start; decode tokens/s of one greedy stream and of 4 concurrent streams; the time from SIGKILL of the
worker's process tree to the leader's exit. Writes benchmarks/results/multinode_cpu.json.

What it predicts for GPUs: little. Both "nodes" share this host's 2 cores, so the group gains no
compute and pays torch.distributed (gloo over loopback) at every stage boundary; on GPU nodes the
group exists to hold weights that one node cannot, and its cost is the inter-node activation
transfer per pipeline stage. The failure bound (heartbeat, seconds) does carry over.

    .venv/bin/python -m benchmarks.multinode_cpu
"""

from __future__ import annotations

import concurrent.futures
import json
import platform
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.test_multinode import PROPS, group, kill_tree
from tests.support.server import running_server

OUT = Path(__file__).parent / "results" / "multinode_cpu.json"
TOKENS = 64
PROMPT = "def main("


def stream_tokens_per_s(base: str, streams: int) -> float:
    def one(_: int) -> int:
        resp = httpx.post(base + "/v1/completions", timeout=600, json={
            "model": "lmi-demo", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True})
        resp.raise_for_status()
        return resp.json()["usage"]["completion_tokens"]

    one(0)  # warm
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        tokens = sum(pool.map(one, range(streams)))
    return round(tokens / (time.monotonic() - start), 2)


def main() -> None:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="multinode-bench-"))
    result: dict = {"host": {"cpus": __import__("os").cpu_count(), "machine": platform.machine()}, "model": "lmi-demo",
                    "properties": PROPS, "max_tokens": TOKENS}
    started = time.monotonic()
    with running_server(tmp / "one", PROPS) as server:
        result["one_node"] = {"ready_s": round(time.monotonic() - started, 1),
                              "tokens_per_s_1_stream": stream_tokens_per_s(server.base_url, 1),
                              "tokens_per_s_4_streams": stream_tokens_per_s(server.base_url, 4)}
    leader, worker = group(tmp, "group", PROPS)
    try:
        started = time.monotonic()
        worker.wait_ready(900)
        leader.wait_ready(900)
        result["group_of_2"] = {"formed_s": round(time.monotonic() - started, 1),
                                "tokens_per_s_1_stream": stream_tokens_per_s(leader.base_url, 1),
                                "tokens_per_s_4_streams": stream_tokens_per_s(leader.base_url, 4)}
        killed = time.monotonic()
        kill_tree(worker)
        code = leader.proc.wait(timeout=120)
        result["group_of_2"]["leader_exit_after_worker_sigkill_s"] = round(time.monotonic() - killed, 2)
        result["group_of_2"]["leader_exit_code"] = code
    finally:
        leader.stop()
        worker.stop()
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    plot(result, OUT.with_suffix(".png"))


def plot(result: dict, out: Path) -> None:
    """Time to ready / to form, and tokens/s at 1 and 4 streams: one node against a group of two."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one, two = result["one_node"], result["group_of_2"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    bars = left.bar(["one node\n(ready)", "group of 2\n(formed)"], [one["ready_s"], two["formed_s"]], color=["#4c72b0", "#dd8452"])
    left.bar_label(bars, labels=[f"{one['ready_s']:.0f} s", f"{two['formed_s']:.0f} s"], fontsize=8)
    left.set_ylabel("seconds to /ping 200")
    width = 0.38
    for k, (name, row, color) in enumerate((("one node", one, "#4c72b0"), ("group of 2", two, "#dd8452"))):
        vals = [row["tokens_per_s_1_stream"], row["tokens_per_s_4_streams"]]
        b = right.bar([i + (k - 0.5) * width for i in range(2)], vals, width, label=name, color=color)
        right.bar_label(b, labels=[f"{v:.0f}" for v in vals], fontsize=8)
    right.set_xticks(range(2), ["1 stream", "4 streams"])
    right.set_ylabel("output tokens/s")
    right.legend(fontsize=8)
    fig.suptitle(f"{result['model']} on one host of {result['host']['cpus']} cores: both 'nodes' share them "
                 f"(leader ended {two.get('leader_exit_after_worker_sigkill_s')} s after SIGKILL of its worker)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if sys.argv[1:] == ["--plot"]:
        plot(json.loads(OUT.read_text()), OUT.with_suffix(".png"))
    else:
        main()
