"""A two-node group on one host: two real `lmi-server serve` processes on loopback, each with its
LeaderWorkerSet variables, running the demo model as one vLLM engine with pipeline parallelism 2,
and with tensor parallelism 2 (vLLM's multiprocessing backend across processes; its CPU backend's
torch.distributed is gloo).

- greedy answers identical to a one-node server of the same model (chat, /invocations, streaming);
- the worker answers /ping 503 until it has joined, 200 after;
- SIGKILL of the worker (its whole process tree, as a pod's death) ends the leader non-zero within
  the bound, with one line naming rank 1; a leader started alone exits naming the missing rank.

The demo model runs compiled here (option.enforce_eager=false): with enforce_eager vLLM 0.32's CPU
engine dies on the first request under pipeline parallelism (docs/multi-node.md, Limits).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.server import DEMO_PROPS, ServerProcess, free_port, running_server, server_env, write_properties

pytestmark = [pytest.mark.timeout(1500), pytest.mark.alone]  # three engines at once: none started beside them

PROPS = {**DEMO_PROPS, "option.enforce_eager": "false", "option.max_model_len": "1024", "option.cpu_kv_cache_space": "1"}
PROMPTS = ["def main(", "import os\n", "class Config:"]
# Bound for the leader to end after its worker is killed (the heartbeat's silence bound is 10 s).
LOST_RANK_BOUND_S = 15.0
GROUP_EXIT = 5


def answers(base: str) -> dict:
    out: dict = {"chat": [], "invocations": [], "stream": []}
    with httpx.Client(base_url=base, timeout=300) as client:
        for prompt in PROMPTS:
            chat = client.post("/v1/chat/completions", json={
                "model": "lmi-demo", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                "temperature": 0})
            assert chat.status_code == 200, chat.text
            out["chat"].append(chat.json()["choices"][0]["message"]["content"])
            inv = client.post("/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": 16, "do_sample": False}})
            assert inv.status_code == 200, inv.text
            out["invocations"].append(inv.json())
            text = ""
            with client.stream("POST", "/v1/completions", json={"model": "lmi-demo", "prompt": prompt, "max_tokens": 16,
                                                                "temperature": 0, "stream": True}) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        text += json.loads(line[6:])["choices"][0]["text"]
            out["stream"].append(text)
    return out


def master_port() -> int:
    """A free port whose next port is free too: the group's membership port is master_port + 1."""
    for _ in range(50):
        port = free_port()
        try:
            with socket.create_server(("0.0.0.0", port + 1)):
                return port
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def wait_group(leader: ServerProcess, worker: ServerProcess, timeout_s: float = 900) -> None:
    """Both /ping 200, failing at once (with both logs' tails) when either process ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for server in (leader, worker):
            if server.proc.poll() is not None:
                pytest.fail(f"{server.log_path.name} ended with {server.proc.returncode} before the group formed:\n"
                            f"{leader.log_tail()}\n---\n{worker.log_tail()}")
        if worker._ping() and leader._ping():
            return
        time.sleep(1)
    pytest.fail(f"the group did not form within {timeout_s:.0f} s:\n{leader.log_tail()}\n---\n{worker.log_tail()}")


def group(tmp: Path, name: str, props: dict[str, str], ranks=(0, 1)) -> list[ServerProcess]:
    model_dir = tmp / name
    # A group that cannot form ends within the test's time (the server's own bound, not pytest's).
    props = {"option.model_loading_timeout": "600", **props}
    write_properties(model_dir, {**props, "option.master_port": str(master_port())})
    env = {**server_env(), "LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "127.0.0.1"}
    return [ServerProcess(model_dir, model_dir / f"rank{r}.log", env={**env, "LWS_WORKER_INDEX": str(r)}).start()
            for r in ranks]


def kill_tree(server: ServerProcess) -> None:
    """SIGKILL the process and everything it started, as a pod's death does."""
    procs = [psutil.Process(server.proc.pid), *server.descendants()]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("one"), PROPS) as server:
        yield answers(server.base_url)


def test_two_node_group_answers_as_one_node_and_fails_as_a_group(one_node, tmp_path):
    leader, worker = group(tmp_path, "g", PROPS)
    try:
        started = time.monotonic()
        wait_group(leader, worker)
        formed_s = time.monotonic() - started
        assert 503 in worker.ping_history  # not ready before it joined the engine
        assert httpx.get(worker.base_url + "/live").status_code == 200
        assert httpx.get(worker.base_url + "/v1/models").status_code == 404  # requests go to the leader
        assert answers(leader.base_url) == one_node
        killed = time.monotonic()
        kill_tree(worker)
        code = leader.proc.wait(timeout=120)
        ended_s = time.monotonic() - killed
        assert code == GROUP_EXIT, leader.log_tail()
        assert ended_s < LOST_RANK_BOUND_S, ended_s
        assert "group lost rank 1 (the node with LWS_WORKER_INDEX=1)" in leader.log_path.read_text()
        print(json.dumps({"group_formed_s": round(formed_s, 1), "leader_exit_after_worker_kill_s": round(ended_s, 2)}))
    finally:
        leader.stop()
        worker.stop()


def test_tensor_parallel_2_across_two_nodes_answers_as_one_node(one_node, tmp_path):
    """vLLM's CPU backend also splits tensors across the two processes (gloo all-reduce)."""
    props = {**PROPS, "option.tensor_parallel_degree": "2", "option.pipeline_parallel_degree": "1"}
    leader, worker = group(tmp_path, "tp", props)
    try:
        wait_group(leader, worker)
        assert answers(leader.base_url) == one_node
    finally:
        leader.stop()
        worker.stop()


def test_a_leader_alone_exits_naming_the_rank_that_never_joined(tmp_path):
    (leader,) = group(tmp_path, "alone", {**PROPS, "option.model_loading_timeout": "20"}, ranks=(0,))
    try:
        code = leader.proc.wait(timeout=180)
        assert code == GROUP_EXIT, leader.log_tail()
        log = leader.log_path.read_text()
        assert "did not form within option.model_loading_timeout=20 s: rank 1 never joined" in log
    finally:
        leader.stop()


def test_a_worker_that_cannot_reach_its_leader_exits_naming_itself(tmp_path):
    (worker,) = group(tmp_path, "orphan", {**PROPS, "option.model_loading_timeout": "15"}, ranks=(1,))
    try:
        code = worker.proc.wait(timeout=120)
        assert code == GROUP_EXIT, worker.log_tail()
        assert "rank 1 could not join the group within option.model_loading_timeout=15 s" in worker.log_path.read_text()
    finally:
        worker.stop()
