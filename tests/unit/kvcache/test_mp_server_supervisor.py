"""Supervisor behaviour with a stand-in child process (no LMCache server, fast)."""

import asyncio
import os
import sys
import time

import pytest

from lmi_server.kvcache.mp_server import MPServerError, MPServerSupervisor, supervisor_for_plan
from lmi_server.kvcache.plan import KVCachePlan

pytestmark = pytest.mark.unit

# A "server" that also starts a grandchild, to check that the whole process group goes.
SLEEPER = [
    sys.executable, "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "print('up', flush=True); time.sleep(300)",
]


def always_ready(host, port):
    return True


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[1].split()[0] != "Z"


def group_pids(pgid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().split(")")[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d))
            except OSError:
                pass
    return out


def wait_until(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_start_restart_stop_leaves_no_process():
    sup = MPServerSupervisor(SLEEPER, {"PYTHONHASHSEED": "0"}, port=1, probe=always_ready, poll_interval_s=0.1, stop_timeout_s=5)
    sup.start()
    try:
        first = sup.pid
        assert sup.alive and sup.restarts == 0 and sup.port == 1
        assert wait_until(lambda: len(group_pids(first)) == 2)
        os.kill(first, 9)
        assert wait_until(lambda: sup.restarts == 1 and sup.alive and sup.pid != first)
        assert wait_until(lambda: group_pids(first) == [])  # the orphaned grandchild was killed too
    finally:
        second = sup.pid
        sup.stop()
    assert not sup.alive
    assert group_pids(second) == []


def test_gives_up_after_max_restarts():
    sup = MPServerSupervisor(SLEEPER, {}, port=1, probe=always_ready, poll_interval_s=0.1, max_restarts=0)
    sup.start()
    try:
        os.kill(sup.pid, 9)
        assert wait_until(lambda: sup.failed)
        assert sup.restarts == 0 and not sup.alive
    finally:
        sup.stop()


def test_early_exit_reports_the_log_tail():
    argv = [sys.executable, "-c", "import sys; print('bad flag --l1-size-gb'); sys.exit(2)"]
    sup = MPServerSupervisor(argv, {}, port=1, probe=lambda h, p: False, poll_interval_s=0.1)
    with pytest.raises(MPServerError, match="exited with code 2") as e:
        sup.start()
    assert "bad flag" in str(e.value)


def test_never_ready_times_out_and_kills_the_child():
    sup = MPServerSupervisor(SLEEPER, {}, port=1, probe=lambda h, p: False, poll_interval_s=0.1, ready_timeout_s=1.5, stop_timeout_s=3)
    with pytest.raises(MPServerError, match="did not answer"):
        sup.start()
    pid = sup.pid
    assert wait_until(lambda: not pid_alive(pid) and group_pids(pid) == [])


def test_sigterm_ignored_then_sigkill():
    argv = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('x', flush=True); time.sleep(300)"]
    sup = MPServerSupervisor(argv, {}, port=1, probe=always_ready, poll_interval_s=0.1, stop_timeout_s=1)
    sup.start()
    pid = sup.pid
    t = time.monotonic()
    sup.stop()
    assert time.monotonic() - t < 5
    assert not pid_alive(pid)


def test_env_reaches_the_child(tmp_path):
    out = tmp_path / "env"
    argv = [sys.executable, "-c", f"import os, time; open({str(out)!r}, 'w').write(os.environ['PYTHONHASHSEED'] + os.environ['LMCACHE_TRACK_USAGE']); time.sleep(300)"]
    sup = MPServerSupervisor(argv, {"PYTHONHASHSEED": "7", "LMCACHE_TRACK_USAGE": "false"}, port=1, probe=always_ready, poll_interval_s=0.1)
    sup.start()
    try:
        assert wait_until(lambda: out.exists() and out.read_text() == "7false")
    finally:
        sup.stop()


def test_works_from_asyncio():
    async def run():
        sup = MPServerSupervisor(SLEEPER, {}, port=1, probe=always_ready, poll_interval_s=0.1)
        await sup.start_async()
        alive = sup.alive
        await sup.stop_async()
        return alive, sup.alive

    assert asyncio.run(run()) == (True, False)


def test_supervisor_for_plan_needs_mp():
    plan = KVCachePlan(mode=None, kv_transfer_config=None, server_argv=None, env={}, reasons=[], source="none")
    with pytest.raises(MPServerError, match="no MP server"):
        supervisor_for_plan(plan)


def test_restarts_are_counted_in_a_sliding_window():
    sup = MPServerSupervisor(SLEEPER, {}, port=1, probe=always_ready, poll_interval_s=0.05, max_restarts=2, restart_window_s=8.0, stop_timeout_s=3)
    sup.start()
    try:
        for n in (1, 2):
            pid = sup.pid
            os.kill(pid, 9)
            assert wait_until(lambda: sup.restarts == n and sup.alive and sup.pid != pid)
        os.kill(sup.pid, 9)  # a third death inside the window: no restart now, degraded meanwhile
        assert wait_until(lambda: sup.failed and not sup.alive)
        assert sup.restarts == 2 and "down" in sup.degraded
        # Once the oldest restart has left the window the server comes back (no permanent give-up).
        assert wait_until(lambda: sup.restarts == 3 and sup.alive, timeout=30)
        assert sup.degraded is None and not sup.failed
    finally:
        sup.stop()


def test_child_dies_with_its_parent_even_on_sigkill(tmp_path):
    import subprocess

    script = (
        "import os, sys, time\n"
        "from lmi_server.kvcache.mp_server import MPServerSupervisor\n"
        f"sup = MPServerSupervisor({SLEEPER!r}, {{}}, port=1, probe=lambda h, p: True, poll_interval_s=0.1)\n"
        "sup.start()\n"
        "print(sup.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=str(tmp_path),
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.kill()  # no clean-up code of the parent runs
    parent.wait()
    assert wait_until(lambda: not pid_alive(child) and group_pids(child) == [], timeout=15)


def test_secret_env_reaches_the_child_but_not_its_command_line(tmp_path):
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"]
    sup = MPServerSupervisor(argv, {}, port=1, probe=always_ready, poll_interval_s=0.1, secret_env={"LMCACHE_RESP_PASSWORD": "pw-s3cret-123"})
    sup.start()
    try:
        with open(f"/proc/{sup.pid}/cmdline", "rb") as f:
            assert b"pw-s3cret-123" not in f.read()
        with open(f"/proc/{sup.pid}/environ", "rb") as f:
            assert b"LMCACHE_RESP_PASSWORD=pw-s3cret-123" in f.read().split(b"\0")
    finally:
        sup.stop()


def test_shm_sweep_removes_only_this_instances_segments(tmp_path, monkeypatch):
    from lmi_server.kvcache import mp_server

    monkeypatch.setattr(mp_server, "SHM_DIR", tmp_path)
    (tmp_path / "lmcache_mp_9_old").write_bytes(b"x")  # another server's, present before
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)", "--shm-name", "lmcache_mp_1_42"]
    sup = MPServerSupervisor(argv, {}, port=1, probe=always_ready, poll_interval_s=0.1)
    sup.start()
    (tmp_path / "lmcache_mp_1_42").write_bytes(b"x")  # ours (named on our command line)
    (tmp_path / "lmcache_l1_pool_other").write_bytes(b"x")  # a neighbour's, created meanwhile
    sup.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lmcache_l1_pool_other", "lmcache_mp_9_old"]
