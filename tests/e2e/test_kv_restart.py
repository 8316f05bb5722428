"""KV that survives a restart, end to end, with three engine starts on one cache directory and one
Redis: (1) the demo model seeds two documents: the session's `busy_server` (tests/e2e/conftest.py),
started on this volume and Redis, after its other modules (it is stopped here); (2) a server
restarted on the same directory, Redis and LMCache configuration, the session's `keyed_server`
(API keys, LoRA on: neither enters the KV namespace; tests/e2e/test_security.py, test_tenants.py,
test_lmcache.py and test_lifecycle.py's engine deaths use it after this module), serves one
document from the disk tier and the other from Redis, same answers, while an adapter's request
finds nothing of its base model's KV; (3) a server with another dtype on the same directory and
Redis finds nothing, because the keys carry what makes KV valid. The disk tier's size limit counts
the files an earlier run left (tests/support/kv_volume.py)."""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path

import httpx
import pytest

from deploy.cluster import redis_dbsize, redis_server_binary, resp_command
from lmi_server.kvcache.disk_budget import chunk_files
from tests.e2e.conftest import REDIS_PASSWORD, SECURITY_KEYS
from tests.e2e.test_api import metric_value
from tests.support.kv_volume import FAKE_MIB, LIMIT, lmcache_yaml
from tests.support.server import DEMO_PROPS, running_server

pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server is not installed (Debian: apt-get install -y redis-server)"
)


def document(name: str, n_chars: int = 7000) -> str:
    return Path(sysconfig.get_paths()["stdlib"], name).read_text()[:n_chars]


# Not the documents tests/e2e/test_security.py sends the restart (`keyed_server`) later: its
# isolation checks expect no KV of their prompts stored before them.
DOC_A, DOC_B = document("inspect.py"), document("tarfile.py")
AUTH = {"Authorization": f"Bearer {SECURITY_KEYS[0]}"}  # `keyed_server` wants a key; the others ignore it


@pytest.fixture(scope="module")
def redis(kv_redis):
    """The session's Redis beside `busy_server`'s volume (tests/e2e/conftest.py), password-protected."""
    return kv_redis


@pytest.fixture(scope="module")
def cache_dir(busy_server):
    """`busy_server`'s disk tier: an earlier run's leftovers were there before it started."""
    return busy_server.kv_volume


def props_for(model_dir: Path, cache_dir: Path, redis_port: int, **extra: str) -> dict[str, str]:
    (model_dir / "lmcache.yaml").write_text(lmcache_yaml(cache_dir, redis_port, REDIS_PASSWORD))
    return {**DEMO_PROPS, "option.enable_prefix_caching": "false", "option.lmcache_config_file": "lmcache.yaml",
            **extra}


def complete(server, prompt: str, adapter: str | None = None) -> dict:
    body = {"model": adapter or "lmi-demo", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    return {"text": out["choices"][0]["text"], "cached": out["usage"]["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": out["usage"]["prompt_tokens"]}


def metric(server, name: str) -> float:
    return metric_value(httpx.get(server.base_url + "/metrics", headers=AUTH).text, name) or 0.0


def real_chunks(d: Path) -> set[str]:
    return {p.name for _, _, p in chunk_files(d) if not p.name.startswith("earlier-run-")}


def wait_stored(cache_dir: Path, redis_port: int | None, before: set[str]) -> set[str]:
    """The chunk files a request added, once disk and Redis (where there is one) stop growing."""
    last, stable = None, 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and stable < 3:
        now = (frozenset(real_chunks(cache_dir) - before),
               redis_dbsize(redis_port, password=REDIS_PASSWORD) if redis_port else 0)
        stable = stable + 1 if now == last and now[0] else 0
        last = now
        time.sleep(1)
    assert last and last[0], "no chunk reached the disk tier"
    return set(last[0])


def redis_key(file_name: str) -> str:
    """The Redis key of the chunk a disk-tier file holds (same fields; the rank without `0x`)."""
    model, rank, *rest = file_name.removesuffix(".data").split("@")
    return "@".join([model, rank.removeprefix("0x"), *rest])


def within_limit_and_oldest_out(cache_dir: Path) -> None:
    files = chunk_files(cache_dir)
    assert sum(size for _, size, _ in files) <= LIMIT
    kept = sorted(int(p.name.split("@")[0].removeprefix("earlier-run-")) for _, _, p in files
                  if p.name.startswith("earlier-run-"))
    assert kept == list(range(kept[0], FAKE_MIB)) if kept else True  # the earlier run's newest files


@pytest.fixture(scope="module")
def seeded(busy_server, cache_dir, redis):
    """Engine 1, `busy_server`, after its other modules: seeds document A, then B; the chunk files
    of each; the answers; what the volume held when it was ready. It is stopped then."""
    try:
        before = real_chunks(cache_dir)  # what the other modules' requests stored
        a = complete(busy_server, DOC_A)
        files_a = wait_stored(cache_dir, redis, before)
        b = complete(busy_server, DOC_B)
        files_b = wait_stored(cache_dir, redis, before | files_a)
        warm = complete(busy_server, DOC_A)
    finally:
        busy_server.stop()
    return {"a": a, "b": b, "warm_a": warm, "files_a": files_a, "files_b": files_b,
            "start_state": busy_server.kv_start_state, "stopped": time.time()}


def test_start_counts_an_earlier_runs_files_against_the_limit(seeded, cache_dir):
    files, size = seeded["start_state"]
    assert size <= LIMIT and files < FAKE_MIB  # 60 MiB found: the oldest removed before serving
    assert not (cache_dir / f"earlier-run-00@0x00000000@0@{0:064x}.data").exists()
    assert seeded["a"]["prompt_tokens"] > 1024 and seeded["b"]["prompt_tokens"] > 1024
    assert seeded["warm_a"]["cached"] >= 1024 and seeded["warm_a"]["text"] == seeded["a"]["text"]
    # every chunk is named by the server's namespace, not by the model's path
    assert len({name.split("@")[0] for name in seeded["files_a"] | seeded["files_b"]}) == 1
    assert not any("-SEP-" in name for name in seeded["files_a"])


@pytest.fixture(scope="module")
def restarted(seeded, cache_dir, redis, request):
    """Engine 2 on the same directory, Redis and LMCache configuration: the session's
    `keyed_server`, started here. Before it starts, document A is left on disk only and document B
    in Redis only, so each hit names its tier."""
    for name in seeded["files_b"]:
        (cache_dir / name).unlink(missing_ok=True)
    for name in seeded["files_a"]:
        assert resp_command(redis, "DEL", redis_key(name), password=REDIS_PASSWORD).startswith(b":1"), name
    server = request.getfixturevalue("keyed_server")
    assert server.kv_start > seeded["stopped"], "keyed_server started before the seed: not a restart"
    assert (server.model_dir / "lmcache.yaml").read_text() == lmcache_yaml(cache_dir, redis, REDIS_PASSWORD)
    return server


def test_restarted_server_serves_a_document_from_the_disk_tier(seeded, restarted):
    again = complete(restarted, DOC_A)
    assert again["text"] == seeded["a"]["text"]
    assert again["cached"] >= 1024, again
    assert metric(restarted, "lmi_lmcache_lookup_hit_l2_tokens_total") >= again["cached"]


def test_a_document_read_back_from_disk_is_then_served_from_the_cpu_tier(seeded, restarted):
    """The retain prefetch policy: the disk hit above left document A's chunks in the CPU tier."""
    l1, l2 = metric(restarted, "lmi_lmcache_lookup_hit_l1_tokens_total"), metric(restarted, "lmi_lmcache_lookup_hit_l2_tokens_total")
    again = complete(restarted, DOC_A)
    assert again["text"] == seeded["a"]["text"] and again["cached"] >= 1024, again
    assert metric(restarted, "lmi_lmcache_lookup_hit_l1_tokens_total") - l1 >= again["cached"]
    assert metric(restarted, "lmi_lmcache_lookup_hit_l2_tokens_total") == l2


def test_restarted_server_serves_a_document_from_redis(seeded, restarted, redis):
    before = metric(restarted, "lmi_lmcache_lookup_hit_l2_tokens_total")
    again = complete(restarted, DOC_B)
    assert again["text"] == seeded["b"]["text"]
    assert again["cached"] >= 1024, again
    assert metric(restarted, "lmi_lmcache_lookup_hit_l2_tokens_total") - before >= again["cached"]


def test_the_limit_holds_across_restarts(seeded, restarted, cache_dir):
    within_limit_and_oldest_out(cache_dir)
    assert seeded["files_a"] <= real_chunks(cache_dir)  # this run's chunks are newer than every leftover


def test_an_adapter_never_reads_its_base_models_chunks(seeded, restarted):
    """Document A's base KV is in the restart's CPU tier and on disk now (the tests above)."""
    adapted = complete(restarted, DOC_A, adapter="hello-printer")
    assert adapted["cached"] == 0, adapted
    # and the base request still hits: the miss above is the keys' doing
    assert complete(restarted, DOC_A)["cached"] >= 1024


@pytest.fixture(scope="module")
def other_dtype(restarted, seeded, cache_dir, redis, tmp_path_factory):
    """Engine 3: bfloat16, same directory, Redis and LMCache configuration (engine 2, idle, goes on
    serving the session)."""
    model_dir = tmp_path_factory.mktemp("kv-restart-bf16")
    with running_server(model_dir, props_for(model_dir, cache_dir, redis, **{"option.dtype": "bf16"})) as server:
        yield server


def test_other_dtype_never_reads_those_chunks(seeded, other_dtype, cache_dir, redis):
    before = real_chunks(cache_dir)
    base = complete(other_dtype, DOC_A)
    assert base["cached"] == 0, base  # the float32 chunks of A are on disk: not this server's namespace
    assert metric(other_dtype, "lmi_lmcache_lookup_hit_tokens_total") == 0
    added = wait_stored(cache_dir, redis, before)
    namespaces = {n.split("@")[0] for n in added}
    assert len(namespaces) == 1 and namespaces.isdisjoint({n.split("@")[0] for n in seeded["files_a"]})
    # the base request hits its own KV: the miss above is the keys' doing
    again = complete(other_dtype, DOC_A)
    assert again["cached"] >= 1024 and again["text"] == base["text"]

