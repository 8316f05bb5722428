import json
import os
from pathlib import Path

import pytest

from lmi_server.kvcache.host import GIB, HostFacts, GPUInfo
from lmi_server.kvcache.lmcache import plan_from_config_file
from lmi_server.kvcache.lmcache_file import load_lmcache_config, parse_lmcache_config
from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.plan import KVCacheConfigError
from lmi_server.kvcache.resolve import build_kvcache_plan, free_local_ports

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "lmcache_configs"
CPU_HOST = HostFacts(available_ram_bytes=20 * GIB, total_ram_bytes=24 * GIB)
GPU_HOST = HostFacts(available_ram_bytes=900 * GIB, total_ram_bytes=1024 * GIB, gpu=GPUInfo(8, 80 * GIB))


def file_plan(path, *, platform="cpu", mode="auto", check_disk=False, **kwargs):
    return plan_from_config_file(
        path, mode=mode, platform=platform, port=5555, metrics_port=5556, python="python", check_disk=check_disk, **kwargs
    )


def write(tmp_path, text):
    p = tmp_path / "lmcache.yaml"
    p.write_text(text)
    return p


def test_cpu_only_file_gives_the_verified_recipe():
    p = file_plan(CONFIGS / "cpu.yaml")
    assert p.server_argv == [
        "python", "-m", "lmcache.v1.multiprocess.server",
        "--host", "localhost", "--port", "5555", "--chunk-size", "256",
        "--l1-size-gb", "20", "--eviction-policy", "LRU",
        "--supported-transfer-mode", "engine_driven", "--prometheus-port", "5556",
    ]
    assert p.kv_transfer_config == {
        "kv_connector": "GuardedLMCacheMPConnector",
        "kv_role": "kv_both",
        # a KV load that fails recomputes those tokens instead of failing the request
        "kv_load_failure_policy": "recompute",
        "kv_connector_module_path": "lmi_server.kvcache.connector",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": 5555,
            # no /dev/shm room known and no model size: pickled hits, the cautious RPC timeout
            "lmcache.mp.heartbeat_interval": 1.0, "lmcache.mp.mq_timeout": 30.0,
        },
    }
    assert p.env == {"PYTHONHASHSEED": "0", "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}
    assert p.metrics_url == "http://127.0.0.1:5556/metrics"


def test_cuda_uses_lmcache_driven():
    p = file_plan(CONFIGS / "cpu.yaml", platform="cuda", shm_free_bytes=100 * GIB)
    assert p.server_argv[p.server_argv.index("--supported-transfer-mode") + 1] == "lmcache_driven"
    # LMCache's own connector (keys in the KV namespace) and timing: transfers do not go through
    # the engine_driven RPCs
    assert p.kv_transfer_config["kv_connector"] == "NamespacedLMCacheMPConnector"
    assert p.kv_transfer_config["kv_connector_module_path"] == "lmi_server.kvcache.namespaced_connector"
    assert p.kv_transfer_config["kv_load_failure_policy"] == "recompute"
    assert set(p.kv_transfer_config["kv_connector_extra_config"]) == {"lmcache.mp.host", "lmcache.mp.port"}
    assert "--shm-name" not in p.server_argv


def extra(p):
    return p.kv_transfer_config["kv_connector_extra_config"]


def test_cpu_tier_goes_to_shm_by_default_when_dev_shm_holds_it(tmp_path):
    p = file_plan(write(tmp_path, "max_local_cpu_size: 2\n"), shm_free_bytes=3 * GIB, max_transfer_bytes=10 * GIB)
    assert p.tiers.shm
    assert p.server_argv[p.server_argv.index("--shm-name") + 1].startswith("lmcache_mp_5555_")
    assert any("/dev/shm" in r and "mp_shm default" in r for r in p.reasons)
    assert not p.warnings
    # the RPCs carry slot numbers only: the short timeout, whatever the model's size
    assert extra(p)["lmcache.mp.mq_timeout"] == 2.0
    assert extra(p)["lmcache.mp.heartbeat_interval"] == 1.0


def test_small_dev_shm_falls_back_to_pickle_with_a_warning(tmp_path):
    p = file_plan(write(tmp_path, "max_local_cpu_size: 2\n"), shm_free_bytes=64 * 2**20, max_transfer_bytes=400_000_000)
    assert not p.tiers.shm and "--shm-name" not in p.server_argv
    assert any("--shm-size" in w and "0.1 GiB free" in w for w in p.warnings)
    # pickled hits: the timeout covers the longest sequence at 50 MB/s (400 MB -> 8 s)
    assert extra(p)["lmcache.mp.mq_timeout"] == 8.0


def test_mp_shm_false_and_true_are_obeyed(tmp_path):
    off = file_plan(write(tmp_path, "max_local_cpu_size: 2\nmp_shm: false\n"), shm_free_bytes=100 * GIB, max_transfer_bytes=1000)
    assert not off.tiers.shm and not off.warnings
    assert extra(off)["lmcache.mp.mq_timeout"] == 2.0  # tiny model: the floor
    forced = file_plan(write(tmp_path, "max_local_cpu_size: 2\nmp_shm: true\n"), shm_free_bytes=GIB)
    assert not forced.tiers.shm
    assert any("mp_shm: true but /dev/shm has 1.0 GiB free" in w for w in forced.warnings)


def test_nvme_file_translates_to_fs_adapter():
    p = file_plan(CONFIGS / "cpu_nvme.yaml")
    spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
    assert spec == {"type": "fs", "base_path": "/mnt/nvme/lmcache", "use_odirect": True}
    assert p.tiers.disk.size_bytes == 200 * GIB


def test_redis_file_translates_to_resp_adapter():
    p = file_plan(CONFIGS / "cpu_redis.yaml")
    spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
    assert spec == {"type": "resp", "host": "lmcache-redis", "port": 6379}


def test_redis_password_goes_by_environment_not_argv(tmp_path):
    p = file_plan(write(tmp_path, "remote_url: redis://user:s3cret@r:6380\n"))
    spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
    assert spec == {"type": "resp", "host": "r", "port": 6380}
    assert "s3cret" not in " ".join(p.server_argv)
    assert p.secret_env == {"LMCACHE_RESP_USERNAME": "user", "LMCACHE_RESP_PASSWORD": "s3cret"}
    assert "s3cret" not in p.to_json() and "s3cret" not in json.dumps(p.env) and "s3cret" not in repr(p)


def test_disk_and_remote_both(tmp_path):
    p = file_plan(write(tmp_path, "local_disk: /data/kv\nremote_url: valkey://v:6379\n"))
    specs = [json.loads(p.server_argv[i + 1]) for i, a in enumerate(p.server_argv) if a == "--l2-adapter"]
    assert [s["type"] for s in specs] == ["fs", "resp"]
    assert specs[0]["use_odirect"] is False


def lmcache_server_reads(argv: list[str]):
    """The storage settings LMCache's cache server makes of our command line (its own parser)."""
    import argparse

    from lmcache.v1.distributed.config import parse_args_to_config
    from lmcache.v1.multiprocess import server

    parser = argparse.ArgumentParser()
    for add in (server.add_mp_server_args, server.add_storage_manager_args, server.add_observability_args,
                server.add_coordinator_args):
        add(parser)
    return parse_args_to_config(parser.parse_args(argv[argv.index(server.__name__) + 1:]))


def test_chunks_read_back_from_disk_or_redis_stay_in_the_cpu_tier(tmp_path):
    """With an L2 tier the cache server keeps what it read back (LMCache's "retain" prefetch
    policy): without it a second hit on a document that came from disk reads the disk again."""
    from lmcache.v1.distributed.storage_controllers.prefetch_policy import get_registered_prefetch_policies

    with_l2 = file_plan(write(tmp_path, "local_disk: /data/kv\n"))
    argv = with_l2.server_argv
    assert argv[argv.index("--l2-prefetch-policy") + 1] == "retain"
    assert "retain" in get_registered_prefetch_policies()
    assert lmcache_server_reads(argv).prefetch_policy == "retain"
    cpu_only = file_plan(write(tmp_path, "max_local_cpu_size: 2\n"))
    assert "--l2-prefetch-policy" not in cpu_only.server_argv


def test_mp_port_key_sets_the_port(tmp_path):
    p = file_plan(write(tmp_path, "mp_port: 6000\nmax_local_cpu_size: 0.5\n"))
    assert p.tiers.port == 6000
    assert p.kv_transfer_config["kv_connector_extra_config"]["lmcache.mp.port"] == 6000
    assert p.server_argv[p.server_argv.index("--l1-size-gb") + 1] == "0.5"


def test_default_ports_are_picked_together_and_never_equal(monkeypatch, tmp_path):
    """Picking one port at a time can return the same port twice (the OS reuses a closed socket's port)."""
    ports = free_local_ports(40, taken=(6000,))
    assert len(set(ports)) == 40 and 6000 not in ports
    calls = []

    def pick(count, taken=()):
        calls.append((count, taken))
        return [7001, 7002][:count]

    monkeypatch.setattr("lmi_server.kvcache.resolve.free_local_ports", pick)
    config = write(tmp_path, "max_local_cpu_size: 0.5\n")
    plan = build_kvcache_plan(LMCacheOptions(lmcache_config_file=config), host=CPU_HOST, check_disk=False)
    assert calls == [(2, ())] and (plan.tiers.port, plan.tiers.metrics_port) == (7001, 7002)
    calls.clear()
    plan = build_kvcache_plan(LMCacheOptions(lmcache_config_file=config, lmcache_port=7002), host=CPU_HOST, check_disk=False)
    assert calls == [(1, (7002,))] and (plan.tiers.port, plan.tiers.metrics_port) == (7002, 7001)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("chunk_sise: 256\n", "unknown key `chunk_sise`; did you mean `chunk_size`?"),
        ("extra_config:\n  use_odirekt: true\n", "did you mean `use_odirect`?"),
        ("enable_pd: true\n", "`enable_pd` is an LMCache key that the MP server translation does not support"),
        ("max_local_cpu_size: -1\n", "`max_local_cpu_size`"),
        ("chunk_size: many\n", "`chunk_size`"),
        ("cache_policy: FIFO\n", "`cache_policy`"),
        ("remote_url: rediss://h:1\n", "`remote_url`"),
        ("remote_url: redis://hostonly\n", "needs host and port"),
        ("remote_serde: cachegen\n", "`remote_serde`"),
        ("local_disk: /a,/b\n", "one local disk path"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, needle):
    with pytest.raises(KVCacheConfigError) as e:
        load_lmcache_config(write(tmp_path, text))
    assert needle in str(e.value)


def test_relative_local_disk_is_rejected(tmp_path):
    with pytest.raises(KVCacheConfigError, match="absolute path"):
        file_plan(write(tmp_path, "local_disk: data/kv\n"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(KVCacheConfigError, match="cannot read"):
        load_lmcache_config(tmp_path / "nope.yaml")


def test_empty_file_means_lmcache_defaults():
    cfg = parse_lmcache_config(None)
    assert (cfg.chunk_size, cfg.max_local_cpu_size, cfg.cache_policy) == (256, 5.0, "LRU")


def test_inprocess_needs_gpu_and_points_lmcache_at_the_file():
    with pytest.raises(KVCacheConfigError, match="needs a GPU"):
        file_plan(CONFIGS / "cpu.yaml", mode="inprocess")
    p = file_plan(CONFIGS / "cpu.yaml", mode="inprocess", platform="cuda")
    assert p.kv_transfer_config == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
    assert p.env["LMCACHE_CONFIG_FILE"] == str((CONFIGS / "cpu.yaml").resolve())
    assert p.server_argv is None


def _refuse_odirect(monkeypatch):
    """tmpfs accepts O_DIRECT since Linux 6.6 (this machine runs 6.18), so refusal is simulated
    the way older tmpfs and some network filesystems answer: EINVAL on open(O_DIRECT)."""
    import errno

    from lmi_server.kvcache import host

    real_open = os.open

    def fake_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(host.os, "open", fake_open)


def test_local_disk_checks_run_and_odirect_falls_back_when_refused(tmp_path, monkeypatch):
    _refuse_odirect(monkeypatch)
    shm_dir = Path("/dev/shm") / f"lmi-test-{os.getpid()}"
    try:
        p = file_plan(write(tmp_path, f"local_disk: file://{shm_dir}/\nextra_config:\n  use_odirect: true\n"), check_disk=True)
        assert shm_dir.is_dir()  # created
        spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
        assert spec["use_odirect"] is False
        assert any("O_DIRECT refused" in w and "tmpfs" in w for w in p.warnings)
    finally:
        if shm_dir.exists():
            shm_dir.rmdir()


def test_odirect_kept_where_the_filesystem_accepts_it(tmp_path):
    from lmi_server.kvcache.host import odirect_supported

    p = file_plan(write(tmp_path, f"local_disk: {tmp_path}/kv\nextra_config:\n  use_odirect: true\n"), check_disk=True)
    spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
    assert spec["use_odirect"] is odirect_supported(tmp_path / "kv")
    assert list((tmp_path / "kv").iterdir()) == []  # probes cleaned up


def test_uncreatable_disk_dir_is_a_startup_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(KVCacheConfigError, match="local_disk: cannot create"):
        file_plan(write(tmp_path, f"local_disk: {blocker}/sub\n"), check_disk=True)


def test_resolve_picks_file_relative_to_model_dir_and_free_ports(tmp_path):
    (tmp_path / "lmcache.yaml").write_text("max_local_cpu_size: 1\n")
    p = build_kvcache_plan(LMCacheOptions(lmcache_config_file=Path("lmcache.yaml")), host=CPU_HOST, model_dir=tmp_path)
    assert p.mode == "mp" and p.tiers.port != p.tiers.metrics_port
    assert p.tiers.port > 0


def test_resolve_rejects_file_plus_auto_and_reports_off():
    with pytest.raises(KVCacheConfigError, match="exclude each other"):
        build_kvcache_plan(LMCacheOptions(lmcache_config_file=Path("/x.yaml"), lmcache_auto_config=True), host=CPU_HOST)
    off = build_kvcache_plan(LMCacheOptions(), host=CPU_HOST)
    assert off.mode is None and off.source == "none" and off.env["LMCACHE_TRACK_USAGE"] == "false"


def test_telemetry_can_be_allowed():
    off = build_kvcache_plan(LMCacheOptions(lmcache_telemetry=True, lmcache_hash_seed="42"), host=CPU_HOST)
    assert off.env == {"PYTHONHASHSEED": "42"}


def test_hash_seed_random_is_refused():
    with pytest.raises(ValueError):
        LMCacheOptions(lmcache_hash_seed="random")


def test_cpu_tier_must_fit_ram(tmp_path):
    small = HostFacts(available_ram_bytes=16 * GIB, total_ram_bytes=24 * GIB)
    with pytest.raises(KVCacheConfigError, match="exceeds the available RAM"):
        build_kvcache_plan(LMCacheOptions(lmcache_config_file=CONFIGS / "cpu.yaml"), host=small)
    (tmp_path / "l.yaml").write_text("max_local_cpu_size: 14\n")
    p = build_kvcache_plan(LMCacheOptions(lmcache_config_file=tmp_path / "l.yaml"), host=small)
    assert any("less than 20 %" in w for w in p.warnings)
