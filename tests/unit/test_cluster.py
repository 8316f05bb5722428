"""deploy/cluster.py without processes: per-replica properties, the router's extra flags and
environment, restarting a replica."""

from __future__ import annotations

import json

import pytest

import deploy.cluster as cluster_mod
from deploy.cluster import REPLICA_PROPS, Cluster, ClusterError, Proc


class FakeProc:
    def __init__(self, name, argv, port, url, state_dir, env=None):
        self.name, self.argv, self.port, self.url, self.env = name, argv, port, url, env
        self.pid, self.start, self.log, self.alive = 1, None, "", True

    def to_json(self):
        return {"name": self.name, "port": self.port, "url": self.url}


@pytest.fixture
def spawned(monkeypatch):
    calls: list[FakeProc] = []

    def spawn(name, argv, port, url, state_dir, env=None):
        proc = FakeProc(name, argv, port, url, state_dir, env)
        calls.append(proc)
        return proc

    monkeypatch.setattr(Proc, "spawn", staticmethod(spawn))
    monkeypatch.setattr(cluster_mod, "_wait_http", lambda proc, path, timeout, **kw: 0.0)
    return calls


def props_file(state_dir, i) -> dict[str, str]:
    lines = (state_dir / f"replica-{i}" / "serving.properties").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_replica_props_apply_over_the_shared_props_per_replica(tmp_path, spawned):
    def per_replica(i):
        return {"option.kv_events_config": json.dumps({"endpoint": f"tcp://127.0.0.1:{7000 + i}"}), "option.dtype": f"d{i}"}

    c = Cluster(state_dir=tmp_path, replicas=2, shared_cache=False, props={"option.dtype": "fp32"}, replica_props=per_replica)
    c.start_replicas()
    for i in range(2):
        props = props_file(tmp_path, i)
        assert json.loads(props["option.kv_events_config"]) == {"endpoint": f"tcp://127.0.0.1:{7000 + i}"}
        assert props["option.dtype"] == f"d{i}"  # replica_props win over props
        assert props["option.model_id"] == REPLICA_PROPS["option.model_id"]
        assert props["option.lmcache_config_file"] == str(tmp_path / "lmcache.yaml")


def test_without_replica_props_every_replica_gets_the_same_properties(tmp_path, spawned):
    c = Cluster(state_dir=tmp_path, replicas=2, shared_cache=False, props={"option.dtype": "fp32"})
    c.start_replicas()
    assert props_file(tmp_path, 0) == props_file(tmp_path, 1)
    assert props_file(tmp_path, 0)["option.dtype"] == "fp32"


def test_restart_replica_respawns_a_dead_one_with_its_own_properties(tmp_path, spawned):
    c = Cluster(state_dir=tmp_path, replicas=2, shared_cache=False, replica_props=lambda i: {"option.x": str(i)})
    c.start_replicas()
    with pytest.raises(ClusterError, match="still running"):
        c.restart_replica(1)
    c.servers[1].alive = False
    (tmp_path / "replica-1" / "serving.properties").unlink()
    new = c.restart_replica(1)
    assert c.servers[1] is new and new.name == "replica-1" and new.alive
    assert props_file(tmp_path, 1)["option.x"] == "1"
    assert json.loads((tmp_path / "cluster.json").read_text())["replicas"][1]["url"] == new.url


def test_start_router_appends_extra_args_and_passes_its_environment(tmp_path, spawned, monkeypatch):
    import httpx

    monkeypatch.setattr(cluster_mod, "router_binary", lambda: "/bin/vllm-router")
    monkeypatch.setattr(httpx, "get", lambda url, timeout: type("R", (), {"status_code": 200})())
    c = Cluster(state_dir=tmp_path, replicas=2, shared_cache=False, router_env={"VLLM_ROUTER_TOKENIZER": "/m"})
    c.start_replicas()
    extra = ["--kv-event-source", f"{c.servers[0].url}=tcp://127.0.0.1:7000", "--kv-event-block-size", "128"]
    router = c.start_router("kv_aware", extra_args=extra)
    assert router.argv[router.argv.index("--policy") + 1] == "kv_aware"
    assert router.argv[-len(extra):] == extra
    assert router.env == {"VLLM_ROUTER_TOKENIZER": "/m"}
    plain = Cluster(state_dir=tmp_path, replicas=1, shared_cache=False)
    plain.servers = [c.servers[0]]
    r2 = plain.start_router()
    assert "--kv-event-source" not in r2.argv and r2.env == {}
    assert r2.argv[r2.argv.index("--policy") + 1] == "consistent_hash"
