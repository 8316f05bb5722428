"""KV that survives a restart, end to end, with two engine starts on one cache directory and one
Redis: (1) the demo model seeds two documents: the session's `busy_server` (tests/e2e/conftest.py),
started on this volume and Redis, after its other modules (`kv_seed` stops it); (2) a server
restarted on the same directory, Redis and LMCache configuration, the session's `keyed_server`
(API keys, LoRA on: neither enters the KV namespace; tests/e2e/test_security.py, test_tenants.py,
test_lmcache.py and test_lifecycle.py's engine deaths use it after this module), serves one
document from the disk tier and the other from Redis, same answers, while an adapter's request
finds nothing of its base model's KV. That a server of another dtype finds nothing of the seed's
chunks, because the keys carry what makes KV valid, is shown by the bf16 replicas of
tests/e2e/test_scale_out.py on the same Redis. The disk tier's size limit counts the files an
earlier run left (tests/support/kv_volume.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from deploy.cluster import redis_server_binary, resp_command
from lmi_server.kvcache.disk_budget import chunk_files
from tests.e2e.conftest import REDIS_PASSWORD, SECURITY_KEYS
from tests.e2e.test_api import metric_value
from tests.support.kv_volume import DOC_A, DOC_B, FAKE_MIB, LIMIT, lmcache_yaml, namespace, real_chunks, redis_key
from tests.support.kv_volume import complete as kv_complete

pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server is not installed (Debian: apt-get install -y redis-server)"
)


AUTH = {"Authorization": f"Bearer {SECURITY_KEYS[0]}"}  # `keyed_server` wants a key


@pytest.fixture(scope="module")
def redis(kv_redis):
    """The session's Redis beside `busy_server`'s volume (tests/e2e/conftest.py), password-protected."""
    return kv_redis


@pytest.fixture(scope="module")
def cache_dir(busy_server):
    """`busy_server`'s disk tier: an earlier run's leftovers were there before it started."""
    return busy_server.kv_volume


def complete(server, prompt: str, adapter: str | None = None) -> dict:
    return kv_complete(server, prompt, adapter, headers=AUTH)


def metric(server, name: str) -> float:
    return metric_value(httpx.get(server.base_url + "/metrics", headers=AUTH).text, name) or 0.0


def within_limit_and_oldest_out(cache_dir: Path) -> None:
    files = chunk_files(cache_dir)
    assert sum(size for _, size, _ in files) <= LIMIT
    kept = sorted(int(p.name.split("@")[0].removeprefix("earlier-run-")) for _, _, p in files
                  if p.name.startswith("earlier-run-"))
    assert kept == list(range(kept[0], FAKE_MIB)) if kept else True  # the earlier run's newest files


@pytest.fixture(scope="module")
def seeded(kv_seed):
    """Engine 1, `busy_server`, after its other modules: the session's seed of document A, then B
    (tests/e2e/conftest.py); it is stopped then."""
    return kv_seed


def test_start_counts_an_earlier_runs_files_against_the_limit(seeded, cache_dir):
    files, size = seeded["start_state"]
    assert size <= LIMIT and files < FAKE_MIB  # 60 MiB found: the oldest removed before serving
    assert not (cache_dir / f"earlier-run-00@0x00000000@0@{0:064x}.data").exists()
    assert seeded["a"]["prompt_tokens"] > 1024 and seeded["b"]["prompt_tokens"] > 1024
    assert seeded["warm_a"]["cached"] >= 1024 and seeded["warm_a"]["text"] == seeded["a"]["text"]
    # every chunk is named by the server's namespace, not by the model's path
    assert len({namespace(name) for name in seeded["files_a"] | seeded["files_b"]}) == 1
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

