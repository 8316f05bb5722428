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
    low, high = _range_with_free_ports(3)  # under 4 ports: all of it is "own"
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


def test_the_range_is_split_so_no_two_takers_race():
    p = safe_ports.parts((10000, 10999))
    assert p == {"own": (10000, 10249), "vllm": (10250, 10499), "kernel": (10500, 10999)}
    assert safe_ports.parts((7000, 7002)) == {"own": (7000, 7002), "vllm": (7000, 7002), "kernel": (7000, 7002)}


PROBE = """
import socket, sys
out = []
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0)); s.listen(); out.append(s.getsockname()[1])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0)); out.append(u.getsockname()[1])
e = socket.socket(); e.bind(("127.0.0.1", int(sys.argv[1]))); out.append(e.getsockname()[1])
print(" ".join(map(str, out)))
"""


def test_the_bind_shim_takes_port_zero_binds_into_the_range(tmp_path):
    """A real child process with the shim preloaded: TCP binds to port 0 (IPv4, IPv6) land in the
    range; UDP and explicit ports are left alone."""
    import subprocess
    import sys

    from lmi_server import bind_shim

    lib, how = bind_shim.build(tmp_path)
    if lib is None:
        pytest.skip(how)
    low, high = _range_with_free_ports()
    explicit = safe_ports.free_local_ports(1, env={})[0]
    env = {"LD_PRELOAD": str(lib), bind_shim.RANGE_ENV: f"{low}-{high}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(explicit)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    v4, v6, udp, fixed = map(int, out.stdout.split())
    assert low <= v4 <= high and low <= v6 <= high
    assert fixed == explicit and not (low <= udp <= high and udp == v4)
    again, how_again = bind_shim.build(tmp_path)
    assert again == lib and "built before" in how_again


def test_engine_environment_preloads_the_shim_after_the_users_preload(tmp_path, monkeypatch):
    from lmi_server import bind_shim

    monkeypatch.setattr(bind_shim, "_cache_dir", lambda: tmp_path)
    low, high = _range_with_free_ports()
    monkeypatch.setenv(safe_ports.VARIABLE, f"{low}-{high}")
    monkeypatch.setenv("LMI_CPU_PRELOAD", "0")
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    notes: list[str] = []
    cfg = build_serving_config({}, model_dir(tmp_path))
    env = engine.engine_environment(cfg, gpus=0, notes=notes)
    if "LD_PRELOAD" not in env:
        pytest.skip(notes[-1])
    first, shim = env["LD_PRELOAD"].split(":")
    assert first == "/opt/mine.so" and "lmi_bind_range_" in shim
    kernel_low, kernel_high = safe_ports.parts((low, high))["kernel"]
    assert env[bind_shim.RANGE_ENV] == f"{kernel_low}-{kernel_high}"
    assert any("kernel would pick" in n for n in notes)
