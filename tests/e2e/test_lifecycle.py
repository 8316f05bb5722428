"""Process lifecycle: /ping states, engine death, SIGTERM with a request in flight, no orphans."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil

from tests.e2e.conftest import BASE_PROPS
from tests.support.server import ServerProcess, server_env, write_properties


def _start(tmp_path) -> ServerProcess:
    write_properties(tmp_path, BASE_PROPS)
    return ServerProcess(tmp_path, tmp_path / "server.log", env=server_env()).start()


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_sigterm_lets_in_flight_request_finish_and_leaves_no_process(tmp_path):
    shm_before = _shm()
    server = _start(tmp_path)
    try:
        server.wait_ready()
        assert 503 in server.ping_history
        children = server.descendants()
        assert children, "the engine runs in child processes"
        result: dict = {}

        def slow_request():
            r = httpx.post(
                server.base_url + "/v1/completions",
                json={"model": "lmi-demo", "prompt": "import os\n", "max_tokens": 300, "ignore_eos": True},
                timeout=120,
            )
            result["status"], result["body"] = r.status_code, r.json()

        worker = threading.Thread(target=slow_request)
        worker.start()
        time.sleep(1.0)
        server.proc.send_signal(signal.SIGTERM)
        worker.join(120)
        assert result.get("status") == 200, result
        assert result["body"]["usage"]["completion_tokens"] == 300
        # uvicorn re-raises the signal after its graceful shutdown: -SIGTERM is a clean exit.
        assert server.proc.wait(90) in (0, -signal.SIGTERM)
        log = server.log_path.read_text(errors="replace")
        assert "shutting down: stopping the engine" in log
        assert "Traceback" not in log, server.log_tail()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children), f"orphans: {_alive(children)}"
        ours = {name for name in _shm() - shm_before if name.startswith(("psm_", "lmcache"))}
        assert not ours, f"shared-memory segments left behind: {ours}"
    finally:
        server.stop()


def test_ping_turns_503_when_the_engine_dies(tmp_path):
    server = _start(tmp_path)
    try:
        server.wait_ready()
        engine_cores = [p for p in server.descendants() if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
        assert engine_cores, [p.cmdline() for p in server.descendants()]
        for p in engine_cores:
            p.kill()
        deadline = time.monotonic() + 60
        status = 200
        while time.monotonic() < deadline:
            # A request makes the dead engine visible even before the monitor notices.
            httpx.post(server.base_url + "/invocations", json={"inputs": "x", "parameters": {"max_new_tokens": 1}}, timeout=30)
            status = httpx.get(server.base_url + "/ping", timeout=5).status_code
            if status == 503:
                break
            time.sleep(1)
        assert status == 503
        r = httpx.post(server.base_url + "/invocations", json={"inputs": "x"}, timeout=30)
        assert r.status_code == 503, r.text
    finally:
        children = server.descendants()
        server.stop()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children)
