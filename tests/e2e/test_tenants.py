"""Tenants against the real server: priorities order the queue, one tenant cannot fill it, rate
limits answer 429 with the standard headers, /metrics names tenants and never their keys.

The server runs a batch of one (option.max_rolling_batch_size=1, plus the two slots
option.reserved_slots adds for other tenants) with vLLM's priority scheduling; a long request (15,000 tokens, not streamed)
holds alice's only slot while the tests queue her requests behind it. Tenants are named API keys
(option.api_key_file). The server (`keyed_server`, tests/e2e/conftest.py) is shared with
tests/e2e/test_security.py, whose unnamed keys are in the same file (LMCache and LoRA on as well),
and after this module with test_lmcache.py and test_lifecycle.py's engine deaths.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import TENANT_KEYS
from tests.support.server import ServerProcess

pytestmark = pytest.mark.e2e

KEYS = TENANT_KEYS


@pytest.fixture(scope="module")
def tenant_server(keyed_server):
    """The session's server with API keys (tests/e2e/conftest.py), which test_security.py shares."""
    return keyed_server


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", headers=auth("alice"), timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{"))


class Holder:
    """A long request of alice's that holds her one engine slot until `release()` closes its
    connection (the server aborts a request whose client is gone).

    Not streamed: a stream of 15,000 tokens as fast as the engine makes them keeps the API server
    busy with one event per token, and on a slow host the requests a test queues behind it then
    took longer than its waits to reach admission at all."""

    def __init__(self, server: ServerProcess):
        self.server, self.started, self.stop = server, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sock: socket.socket | None = None
        self.last, self.ended = "", ""

    def _run(self):
        body = json.dumps({"model": "lmi-demo", "prompt": "def f():\n", "max_tokens": 15000, "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEYS['alice']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=600)
            self.sock.sendall(head + body)
            answer = self.sock.recv(300)  # only when the request is over: by itself, or refused
            if not self.stop.is_set():
                self.last = answer.decode(errors="replace")
                self.ended = "the request ended by itself"
        except OSError as exc:
            if not self.stop.is_set():
                self.ended = f"the request failed: {exc!r}"

    def state(self) -> str:
        """Why a test that relies on the held slot may not hold: for its failure message."""
        log = (self.server.model_dir / "server.log").read_text(errors="replace").splitlines()
        errors = [line[:300] for line in log if "Traceback" in line or " ERROR " in line or "Error" in line][-5:]
        return f"holder: {self.ended or 'still running'}, answer {self.last!r}; server log errors: {errors}"

    def release(self):
        self.stop.set()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        self.thread.join(60)
        # the server sees the client gone and frees alice's slot
        deadline = time.monotonic() + 60
        while metric(self.server, 'lmi_tenant_requests_in_engine{tenant="alice"}') > 0 and time.monotonic() < deadline:
            time.sleep(0.05)

    def __exit__(self, *exc):
        if not self.stop.is_set():
            self.release()

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while metric(self.server, 'lmi_tenant_requests_in_engine{tenant="alice"}') < 1 and time.monotonic() < deadline:
            if self.ended:
                break
            time.sleep(0.05)
        assert metric(self.server, 'lmi_tenant_requests_in_engine{tenant="alice"}') >= 1, f"the holding request did not start; {self.state()}"
        self.started.set()
        return self


class HolderEnded(AssertionError):
    """The holding stream ended by itself (the engine outran it): the test's set-up failed, not the
    server; the test runs once more with a new holder."""


def wait_queue_depth(server: ServerProcess, depth: int, holder: Holder, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(server, "lmi_queue_depth") < depth and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = metric(server, "lmi_queue_depth")
    if seen < depth and holder.ended:
        raise HolderEnded(f"queue depth {seen}, expected {depth}; {holder.state()}")
    assert seen >= depth, f"queue depth {seen}, expected {depth}; {holder.state()}"


def with_a_held_slot(server: ServerProcess, scenario) -> object:
    """Run `scenario(pool, holder)` while a long stream holds alice's slot; once more if the stream
    ended by itself before the scenario was done with it (a stream still running while the queue
    stays empty is a failure at once)."""
    for attempt in (1, 2):
        with ThreadPoolExecutor(10) as pool, Holder(server) as holder:
            try:
                return scenario(pool, holder)
            except HolderEnded:
                if attempt == 2:
                    raise
    raise AssertionError("unreachable")


def complete(server: ServerProcess, tenant: str, headers: dict | None = None, tokens: int = 2) -> dict:
    t0 = time.monotonic()
    r = httpx.post(server.base_url + "/v1/completions", headers={**auth(tenant), **(headers or {})},
                   json={"model": "lmi-demo", "prompt": "x = ", "max_tokens": tokens}, timeout=120)
    return {"status": r.status_code, "ended": time.monotonic(), "took": time.monotonic() - t0, "headers": r.headers, "body": r.text}


def high_priority_stream(server: ServerProcess) -> dict:
    """A streamed high-priority request; at its first token, how many requests still wait. It holds
    alice's one slot while its stream is open, so none of hers can have started before it."""
    body = {"model": "lmi-demo", "prompt": "x = ", "max_tokens": 8000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=120,
                      headers={**auth("alice"), "x-priority": "-1"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return {"status": r.status_code, "waiting_at_first_token": metric(server, "lmi_queue_depth")}
        return {"status": r.status_code, "waiting_at_first_token": None}


def test_a_high_priority_request_starts_before_a_full_queue_of_low_priority_ones(tenant_server):
    def scenario(pool, holder):
        low = []
        for i in range(4):  # alice's whole share of the queue (0.5 x 10 would allow 5; 4 keep it quick)
            low.append(pool.submit(complete, tenant_server, "alice", {"x-priority": "5"}))
            wait_queue_depth(tenant_server, i + 1, holder)
        high = pool.submit(high_priority_stream, tenant_server)
        wait_queue_depth(tenant_server, 5, holder)
        holder.release()
        return high.result(), [f.result() for f in low]

    first, results = with_a_held_slot(tenant_server, scenario)
    assert first["status"] == 200 and all(r["status"] == 200 for r in results), [first] + results
    # it went first: all four low-priority requests still waited when its first token came
    assert first["waiting_at_first_token"] == 4, first


def test_a_bad_priority_is_a_400(tenant_server):
    r = httpx.post(tenant_server.base_url + "/v1/completions", headers={**auth("alice"), "x-priority": "urgent"},
                   json={"model": "lmi-demo", "prompt": "x", "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and "x-priority" in r.json()["error"]["message"], r.text
    lmi = httpx.post(tenant_server.base_url + "/invocations", headers={**auth("alice"), "x-priority": "1.5"},
                     json={"inputs": "x", "parameters": {"max_new_tokens": 1}}, timeout=60)
    assert lmi.status_code == 400 and lmi.json()["code"] == 400
    body = httpx.post(tenant_server.base_url + "/v1/completions", headers=auth("alice"),
                      json={"model": "lmi-demo", "prompt": "x", "max_tokens": 1, "priority": "high"}, timeout=60)
    assert body.status_code == 400 and "priority" in body.json()["error"]["message"], body.text
    ok = httpx.post(tenant_server.base_url + "/v1/chat/completions", headers=auth("alice"),
                    json={"model": "lmi-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": -3},
                    timeout=60)
    assert ok.status_code == 200, ok.text  # OpenAI's priority field reaches vLLM's priority scheduler


def test_one_tenant_cannot_fill_the_queue_and_others_still_get_in(tenant_server):
    def scenario(pool, holder):
        mine = []
        for i in range(5):  # alice's share: 0.5 x option.job_queue_size=10
            mine.append(pool.submit(complete, tenant_server, "alice"))
            wait_queue_depth(tenant_server, i + 1, holder)
        over = complete(tenant_server, "alice")
        assert over["status"] == 429 and int(over["headers"]["retry-after"]) >= 1, over
        assert "option.tenant_queue_share" in over["body"]
        # bob still gets in, at once: the engine runs option.reserved_slots (default 2) beyond the batch size
        # of 1, which alice, at her cap, cannot take
        bob = complete(tenant_server, "bob")
        assert bob["status"] == 200, bob
        if holder.ended:
            raise HolderEnded(holder.state())
        assert metric(tenant_server, "lmi_queue_depth") == 5, holder.state()  # alice's requests still wait
        holder.release()
        return bob, [f.result() for f in mine]

    bob, alice = with_a_held_slot(tenant_server, scenario)
    assert all(a["status"] == 200 for a in alice)
    assert bob["ended"] < min(a["ended"] for a in alice)


def test_rate_limits_answer_429_with_the_standard_headers(tenant_server):
    first = complete(tenant_server, "limited")
    assert first["status"] == 200, first
    h = first["headers"]
    assert h["x-ratelimit-limit-requests"] == "1" and h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    second = complete(tenant_server, "limited")
    assert second["status"] == 429 and second["took"] < 10, second
    assert int(second["headers"]["retry-after"]) >= 1 and second["headers"]["x-ratelimit-remaining-requests"] == "0"
    assert "rate limit of tenant 'limited'" in second["body"]
    assert complete(tenant_server, "bob")["status"] == 200  # another tenant is not limited


def test_metrics_name_tenants_never_keys(tenant_server):
    text = httpx.get(tenant_server.base_url + "/metrics", headers=auth("bob"), timeout=30).text
    assert 'lmi_tenant_requests_total{outcome="admitted",tenant="alice"}' in text
    assert 'outcome="rate_limited",tenant="limited"' in text and 'outcome="tenant_queue_full",tenant="alice"' in text
    assert not any(key in text for key in KEYS.values())
    log = (tenant_server.model_dir / "server.log").read_text(errors="replace")
    assert "tenant limited refused" in log and not any(key in log for key in KEYS.values())
