"""Process lifecycle: /ping states, graceful drain on SIGTERM with open streams, engine death, no orphans."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil

from tests.e2e.conftest import BASE_PROPS
from tests.support.server import ServerProcess, server_env, write_properties


STREAM_TOKENS = 3000


def _start(tmp_path) -> ServerProcess:
    # the drain must outlast the long streams on a slow host too
    write_properties(tmp_path, {**BASE_PROPS, "option.graceful_shutdown_timeout": "300"})
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


def _stream_tokens(server: ServerProcess, result: dict, max_tokens: int) -> None:
    """A streaming completion; records the status, chunks received and how the stream ended."""
    body = {
        "model": "lmi-demo", "prompt": "import os\n", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = 0
    try:
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=120) as r:
            result["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if "streaming" in result:
                        result["streaming"].set()
                    if "error" in json.loads(line[6:]):  # an error event, not a token whose text is "error"
                        result["error_event"] = line
                    if '"completion_tokens"' in line:
                        result["tokens"] = json.loads(line[6:])["usage"]["completion_tokens"]
                elif line == "data: [DONE]":
                    result["done"] = True
    except httpx.HTTPError as exc:
        result["transport_error"] = repr(exc)
    result["chunks"] = chunks


def test_sigterm_drains_open_streams_then_exits_0_and_leaves_no_process(tmp_path):
    shm_before = _shm()
    server = _start(tmp_path)
    try:
        server.wait_ready()
        assert 503 in server.ping_history
        children = server.descendants()
        assert children, "the engine runs in child processes"
        results: list[dict] = [{"streaming": threading.Event()}, {"streaming": threading.Event()}]
        # Long enough to be still running after the checks below on a fast host (400 tokens of the
        # tiny model ended within a second of SIGTERM there, and the server was gone before the POST).
        workers = [threading.Thread(target=_stream_tokens, args=(server, r, STREAM_TOKENS)) for r in results]
        for w in workers:
            w.start()
        for r in results:
            assert r["streaming"].wait(60), "the streams did not start"
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # Still listening while draining: load balancers see 503, new work is refused with 503.
        ping = httpx.get(server.base_url + "/ping", timeout=5)
        assert ping.status_code == 503 and ping.json()["status"] == "draining"
        refused = httpx.post(server.base_url + "/v1/completions", json={"model": "lmi-demo", "prompt": "x", "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
        assert not any(r.get("done") for r in results), "the streams ended before the drain was checked: make them longer"
        for w in workers:
            w.join(240)
        for r in results:  # the open streams ran to their end
            assert r.get("status") == 200 and r.get("done") and r.get("tokens") == STREAM_TOKENS and "error_event" not in r, r
        assert server.proc.wait(90) == 0
        log = server.log_path.read_text(errors="replace")
        assert "drained: no request in flight" in log and "shutting down: stopping the engine" in log
        assert "Traceback" not in log, server.log_tail()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children), f"orphans: {_alive(children)}"
        ours = {name for name in _shm() - shm_before if name.startswith(("psm_", "lmcache"))}
        assert not ours, f"shared-memory segments left behind: {ours}"
    finally:
        server.stop()


def test_engine_death_fails_in_flight_requests_and_exits_non_zero(tmp_path):
    server = _start(tmp_path)
    try:
        server.wait_ready()
        children = server.descendants()
        engine_cores = [p for p in children if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
        assert engine_cores, [p.cmdline() for p in children]
        result: dict = {"streaming": threading.Event()}
        worker = threading.Thread(target=_stream_tokens, args=(server, result, 3000))
        worker.start()
        assert result["streaming"].wait(60), "the stream did not start"
        for p in engine_cores:
            p.kill()
        killed_at = time.monotonic()
        seen_503 = False
        while time.monotonic() - killed_at < 30 and server.proc.poll() is None:
            try:
                if httpx.get(server.base_url + "/ping", timeout=5).status_code == 503:
                    seen_503 = True
                    break
            except httpx.HTTPError:
                break  # already gone
            time.sleep(0.5)
        worker.join(60)
        assert not worker.is_alive(), "the in-flight stream hangs after the engine died"
        # The stream ends early with an error: an error event in the stream, or the connection cut.
        assert ("error_event" in result or "transport_error" in result) and result.get("tokens") != 3000, result
        code = server.proc.wait(60)
        assert code == 3, server.log_tail()
        assert seen_503 or time.monotonic() - killed_at < 30
        assert "the engine has died" in server.log_path.read_text(errors="replace")
    finally:
        server.stop()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children)
