"""Group membership without vLLM: a worker's connection to the leader's roster, a lost member
reported once and fast on both ends, a group that does not form ending with the missing rank named,
and the worker's /ping answering 503 until it has joined."""

from __future__ import annotations

import threading
import time

import httpx

from lmi_server.config.group import GroupPlan
from lmi_server.group import membership
from lmi_server.group.leader import watch_group
from lmi_server.group.membership import Link, Roster
from lmi_server.group.worker import _Status, ping_server
from tests.support.server import free_port


def wait(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_worker_joins_and_its_closed_connection_is_a_lost_rank_at_once():
    lost: list[tuple[int, str]] = []
    port = free_port()
    roster = Roster(2, port, lambda rank, why: lost.append((rank, why)), host="127.0.0.1")
    link = Link(1, "127.0.0.1", port, lambda why: None)
    link.start(time.monotonic() + 10)
    try:
        assert wait(lambda: roster.missing() == [])
        assert roster.formed_after_s() is not None
        started = time.monotonic()
        link.close()  # the worker's side stops heartbeating and closes: as a killed process
        assert wait(lambda: lost, timeout=8)
        assert time.monotonic() - started < membership.SILENCE_S  # seen by the closed connection, not by silence
        assert lost[0][0] == 1 and ("connection closed" in lost[0][1] or "connection lost" in lost[0][1]), lost
    finally:
        roster.close()


def test_the_worker_sees_its_leader_go():
    gone: list[str] = []
    port = free_port()
    roster = Roster(2, port, lambda rank, why: None, host="127.0.0.1")
    link = Link(1, "127.0.0.1", port, gone.append)
    link.start(time.monotonic() + 10)
    assert wait(link.connected.is_set)
    roster.close()  # the leader stops: its member connections close with its threads' sockets
    for thread in threading.enumerate():
        if thread.name == "group-member":
            thread.join(timeout=3)
    assert wait(lambda: gone, timeout=5), "the worker did not notice"
    assert gone[0].startswith("the leader at 127.0.0.1")


def test_silence_is_a_lost_member(monkeypatch):
    monkeypatch.setattr(membership, "SILENCE_S", 0.5)
    lost: list[tuple[int, str]] = []
    port = free_port()
    roster = Roster(2, port, lambda rank, why: lost.append((rank, why)), host="127.0.0.1")
    import socket

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"rank 1\n")  # joins, then never says a word again (a node gone without closing)
    try:
        assert wait(lambda: lost, timeout=5)
        assert "silent for" in lost[0][1]
    finally:
        sock.close()
        roster.close()


def test_a_group_that_does_not_form_ends_naming_the_missing_rank():
    ended: list[str] = []
    plan = GroupPlan(size=3, rank=0, leader_address="127.0.0.1", master_port=free_port(), source="LWS_GROUP_SIZE")
    roster = watch_group(plan, 1.0, end=ended.append)
    link = Link(2, "127.0.0.1", plan.membership_port, lambda why: None)
    link.start(time.monotonic() + 5)
    try:
        assert wait(lambda: ended, timeout=5)
        assert "did not form within option.model_loading_timeout=1 s: rank 1 never joined" in ended[0]
    finally:
        link.close()
        roster.close()


def test_a_membership_port_taken_by_another_process_ends_the_leader_naming_it():
    import socket

    import pytest

    ended: list[str] = []
    plan = GroupPlan(size=2, rank=0, leader_address="127.0.0.1", master_port=free_port(), source="LWS_GROUP_SIZE")
    with socket.create_server(("0.0.0.0", plan.membership_port)):
        with pytest.raises(OSError):
            watch_group(plan, 1.0, end=ended.append)
    assert ended and f"membership port {plan.membership_port} (option.master_port + 1)" in ended[0]
    assert "choose another option.master_port" in ended[0]


def test_worker_ping_is_503_until_joined_and_live_is_200():
    status = _Status(1)
    port = free_port()
    server = ping_server("127.0.0.1", port, status)
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/ping").status_code == 503
        assert httpx.get(base + "/live").status_code == 200
        assert httpx.get(base + "/v1/models").status_code == 404
        status.joined = True
        ping = httpx.get(base + "/ping")
        assert ping.status_code == 200 and ping.json()["rank"] == 1
    finally:
        server.shutdown()


def test_builtin_model_in_a_pipeline_is_compiled_on_cpu(monkeypatch):
    from pathlib import Path

    from lmi_server.config.schema import build_serving_config
    from lmi_server.runtime.defaults import builtin_defaults

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = build_serving_config({"option.model_id": "lmi-demo", "option.cluster_size": "2"}, Path("/nonexistent"), environ={})
    args, notes = dict(cfg.engine_args), []
    builtin_defaults(cfg, args, notes)
    assert "enforce_eager" not in args and any("pipeline parallelism" in n for n in notes)
    single = build_serving_config({"option.model_id": "lmi-demo"}, Path("/nonexistent"), environ={})
    args = dict(single.engine_args)
    builtin_defaults(single, args, [])
    assert args["enforce_eager"] is True
