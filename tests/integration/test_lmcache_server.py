"""The real LMCache MP server under the supervisor: ready, restart after kill, clean stop.

Starts `python -m lmcache.v1.multiprocess.server` (about 7 s per start on 2 cores); no engine.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from lmi_server.kvcache.host import probe_host
from lmi_server.kvcache.mp_server import probe_mp_server, shm_segments_used_by, supervisor_for_plan
from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.resolve import build_kvcache_plan
from lmi_server.kvcache.stats import read_lmcache_stats

SHM = Path("/dev/shm")


def group_alive(pgid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().split(")")[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(d))
    return pids


def wait_until(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.25)
    return False


@pytest.fixture
def plan(tmp_path):
    cfg = tmp_path / "lmcache.yaml"
    cfg.write_text(
        "chunk_size: 256\nmax_local_cpu_size: 0.25\n"
        f"local_disk: file://{tmp_path}/kv/\nmax_local_disk_size: 1\nextra_config:\n  use_odirect: true\n"
    )
    return build_kvcache_plan(LMCacheOptions(lmcache_config_file=cfg), host=probe_host())


def test_real_server_ready_restart_and_clean_stop(plan, tmp_path):
    shm_before = set(os.listdir(SHM))
    sup = supervisor_for_plan(plan, max_restarts=2, ready_timeout_s=120, poll_interval_s=0.25, stop_timeout_s=20)
    sup.start()
    pids = []
    used_shm: set[str] = set()
    try:
        pids.append(sup.pid)
        used_shm |= shm_segments_used_by(sup.pid)
        assert sup.alive and sup.port == plan.tiers.port
        assert probe_mp_server("localhost", sup.port)  # a real RPC: get_chunk_size
        stats = read_lmcache_stats(plan.metrics_url)  # the server's own Prometheus endpoint
        assert stats["lookup_hit_tokens"] == 0 and "fs" in stats["l2_bytes_by_adapter"]
        assert (tmp_path / "kv").is_dir()

        os.killpg(sup.pid, signal.SIGKILL)
        assert wait_until(lambda: sup.restarts == 1 and sup.alive and sup.pid != pids[0], 60)
        pids.append(sup.pid)
        assert wait_until(lambda: probe_mp_server("localhost", sup.port, timeout_s=1.0), 90)
        used_shm |= shm_segments_used_by(sup.pid)
        assert group_alive(pids[0]) == []
    finally:
        sup.stop()
    assert not sup.alive
    for pid in pids:
        assert group_alive(pid) == [], f"orphan processes of group {pid}"
    assert not any(f"--port {plan.tiers.port}" in _cmdline(p) for p in _all_pids()), "server still running"
    # Other processes on the machine (e.g. a vLLM engine) may create their own segments meanwhile,
    # so look only at what the server used and at LMCache-named segments.
    left = set(os.listdir(SHM))
    assert used_shm & left == set(), "leftover /dev/shm segment of the server"
    assert {n for n in left - shm_before if n.startswith("lmcache")} == set()


def _all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
