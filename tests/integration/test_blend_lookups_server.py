"""Segment lookups against the real LMCache server (its scheduler adapter, as the connector holds
it): each segment is looked up under its own id, the server answers, the plan is made and the
lookups are released without waiting for a lock's TTL. Hits need KV stored by an engine's worker;
here nothing is stored, so every segment misses."""

from __future__ import annotations

import time

import pytest
import zmq
from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPSchedulerAdapter, ParallelStrategy

from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.blend.lookups import SegmentLookups
from lmi_server.kvcache.blend.plan import PENDING, plan_prompt
from lmi_server.kvcache.host import probe_host
from lmi_server.kvcache.mp_server import supervisor_for_plan
from lmi_server.kvcache.resolve import build_kvcache_plan

SEP = (900, 901)


@pytest.fixture
def adapter(tmp_path):
    cfg = tmp_path / "lmcache.yaml"
    cfg.write_text("chunk_size: 256\nmax_local_cpu_size: 0.25\n")
    plan = build_kvcache_plan(LMCacheOptions(lmcache_config_file=cfg), host=probe_host())
    sup = supervisor_for_plan(plan, max_restarts=0, ready_timeout_s=120, poll_interval_s=0.25, stop_timeout_s=20)
    sup.start()
    try:
        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1, n_servers=1)
        yield LMCacheMPSchedulerAdapter([f"tcp://localhost:{sup.port}"], zmq.Context(), "lmi-test", 128, strategy)
    finally:
        sup.stop()


def test_segments_are_looked_up_in_the_real_server_and_released(adapter):
    assert adapter.lmcache_tokens_per_chunk == 256
    lookups = SegmentLookups(adapter, "req-1", cache_salt="tenant-a")
    tokens = list(SEP) + list(range(1000, 1300)) + list(SEP) + list(range(2000, 2600))
    deadline = time.monotonic() + 30
    plan = PENDING
    while plan is PENDING and time.monotonic() < deadline:
        plan = plan_prompt(tokens, SEP, lookups, recompute_ratio=0.15, min_reused_tokens=0)
        time.sleep(0.01)
    assert plan is not PENDING, "the server did not answer the segment lookups"
    assert [(s.length, s.cached) for s in plan.segments] == [(300, 0), (600, 0)]
    assert [s.length for s in plan.to_store()] == [300, 600]  # missed: stored after the forward
    lookups.release()
    assert all(lookups.segment_id(t) not in adapter._pending_lookups for t in (tokens[2:302], tokens[304:]))
