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
import time
from pathlib import Path

import httpx

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


if __name__ == "__main__":
    main()
