"""deploy/cluster.py without processes: the cluster starts from the Helm chart's rendered values
(deploy/chart.py) with loopback substitutions; per-replica properties, the router's extra flags
and environment, restarting a replica; an external shared tier and its credentials."""

from __future__ import annotations

import json

import pytest
import yaml

import deploy.cluster as cluster_mod
from deploy import chart as helm_chart
from deploy.cluster import DEMO_PROPS, Cluster, ClusterError, Proc

pytest.importorskip("helm_python.chart", reason="pip install helm-python-sdk (the test extra)")


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
        assert "option.model_id" not in props  # the chart's CPU profile: the built-in assistant
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


# ---------------------------------------------------------------------------------------------
# The chart is the source
# ---------------------------------------------------------------------------------------------

REDIS_URL = "redis://127.0.0.1:6399"


def with_redis(c: Cluster) -> Cluster:
    """A cluster whose Redis is 'running' at REDIS_URL (no process)."""
    c.redis = FakeProc("redis", [], 6399, REDIS_URL, c.state_dir)
    return c


@pytest.fixture(scope="module")
def cpu_chart():
    return helm_chart.load()


@pytest.fixture
def router_ready(monkeypatch):
    import httpx

    monkeypatch.setattr(cluster_mod, "router_binary", lambda: "/bin/vllm-router")
    monkeypatch.setattr(httpx, "get", lambda url, timeout: type("R", (), {"status_code": 200})())


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_replica_properties_are_the_rendered_configmap_on_loopback(tmp_path, spawned, cpu_chart):
    c = with_redis(Cluster(state_dir=tmp_path, chart=cpu_chart))
    c.start_replicas()
    props = props_file(tmp_path, 0)
    chart_props = cpu_chart.serving_properties
    assert chart_props["option.cpu_kv_cache_space"] == "2"  # values-cpu.yaml
    assert props["option.cpu_kv_cache_space"] == chart_props["option.cpu_kv_cache_space"]
    for key in ("option.lmcache_hash_seed", "option.graceful_shutdown_timeout", "option.metrics_public", "option.max_model_len"):
        assert props[key] == chart_props[key]
    assert chart_props["option.lmcache_config_file"] == "/etc/lmi/lmcache/lmcache.yaml"
    assert props["option.lmcache_config_file"] == str(tmp_path / "lmcache.yaml")
    assert chart_props["option.sessions_redis_url"] == cpu_chart.remote_url
    assert props["option.sessions_redis_url"] == REDIS_URL
    assert "option.model_id" not in props  # values-cpu.yaml: the built-in assistant
    assert len(spawned) == cpu_chart.replicas == 2


def test_lmcache_yaml_is_the_charts_with_the_loopback_redis(tmp_path, spawned, cpu_chart):
    c = with_redis(Cluster(state_dir=tmp_path, chart=cpu_chart))
    c.start_replicas()
    written = yaml.safe_load((tmp_path / "lmcache.yaml").read_text())
    assert cpu_chart.lmcache_config["remote_url"].startswith("redis://lmi-lmi-server-valkey")
    assert written == {**cpu_chart.lmcache_config, "remote_url": REDIS_URL, "mp_host": "127.0.0.1"}
    sized = with_redis(Cluster(state_dir=tmp_path, chart=cpu_chart, l1_size_gb=3.0))
    assert sized.lmcache_config()["max_local_cpu_size"] == 3.0  # only when asked for


def test_replica_environment_and_redis_come_from_the_chart(tmp_path, spawned):
    settings = helm_chart.load(overrides={"hashSeed": "7", "sharedCache": {"internal": {"maxmemory": "300mb"}}})
    c = with_redis(Cluster(state_dir=tmp_path, chart=settings))
    c.start_replicas()
    assert spawned[0].env == {"PYTHONHASHSEED": "7"}
    assert props_file(tmp_path, 0)["option.lmcache_hash_seed"] == "7"
    assert c.redis_maxmemory == "300mb"
    assert Cluster(state_dir=tmp_path).redis_maxmemory == "1gb"  # values-cpu.yaml


def test_router_argv_is_the_charts_without_service_discovery(tmp_path, spawned, router_ready, cpu_chart):
    c = Cluster(state_dir=tmp_path, shared_cache=False, chart=cpu_chart)
    c.start_replicas()
    argv = c.start_router().argv
    assert not {"--service-discovery", "--selector", "--service-discovery-port", "--service-discovery-namespace"} & set(argv)
    assert not any(a.startswith("app.kubernetes.io/") for a in argv)
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == [s.url for s in c.servers]
    chart_args = cpu_chart.router_args
    for name in ("--policy", "--health-check-endpoint", "--health-check-interval-secs", "--health-check-timeout-secs",
                 "--health-failure-threshold", "--health-success-threshold", "--request-timeout-secs", "--log-level"):
        assert flag(argv, name) == flag(chart_args, name), name
    assert flag(argv, "--host") == flag(argv, "--prometheus-host") == "127.0.0.1"
    assert flag(argv, "--port") == str(c.router.port) and flag(argv, "--prometheus-port") != "29000"
    from vllm_router.launch_router import parse_router_args

    parsed = parse_router_args(argv[1:])  # vllm-router's own parser: exits on an unknown flag
    parsed._validate_router_args()
    assert parsed.service_discovery is False and parsed.worker_urls == [s.url for s in c.servers]


def test_a_values_override_changes_what_the_cluster_starts(tmp_path, spawned, router_ready):
    overrides = {
        "router": {"policy": "round_robin", "healthCheck": {"intervalSecs": 2, "failureThreshold": 1}, "extraArgs": ["--max-payload-size", "1000000"]},
        "servingProperties": {"option.cpu_kv_cache_space": "3", "option.dtype": "fp32"},
        "server": {"replicas": 3},
    }
    c = Cluster(state_dir=tmp_path, shared_cache=False, chart=helm_chart.load(overrides=overrides))
    assert c.replicas == 3 and c.policy == "round_robin"
    c.start_replicas()
    props = props_file(tmp_path, 2)
    assert props["option.cpu_kv_cache_space"] == "3" and props["option.dtype"] == "fp32"
    argv = c.start_router().argv
    assert flag(argv, "--policy") == "round_robin"
    assert flag(argv, "--health-check-interval-secs") == "2" and flag(argv, "--health-failure-threshold") == "1"
    assert argv[-2:] == ["--max-payload-size", "1000000"]
    assert flag(c.start_router("cache_aware").argv, "--policy") == "cache_aware"  # an explicit policy wins


def test_set_and_values_files_layer_like_helm(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("router:\n  policy: power_of_two\nservingProperties:\n  option.max_model_len: '2048'\n")
    settings = helm_chart.load(
        [helm_chart.CPU_VALUES, extra], helm_chart.parse_set(["router.healthCheck.intervalSecs=3", "servingProperties.option\\.dtype=fp32"])
    )
    assert settings.policy == "power_of_two"
    assert flag(settings.router_args, "--health-check-interval-secs") == "3"
    props = settings.serving_properties
    assert props["option.max_model_len"] == "2048" and props["option.dtype"] == "fp32"
    assert props["option.cpu_kv_cache_space"] == "2"  # values-cpu.yaml still underneath
    with pytest.raises(helm_chart.ChartError, match="schema"):
        helm_chart.load(overrides={"router": {"healthCheck": {"intervalSecs": 0}}})


def test_up_without_the_shared_cache_drops_the_redis_url(tmp_path, spawned, capsys):
    assert cluster_mod.main(["--state-dir", str(tmp_path), "up", "--no-shared-cache", "--no-router"]) == 0
    assert [p.name for p in spawned] == ["replica-0", "replica-1"]  # no redis
    props = props_file(tmp_path, 0)
    assert "option.sessions_redis_url" not in props
    assert not any(v.startswith("redis://") for v in props.values())
    assert "remote_url" not in yaml.safe_load((tmp_path / "lmcache.yaml").read_text())


def test_api_keys_from_values_are_served_and_an_existing_secret_is_refused(tmp_path, spawned):
    c = Cluster(state_dir=tmp_path, shared_cache=False, chart=helm_chart.load(overrides={"apiKeys": {"keys": ["secret-key-1"]}}))
    c.start_replicas()
    key_file = props_file(tmp_path, 0)["option.api_key_file"]
    assert key_file == str(tmp_path / "api-keys")
    assert (tmp_path / "api-keys").read_text().split() == ["secret-key-1"]
    assert (tmp_path / "api-keys").stat().st_mode & 0o077 == 0
    with pytest.raises(helm_chart.ChartError, match="existingSecret"):
        helm_chart.load(overrides={"apiKeys": {"existingSecret": "lmi-keys"}})


def test_pod_paths_and_secrets_stay_out_of_the_replica_environment():
    env, skipped = helm_chart.literal_env([
        {"name": "PYTHONHASHSEED", "value": "0"},
        {"name": "HF_HOME", "value": "/var/cache/huggingface"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
        {"name": "EXTRA", "value": "1"},
    ])
    assert env == {"PYTHONHASHSEED": "0", "EXTRA": "1"} and skipped == ["HF_HOME", "HF_TOKEN"]


def test_loopback_router_args_keep_extra_flags_after_discovery():
    args = ["--host", "0.0.0.0", "--port", "8080", "--service-discovery", "--selector", "a=b", "c=d",
            "--service-discovery-port", "8080", "--service-discovery-namespace", "llm", "--policy", "random",
            "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000", "--log-level", "info", "--x", "1"]
    out = helm_chart.loopback_router_args(args, ["http://127.0.0.1:1"], 5, 6)
    assert out == ["--worker-urls", "http://127.0.0.1:1", "--worker-startup-check-interval", "1", "--host", "127.0.0.1",
                   "--port", "5", "--policy", "random", "--prometheus-host", "127.0.0.1", "--prometheus-port", "6",
                   "--log-level", "info", "--x", "1"]


def test_demo_props_keep_the_benchmarks_on_the_demo_model(tmp_path, spawned):
    c = Cluster(state_dir=tmp_path, shared_cache=False, props=DEMO_PROPS)
    c.start_replicas()
    props = props_file(tmp_path, 0)
    assert props["option.model_id"] == "lmi-demo" and props["option.cpu_kv_cache_space"] == "1"
    assert props["option.enforce_eager"] == "true"  # still the chart's


# ---------------------------------------------------------------------------------------------
# An external shared tier (sharedCache.mode=external)
# ---------------------------------------------------------------------------------------------

EXTERNAL_URL = "redis://127.0.0.1:6390"
PASSWORD = "kv-tier-pw-0123456789abcdef"
CREDENTIALS = ("LMCACHE_RESP_PASSWORD", "LMCACHE_RESP_USERNAME")


def external_values(**auth) -> dict:
    return {"sharedCache": {"mode": "external", "external": {"url": EXTERNAL_URL, "auth": auth}}}


@pytest.fixture
def pinged(monkeypatch):
    """The PINGs of the external tier (none reaches a server); no credentials in the host's environment."""
    calls = []
    monkeypatch.setattr(cluster_mod, "ping_shared_tier", lambda url, username, password: calls.append((url, username, password)))
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    return calls


def files_holding(root, text: str) -> list:
    return [p for p in root.rglob("*") if p.is_file() and text in p.read_text(errors="replace")]


def test_an_external_tier_starts_no_redis_and_its_password_reaches_the_replicas_in_their_environment_only(tmp_path, spawned, pinged):
    settings = helm_chart.load(overrides=external_values(secretName="kv-auth"))
    assert settings.shared_tier_mode == "external" and settings.valkey_maxmemory is None
    assert settings.remote_url == EXTERNAL_URL and settings.shared_tier_secret_env == ["LMCACHE_RESP_PASSWORD"]
    c = Cluster(state_dir=tmp_path, chart=settings, shared_tier_password=PASSWORD)
    c.up(with_router=False)
    assert [p.name for p in spawned] == ["replica-0", "replica-1"] and c.redis is None  # no redis-server
    assert pinged == [(EXTERNAL_URL, None, PASSWORD)]  # checked before any replica started
    for i, proc in enumerate(spawned):
        assert proc.env == {"PYTHONHASHSEED": "0", "LMCACHE_RESP_PASSWORD": PASSWORD}
        assert props_file(tmp_path, i)["option.sessions_redis_url"] == EXTERNAL_URL  # the session store's credentials: the same variable
        assert not any(PASSWORD in arg for arg in proc.argv)
    assert yaml.safe_load((tmp_path / "lmcache.yaml").read_text())["remote_url"] == EXTERNAL_URL
    assert json.loads((tmp_path / "cluster.json").read_text())["shared_tier"] == {"mode": "external", "url": EXTERNAL_URL}
    assert not files_holding(tmp_path, PASSWORD) and PASSWORD not in repr(c)


def test_cluster_up_reads_the_external_tiers_password_from_an_owner_only_file_or_the_environment(tmp_path, spawned, pinged, monkeypatch, capsys):
    secret = tmp_path / "kv-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o644)
    chart_args = ["--no-router", "--set", "sharedCache.mode=external", "--set", f"sharedCache.external.url={EXTERNAL_URL}",
                  "--set", "sharedCache.external.auth.secretName=kv-auth"]

    def up(name: str, *extra: str) -> int:
        return cluster_mod.main(["--state-dir", str(tmp_path / name), "up", *chart_args, *extra])

    assert up("world-readable", "--shared-cache-password-file", str(secret)) == 2
    assert "chmod 600" in capsys.readouterr().err and not spawned
    assert up("none") == 2  # the chart names a Secret: no password is no cluster, not one without it
    assert "LMCACHE_RESP_PASSWORD" in capsys.readouterr().err and not spawned and not pinged
    secret.chmod(0o600)
    assert up("from-file", "--shared-cache-password-file", str(secret)) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err and "LMCACHE_RESP_PASSWORD" not in out.err  # handled, not left to the host
    monkeypatch.setenv("LMCACHE_RESP_PASSWORD", PASSWORD + "-env")
    assert up("from-env") == 0
    assert [p.env["LMCACHE_RESP_PASSWORD"] for p in spawned] == [PASSWORD] * 2 + [PASSWORD + "-env"] * 2
    assert [password for _, _, password in pinged] == [PASSWORD, PASSWORD + "-env"]
    assert not files_holding(tmp_path / "from-file", PASSWORD)
    secret.write_text("")
    with pytest.raises(ClusterError, match="empty"):
        cluster_mod.read_secret_file(secret)


def test_a_user_name_key_asks_for_the_user_name_too(tmp_path, spawned, pinged):
    settings = helm_chart.load(overrides=external_values(secretName="kv-auth", usernameKey="username"))
    assert settings.shared_tier_secret_env == ["LMCACHE_RESP_PASSWORD", "LMCACHE_RESP_USERNAME"]
    with pytest.raises(ClusterError, match="LMCACHE_RESP_USERNAME"):
        Cluster(state_dir=tmp_path, chart=settings, shared_tier_password=PASSWORD).up(with_router=False)
    assert not spawned and not pinged
    Cluster(state_dir=tmp_path, chart=settings, shared_tier_password=PASSWORD, shared_tier_username="lmi").up(with_router=False)
    assert pinged == [(EXTERNAL_URL, "lmi", PASSWORD)]
    assert spawned[0].env == {"PYTHONHASHSEED": "0", "LMCACHE_RESP_PASSWORD": PASSWORD, "LMCACHE_RESP_USERNAME": "lmi"}


def test_what_a_loopback_cluster_cannot_do_with_the_shared_tier_is_refused(tmp_path, spawned, pinged):
    with pytest.raises(helm_chart.ChartError, match="TLS sidecar"):
        helm_chart.load(overrides={"sharedCache": {"mode": "external", "external": {"url": "rediss://cache.internal:6379"}}})
    # a password the chart would not give its replicas: its internal Valkey has none, or no Secret is named
    for settings in (helm_chart.load(), helm_chart.load(overrides=external_values())):
        with pytest.raises(ClusterError, match="sharedCache.external.auth.secretName"):
            with_redis(Cluster(state_dir=tmp_path, chart=settings, shared_tier_password=PASSWORD)).start_replicas()
    assert not spawned
    # without the shared tier the external one is neither pinged nor asked for its password
    c = Cluster(state_dir=tmp_path, shared_cache=False, chart=helm_chart.load(overrides=external_values(secretName="kv-auth")))
    c.up(with_router=False)
    assert not pinged and spawned[0].env == {"PYTHONHASHSEED": "0"}
    assert "option.sessions_redis_url" not in props_file(tmp_path, 0)


def test_an_external_tier_that_does_not_answer_stops_up_before_anything_starts():
    from lmi_server.kvcache.resolve import free_local_port

    url = f"redis://127.0.0.1:{free_local_port()}"  # nothing listens there
    with pytest.raises(ClusterError, match=f"{url} does not answer PING"):
        cluster_mod.ping_shared_tier(url, None, PASSWORD, timeout=2)
