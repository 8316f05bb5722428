"""LMCache end to end: real engine, real supervised cache server, CPU RAM + disk tiers (and Redis),
on the session's `keyed_server` (tests/e2e/conftest.py; an API key on every request but /ping) after
tests/e2e/test_kv_restart.py, test_security.py and test_tenants.py. Its volume and Redis hold what
they (and `busy_server` before them) stored: each test here sends text none of them sent where a
hit or a miss is what it proves."""

from __future__ import annotations

import os
import signal
import sysconfig
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from deploy.cluster import resp_command
from lmi_server.kvcache.host import odirect_supported, shm_free_bytes
from tests.e2e.conftest import REDIS_PASSWORD, SECURITY_KEYS
from tests.e2e.test_api import metric_value
from tests.support.kv_volume import real_chunks, redis_key, wait_stored

KEYS = SECURITY_KEYS  # two unnamed keys: two tenants, each with its share of the queue
# Sources of the first two tests' prompts: no earlier user of the server's volume and Redis sent them.
FRESH = ("configparser.py", "threading.py")


def long_prompt(n_chars: int = 9000, source: str = "argparse.py") -> str:
    text = Path(sysconfig.get_paths()["stdlib"], source).read_text()
    return text[:n_chars]


@pytest.fixture(scope="module")
def lmcache_server(keyed_server):
    """The session's server with LMCache and API keys (tests/e2e/conftest.py), which
    test_lifecycle.py's engine-death tests take over after this module."""
    return keyed_server


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def complete(server, prompt: str, max_tokens: int = 8, key: str = KEYS[0]) -> dict:
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": "lmi-demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        headers=auth(key), timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def metrics(server) -> str:
    return httpx.get(server.base_url + "/metrics", headers=auth()).text


def cache_server_pid(server) -> int:
    for child in server.descendants():
        try:
            if "lmcache.v1.multiprocess.server" in " ".join(child.cmdline()):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("no LMCache cache server child process")


def test_second_request_reuses_kv_from_lmcache_with_identical_text(lmcache_server):
    prompt = long_prompt(source=FRESH[0])
    first = complete(lmcache_server, prompt)
    assert first["usage"]["prompt_tokens"] > 1024
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first["usage"]  # none of it stored before
    second = complete(lmcache_server, prompt)
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 256 == 0, cached
    text = metrics(lmcache_server)
    assert metric_value(text, "lmi_lmcache_lookup_hit_tokens_total") >= cached
    assert metric_value(text, "lmi_lmcache_hit_rate") > 0
    assert metric_value(text, "lmi_lmcache_stored_bytes", tier="cpu") > 0
    assert metric_value(text, "vllm:external_prefix_cache_hits_total") >= cached


def test_cache_server_killed_mid_traffic_recovers_and_hits_from_disk(lmcache_server):
    prompt = long_prompt(11000, FRESH[1])
    on_disk_before = real_chunks(lmcache_server.disk)
    reference = complete(lmcache_server, prompt)  # stored in L1 and on disk (and in Redis)
    # Disk writes complete after the response: wait until every chunk in L1 is also on disk.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = metrics(lmcache_server)
        written = metric_value(text, "lmi_lmcache_l1_written_chunks_total") or 0
        on_disk = metric_value(text, "lmi_lmcache_l2_stored_chunks_total") or 0
        if written and on_disk >= written:
            break
        time.sleep(0.5)
    assert written and on_disk >= written, f"only {on_disk} of {written} chunks reached the disk tier"
    assert any(Path(lmcache_server.disk).rglob("*"))
    # its reads and writes bypass the page cache (extra_config.use_odirect) where the filesystem allows
    log = lmcache_server.log_path.read_text(errors="replace")
    assert ("O_DIRECT on" in log) == odirect_supported(Path(lmcache_server.disk)), lmcache_server.log_tail()
    # The chunk counts above add up every second tier, and Redis is one here: the prompt's own chunk
    # files on disk, then the same chunks out of Redis, so that its hits below come from disk only.
    stored = wait_stored(lmcache_server.disk, lmcache_server.redis_port, REDIS_PASSWORD, on_disk_before)
    for name in stored if lmcache_server.redis_port else ():
        deleted = resp_command(lmcache_server.redis_port, "DEL", redis_key(name), password=REDIS_PASSWORD)
        assert deleted.startswith(b":1"), (name, deleted)

    before = metric_value(metrics(lmcache_server), "lmi_lmcache_server_restarts_total")
    os.kill(cache_server_pid(lmcache_server), signal.SIGKILL)
    # Requests keep succeeding (recomputed) and /ping stays 200 while the server is down.
    for _ in range(3):
        assert httpx.get(lmcache_server.base_url + "/ping").status_code == 200
        assert complete(lmcache_server, "import json\n", 4)["choices"][0]["text"] is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = metrics(lmcache_server)
        if metric_value(text, "lmi_lmcache_server_restarts_total") == before + 1 and metric_value(text, "lmi_lmcache_server_up") == 1:
            break
        time.sleep(1)
    assert metric_value(metrics(lmcache_server), "lmi_lmcache_server_restarts_total") == before + 1
    # The engine's connector reconnects to the new server: wait until its lookups arrive there
    # (an unrelated prompt, so the chunks under test are not recomputed into L1 meanwhile).
    other = Path(sysconfig.get_paths()["stdlib"], "typing.py").read_text()[:6000]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        complete(lmcache_server, other, 2)
        if (metric_value(metrics(lmcache_server), "lmi_lmcache_lookup_requested_tokens_total") or 0) > 0:
            break
        time.sleep(2)
    # L1 died with the process; the disk tier still holds the chunks: hits come from L2.
    l2_before = metric_value(metrics(lmcache_server), "lmi_lmcache_lookup_hit_l2_tokens_total") or 0
    again = complete(lmcache_server, prompt)
    l2_hits = (metric_value(metrics(lmcache_server), "lmi_lmcache_lookup_hit_l2_tokens_total") or 0) - l2_before
    assert again["choices"][0]["text"] == reference["choices"][0]["text"]
    assert l2_hits > 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_cache_server_killed_while_kv_is_being_stored_fails_no_request(lmcache_server):
    """Kill the cache server while several long prompts are in prefill, their KV being stored: the
    connector drops the stores it gets no answer for, and every request completes (recomputed)."""
    argv = psutil.Process(cache_server_pid(lmcache_server)).cmdline()
    cmdline = " ".join(argv)
    shm_free = shm_free_bytes() or 0
    # the CPU tier (max_local_cpu_size: --l1-size-gb) goes into /dev/shm by default wherever it fits
    # (lmi_server/kvcache/lmcache.py, choose_shm), and the log says which
    l1_bytes = float(argv[argv.index("--l1-size-gb") + 1]) * 2**30
    assert ("--shm-name" in cmdline) == (shm_free >= l1_bytes)
    log = lmcache_server.log_path.read_text(errors="replace")
    assert "LMCache plan: " in log
    assert ("mp_shm default" in log) == (shm_free >= l1_bytes)
    sources = ["argparse.py", "typing.py", "inspect.py", "dataclasses.py", "pathlib.py", "subprocess.py"]
    prompts = [Path(sysconfig.get_paths()["stdlib"], name).read_text()[2000:8000] for name in sources]
    results: list = [None] * len(prompts)

    def send(i: int) -> None:
        # each key is a tenant that may run one request (the batch size) and queue five more
        # (option.tenant_queue_share=0.5 of option.job_queue_size=10): three each, none refused
        try:
            results[i] = complete(lmcache_server, prompts[i], 16, key=KEYS[i % 2])
        except AssertionError as exc:  # a non-200 answer
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
    before = metric_value(metrics(lmcache_server), "lmi_lmcache_server_restarts_total")
    for t in threads:
        t.start()
    time.sleep(1.5)  # the first prefill steps are storing their chunks
    os.kill(cache_server_pid(lmcache_server), signal.SIGKILL)
    for t in threads:
        t.join(timeout=150)
    assert all(isinstance(r, dict) and r["choices"][0]["text"] for r in results), results
    assert httpx.get(lmcache_server.base_url + "/ping").status_code == 200
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and metric_value(metrics(lmcache_server), "lmi_lmcache_server_restarts_total") != before + 1:
        time.sleep(1)
    assert metric_value(metrics(lmcache_server), "lmi_lmcache_server_restarts_total") == before + 1
    # the engine lived through it: a new request after the restart is answered
    assert complete(lmcache_server, "import os\n", 4)["choices"][0]["text"] is not None


def wait_for_lmcache_round_trips(server, timeout_s: float = 120) -> None:
    """Until a prompt stored in LMCache comes back as a hit: after a cache-server restart (the test
    before) the engine's connector re-registers its KV with the new server a few seconds later, and
    until then stores are refused and lookups miss."""
    source = Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text()
    deadline = time.monotonic() + timeout_s
    for attempt in range(1000):
        # a new prompt each time: no earlier hit (the server's earlier users sent argparse.py's
        # first 8,000 characters at most)
        prompt = source[(attempt + 4) * 3000:(attempt + 5) * 3000]
        complete(server, prompt, 2)
        if complete(server, prompt, 2)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0:
            return
        assert time.monotonic() < deadline, "LMCache served no hit within the timeout"
        time.sleep(1)


def test_a_kv_load_that_fails_is_recomputed_not_failed(lmcache_server):
    """While the switch file exists, the engine worker's copy of every LMCache hit raises (the
    server's worker hook, tests/e2e/conftest.py), as when the cache server dies between the lookup
    and the load."""
    wait_for_lmcache_round_trips(lmcache_server)  # so that the second request below is a hit
    prompt = Path(sysconfig.get_paths()["stdlib"], "inspect.py").read_text()[40000:43000]  # no earlier test sent it
    lmcache_server.fail_loads.touch()
    try:
        first = complete(lmcache_server, prompt)
        # stored in LMCache, not in vLLM (prefix caching off): the second request hits LMCache, its
        # load fails, and vLLM computes those tokens again instead of failing the request
        second = complete(lmcache_server, prompt)
        assert second["choices"][0]["text"] == first["choices"][0]["text"]
        log = lmcache_server.log_path.read_text(errors="replace")
        assert "injected KV load failure" in log
        assert "Recovered from KV load failure" in log, lmcache_server.log_tail()
        assert httpx.get(lmcache_server.base_url + "/ping").status_code == 200
    finally:
        lmcache_server.fail_loads.unlink()
