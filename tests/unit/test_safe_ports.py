"""SAGEMAKER_SAFE_PORT_RANGE: every extra listener's port comes from it when it is set (the LMCache
server's two ports from its lower half, vLLM's search from VLLM_PORT in its upper half); a
malformed range is a start-up error naming the variable; unset, the OS picks as before."""

from __future__ import annotations

import socket

import pytest

from lmi_server import engine, safe_ports
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.kvcache.resolve import build_kvcache_plan
from tests.unit.kvcache.test_mounted_cache_dir import model_dir


def _range_with_free_ports(width: int = 40) -> tuple[int, int]:
    """A range of `width` ports around one the OS says is free now (tests share the machine)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    low = max(1024, min(port, 65535 - width))
    return low, low + width - 1


@pytest.mark.parametrize("raw, expected", [
    ("10000-10999", (10000, 10999)), (" 20000-20000 ", (20000, 20000)), ("", None),
])
def test_range_is_parsed(raw, expected):
    assert safe_ports.safe_port_range({safe_ports.VARIABLE: raw}) == expected
    assert safe_ports.safe_port_range({}) is None


@pytest.mark.parametrize("raw", ["10000", "10000:10999", "a-b", "10999-10000", "0-10", "60000-70000", "-5"])
def test_a_malformed_range_names_the_variable(raw):
    with pytest.raises(safe_ports.PortRangeError, match="SAGEMAKER_SAFE_PORT_RANGE"):
        safe_ports.safe_port_range({safe_ports.VARIABLE: raw})


def test_own_ports_come_from_the_lower_half_and_vllm_from_the_upper():
    low, high = _range_with_free_ports()
    env = {safe_ports.VARIABLE: f"{low}-{high}"}
    own_low, own_high = safe_ports.own_part((low, high))
    ports = safe_ports.free_local_ports(2, env=env)
    assert len(set(ports)) == 2 and all(own_low <= p <= own_high for p in ports)
    vllm_port = int(safe_ports.vllm_env(env)["VLLM_PORT"])
    assert own_high < vllm_port <= high
    assert safe_ports.vllm_env({**env, "VLLM_PORT": "12345"}) == {}  # the user's own wins
    assert safe_ports.vllm_env({}) == {}


def test_a_busy_port_is_skipped_and_a_full_range_is_an_error():
    low, high = _range_with_free_ports(4)
    env = {safe_ports.VARIABLE: f"{low}-{high}"}
    with socket.socket() as busy:
        busy.bind(("", low))
        busy.listen()
        assert low not in safe_ports.free_local_ports(1, env=env)
        with pytest.raises(safe_ports.PortRangeError, match="fewer than 3 free ports"):
            safe_ports.free_local_ports(3, env=env)


def test_unset_the_os_picks():
    ports = safe_ports.free_local_ports(3, env={})
    assert len(set(ports)) == 3


def test_the_lmcache_servers_ports_come_from_the_range(tmp_path, monkeypatch):
    low, high = _range_with_free_ports()
    monkeypatch.setenv(safe_ports.VARIABLE, f"{low}-{high}")
    d = model_dir(tmp_path)
    (d / "lmcache.yaml").write_text("chunk_size: 256\nmax_local_cpu_size: 1\n")
    cfg = build_serving_config({"option.lmcache_config_file": "lmcache.yaml", "option.max_model_len": "1024"}, d)
    from lmi_server.kvcache.host import probe_host

    plan = build_kvcache_plan(cfg.lmcache, host=probe_host(model_dir=d, cache_dir=None), model_dir=d)
    own_low, own_high = safe_ports.own_part((low, high))
    assert own_low <= plan.tiers.port <= own_high and own_low <= plan.tiers.metrics_port <= own_high


def test_vllm_port_is_in_the_engine_environment(tmp_path, monkeypatch):
    low, high = _range_with_free_ports()
    monkeypatch.setenv(safe_ports.VARIABLE, f"{low}-{high}")
    monkeypatch.delenv("VLLM_PORT", raising=False)
    cfg = build_serving_config({}, model_dir(tmp_path))
    assert low <= int(engine.engine_environment(cfg, gpus=0)["VLLM_PORT"]) <= high
    monkeypatch.setenv(safe_ports.VARIABLE, "nonsense")
    with pytest.raises(ConfigError, match="SAGEMAKER_SAFE_PORT_RANGE"):
        engine.engine_environment(cfg, gpus=0)
