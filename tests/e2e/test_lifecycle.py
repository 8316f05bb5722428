"""Process lifecycle: /ping states, graceful drain on SIGTERM with open streams, an engine rebuilt
in-process after it died, the exit past the restart budget, a failed start ending the process, no orphans.

Each test that ends its server takes over a shared one at the end of its life (tests/e2e/conftest.py
orders them): the engine-death tests `keyed_server` (API keys, LoRA, LMCache, a budget of one engine
rebuild) after its other users, the last of them tests/e2e/test_lmcache.py (rebuild first, then a
death past its budget of one), the drain the demo server after every other test."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import httpx
import psutil

from lmi_server.api.lifecycle import ENGINE_DEAD_EXIT_CODE, START_FAILED_EXIT_CODE
from tests.e2e.conftest import BASE_PROPS, SECURITY_KEYS
from tests.support.engine_kill import cache_server_processes, kill_engine, wait_serving
from tests.support.server import REPO, ServerProcess, server_env, write_properties


STREAM_TOKENS = 3000
DRAIN_STREAM_S = 15  # how long the drain test's streams last: well past its checks after SIGTERM
AUTH = {"Authorization": f"Bearer {SECURITY_KEYS[0]}"}  # `keyed_server` wants a key on all but /ping, /health, /live


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


def _shm_mapped_by(pids: list[int]) -> set[str]:
    """The /dev/shm segments these processes have mapped: this server's own, whatever else runs
    on the host (other servers' segments come and go beside it)."""
    names = set()
    for pid in pids:
        try:
            maps = open(f"/proc/{pid}/maps").read()
        except OSError:
            continue
        names |= {line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip() for line in maps.splitlines() if "/dev/shm/" in line}
    return names


def _stream_tokens(server: ServerProcess, result: dict, max_tokens: int, headers: dict | None = None) -> None:
    """A streaming completion (with `headers`: an API key); records the status, chunks received and
    how the stream ended."""
    body = {
        "model": "lmi-demo", "prompt": "import os\n", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = 0
    try:
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=headers, timeout=120) as r:
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


def _lmi(server, body, headers=None, timeout=120):
    return httpx.post(server.base_url + "/invocations", json=body, headers={**AUTH, **(headers or {})}, timeout=timeout)


def test_a_dead_engine_is_rebuilt_in_the_same_process_keeping_sessions_adapters_and_the_cache_server(keyed_server):
    """SIGKILL of the engine core and its worker: requests in flight get 503 with Retry-After, /ping
    is 503 until the engine is back, then the same server process serves again; a session, an
    adapter registered through the API and the LMCache cache server (same pid) are still there. The
    session's `keyed_server` (tests/e2e/conftest.py), after tests/e2e/test_lmcache.py."""
    server, root = keyed_server, keyed_server.adapters_root  # LoRA, LMCache, option.engine_max_restarts=1
    # Registered through the API after start-up (discovery found only the others): only the registry knows it.
    shutil.copytree(REPO / "adapters" / "hello-printer", root / "late-printer")
    r = httpx.post(server.base_url + "/adapters", json={"name": "late-printer", "src": str(root / "late-printer")},
                   headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    prompt = {"inputs": "def main():", "parameters": {"max_new_tokens": 12}}
    base = _lmi(server, prompt)
    adapted = _lmi(server, {**prompt, "adapters": "late-printer"})
    assert adapted.status_code == 200 and base.status_code == 200, adapted.text
    assert adapted.json()["generated_text"] != base.json()["generated_text"], "the adapter changes nothing"
    opened = _lmi(server, {"requestType": "NEW_SESSION"})
    session = opened.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0]
    cache_servers = [p.pid for p in cache_server_processes(server.proc.pid)]
    assert cache_servers, [p.cmdline() for p in server.descendants()]

    in_flight: dict = {}

    def long_request():
        body = {"model": "lmi-demo", "prompt": "import os\n", "max_tokens": 3000, "ignore_eos": True}
        r = httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=300)
        in_flight.update(status=r.status_code, retry_after=r.headers.get("retry-after"), body=r.text)

    worker = threading.Thread(target=long_request)
    worker.start()
    time.sleep(2.0)  # admitted and generating (3000 tokens take far longer)
    assert not in_flight, f"the long request ended before the kill: {in_flight}"
    killed = kill_engine(server.proc.pid)
    killed_at = time.monotonic()
    worker.join(60)
    assert in_flight.get("status") == 503 and in_flight.get("retry_after"), in_flight
    assert "being rebuilt" in in_flight["body"], in_flight

    # While the engine is rebuilt: /ping 503, new requests 503 with Retry-After, /live 200.
    deadline = time.monotonic() + 30
    while httpx.get(server.base_url + "/ping", timeout=5).status_code == 200:
        assert time.monotonic() < deadline, "/ping never turned 503 after the kill"
        time.sleep(0.2)
    refused = httpx.post(server.base_url + "/v1/completions", json={"model": "lmi-demo", "prompt": "x", "max_tokens": 2},
                         headers=AUTH, timeout=30)
    assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
    assert httpx.get(server.base_url + "/live", timeout=5).status_code == 200

    back = wait_serving(server.base_url, killed_at, timeout=600, headers=AUTH)
    assert server.proc.poll() is None, "the server process ended"
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in killed)
    assert [p.pid for p in cache_server_processes(server.proc.pid)] == cache_servers, "the cache server was restarted"

    names = [a["name"] for a in httpx.get(server.base_url + "/adapters", headers=AUTH, timeout=30).json()["adapters"]]
    assert "late-printer" in names, names
    again = _lmi(server, {**prompt, "adapters": "late-printer"})  # loaded into the new engine on first use
    assert again.status_code == 200 and again.json()["generated_text"] == adapted.json()["generated_text"], again.text
    in_session = _lmi(server, {"inputs": "import os", "parameters": {"max_new_tokens": 2}}, {"X-Amzn-SageMaker-Session-Id": session})
    assert in_session.status_code == 200, in_session.text
    assert in_session.headers["X-Amzn-SageMaker-Session-Id"] == session
    log = server.log_path.read_text(errors="replace")
    assert "rebuilding it in this process (1 of 1" in log and "engine rebuilt after it died" in log
    print(f"serving again {back['serving_s']} s after the kill (/ping statuses {back['pings']})")


def test_engine_death_past_the_restart_budget_fails_in_flight_requests_and_exits_non_zero(keyed_server):
    """With option.engine_max_restarts=1, used by the rebuild above (this server's last test), the
    next death is one too many: the process ends as it did before engines were rebuilt in-process
    (the same path ends a crash loop)."""
    server = keyed_server
    children: list[psutil.Process] = []
    try:
        log_start = len(server.log_path.read_text(errors="replace"))  # after the rebuild's part
        children = server.descendants()
        result: dict = {"streaming": threading.Event()}
        worker = threading.Thread(target=_stream_tokens, args=(server, result, 3000, AUTH))
        worker.start()
        assert result["streaming"].wait(60), "the stream did not start"
        kill_engine(server.proc.pid)
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
        assert code == ENGINE_DEAD_EXIT_CODE, server.log_tail()
        assert seen_503 or time.monotonic() - killed_at < 30
        log = server.log_path.read_text(errors="replace")[log_start:]
        assert "the engine has died" in log and "rebuilds within 600 s used up" in log
        assert "rebuilding it in this process" not in log
    finally:
        server.stop()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children)


def _drain_stream_tokens(server: ServerProcess) -> int:
    """Tokens for two concurrent streams of about DRAIN_STREAM_S seconds on this host, from two
    concurrent requests timed here (at most STREAM_TOKENS; at least 400, which ended within a second
    of SIGTERM on a fast host)."""
    body = {"model": "lmi-demo", "prompt": "import os\n", "max_tokens": 200, "ignore_eos": True}
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: httpx.post(server.base_url + "/v1/completions", json=body, timeout=120), range(2)))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    per_second = 200 / (time.monotonic() - t0)
    return max(400, min(STREAM_TOKENS, round(per_second * DRAIN_STREAM_S)))


def test_sigterm_drains_open_streams_then_exits_0_and_leaves_no_process(server):
    """The session's demo server (tests/e2e/conftest.py), when every other test is done with it
    (this test runs last): its drain outlasts the long streams (option.graceful_shutdown_timeout)."""
    shm_before = server.shm_before  # /dev/shm before the server started
    try:
        assert 503 in server.ping_history
        children = server.descendants()
        assert children, "the engine runs in child processes"
        mapped = _shm_mapped_by([server.proc.pid, *(c.pid for c in children)])
        assert any(name.startswith("psm_") for name in mapped), mapped  # vLLM's message rings
        results: list[dict] = [{"streaming": threading.Event()}, {"streaming": threading.Event()}]
        # Long enough to be still running after the checks below on a fast host (400 tokens of the
        # tiny model ended within a second of SIGTERM there, and the server was gone before the POST).
        tokens = _drain_stream_tokens(server)
        workers = [threading.Thread(target=_stream_tokens, args=(server, r, tokens)) for r in results]
        for w in workers:
            w.start()
        for r in results:
            assert r["streaming"].wait(60), "the streams did not start"
        log_start = len(server.log_path.read_text(errors="replace"))  # the drain's part of the log
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
            assert r.get("status") == 200 and r.get("done") and r.get("tokens") == tokens and "error_event" not in r, r
        assert server.proc.wait(90) == 0
        log = server.log_path.read_text(errors="replace")[log_start:]
        assert "drained: no request in flight" in log and "shutting down: stopping the engine" in log
        assert "Traceback" not in log, server.log_tail()
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children), f"orphans: {_alive(children)}"
        ours = {name for name in (_shm() - shm_before) & mapped if name.startswith(("psm_", "lmcache"))}
        assert not ours, f"shared-memory segments left behind: {ours}"
    finally:
        server.stop()


def test_corrupt_weights_end_the_process_with_one_line_naming_the_cause(tmp_path):
    """A fatal start failure ends the process (non-zero) instead of answering /ping 503 forever;
    a truncated weights file is found from its header before any engine process is started."""
    from lmi_server.demo.builder import ensure_demo_model

    model = tmp_path / "model"
    shutil.copytree(ensure_demo_model(), model)
    weights = model / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    props = {k: v for k, v in BASE_PROPS.items() if k != "option.model_id"}  # the model directory itself
    write_properties(model, props)
    server = ServerProcess(model, tmp_path / "server.log", env=server_env()).start()
    try:
        code = server.proc.wait(300)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 300 s after start:\n{server.log_tail()}") from None
    finally:
        server.stop()
    assert code == START_FAILED_EXIT_CODE, server.log_tail()
    log = server.log_path.read_text(errors="replace")
    assert "Initializing a V1 LLM engine" not in log and "(EngineCore" not in log, server.log_tail()
    ours = [line for line in log.splitlines() if re.match(r"^\S+ \S+ ERROR lmi_server", line)]
    assert len(ours) == 1, ours
    assert "the model's weights are corrupt or truncated" in ours[0] and "SafetensorError" in ours[0], ours
    assert "fix: copy or download the model again" in ours[0] and f"exiting with code {START_FAILED_EXIT_CODE}" in ours[0]
