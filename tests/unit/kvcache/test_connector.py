"""The CPU-host connector drops a store the cache server does not answer instead of failing the
engine step (LMCache's shared-memory store raises on a timed-out PREPARE_STORE)."""

import logging

import pytest

from lmi_server.kvcache.connector import GuardedLMCacheMPConnector, guard_stores
from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector

pytestmark = pytest.mark.unit


class Adapter:
    """The two things the guard touches on LMCache's worker adapter."""

    def __init__(self, error: BaseException | None, lazy: bool = False):
        self.error = error
        self.lazy_offload = lazy
        self.stored: list[str] = []
        self._completed_store_requests: dict[str, int] = {}
        self._failed_store_requests: set[str] = set()

    def submit_store_request(self, request_id, op, event, cache_salt="", request_configs=None):
        if self.error is not None:
            raise self.error
        self.stored.append(request_id)


def test_it_is_lmcaches_connector():
    assert issubclass(GuardedLMCacheMPConnector, LMCacheMPConnector)


def test_a_store_passes_through():
    a = Adapter(None)
    guard_stores(a)
    a.submit_store_request("r1", object(), None, cache_salt="s")
    assert a.stored == ["r1"]


def test_a_timed_out_store_is_dropped_and_logged(caplog):
    from lmcache.v1.mp_observability.errors import LMCacheTimeoutError

    a = Adapter(LMCacheTimeoutError("PREPARE_STORE timed out for instance_id=1 after 2.0s"))
    guard_stores(a)
    with caplog.at_level(logging.WARNING, logger="lmi_server.kvcache.connector"):
        a.submit_store_request("r1", object(), None)  # no exception reaches the engine step
    assert "r1" in caplog.text and "PREPARE_STORE timed out" in caplog.text
    assert a._completed_store_requests == {} and a._failed_store_requests == set()


def test_lazy_offload_gets_its_receipt_for_a_dropped_store():
    a = Adapter(TimeoutError("late"), lazy=True)
    guard_stores(a)
    a.submit_store_request("r2", object(), None)
    assert a._completed_store_requests == {"r2": 1} and a._failed_store_requests == {"r2"}


def test_other_errors_still_surface():
    a = Adapter(RuntimeError("Transfer context is not initialized"))
    guard_stores(a)
    with pytest.raises(RuntimeError, match="not initialized"):
        a.submit_store_request("r3", object(), None)


def test_the_connector_installs_block_wise_kv_copies(monkeypatch):
    from lmcache.v1.platform.torch_ops import mp_mem_kernels

    monkeypatch.setattr(mp_mem_kernels, "_transfer_per_layer_fused", mp_mem_kernels._transfer_per_layer_fused)
    monkeypatch.setattr(LMCacheMPConnector, "__init__", lambda self, *a, **k: None)
    GuardedLMCacheMPConnector()
    assert getattr(mp_mem_kernels._transfer_per_layer_fused, "lmi_block_copy", False)


class _SchedulerAdapter:
    def __init__(self):
        self.freed: list[tuple[int, int]] = []

    def free_lookup_locks(self, token_ids, start, end, **_):
        self.freed.append((start, end))


def _blended_tracker(monkeypatch, *, hit: int, store: bool):
    """A real LMCache tracker for a 1,000-token prompt whose lookup hit `hit` tokens, then blended."""
    from types import SimpleNamespace

    from lmcache.integration.vllm.lmcache_mp_metadata import LMCacheMPRequestTracker

    monkeypatch.setattr(LMCacheMPConnector, "__init__", lambda self, *a, **k: None)
    connector = GuardedLMCacheMPConnector()
    connector.scheduler_adapter = _SchedulerAdapter()
    prompt = list(range(1, 1001))
    request = SimpleNamespace(request_id="r", cache_salt=None, all_token_ids=prompt, num_prompt_tokens=len(prompt),
                              prompt_token_ids=prompt, kv_transfer_params=None, sampling_params=None, mm_features=None)
    tracker = LMCacheMPRequestTracker(request)
    tracker.num_stored_tokens = tracker.num_lmcache_hit_tokens = hit  # what LMCache's lookup sets
    tracker.allocated_block_ids = {0: list(range(1000 // 16 + 1))}
    connector.request_trackers = {"r": tracker}
    connector._blend_in_place_of_prefix(request, len(prompt) - 1, store=store)
    tracker.increase_num_scheduled_tokens(1)  # the step that schedules the last token (the blend runs first)
    return connector, tracker


def test_a_blended_prompt_is_stored_as_its_prefix_past_the_hit(monkeypatch):
    """The next question on the same document takes LMCache's prefix hit instead of a second blend."""
    from lmcache.integration.vllm.lmcache_mp_metadata import LMCacheMPRequestMetadata

    connector, tracker = _blended_tracker(monkeypatch, hit=256, store=True)
    assert connector.scheduler_adapter.freed == [(0, 256)] and tracker.num_lmcache_hit_tokens == 0  # nothing loaded
    meta = LMCacheMPRequestMetadata.GetStoreMetadata(tracker, 256, [16])
    assert meta is not None and (meta.op.start, meta.op.end) == (256, 768)  # whole chunks past the hit


def test_a_request_with_its_own_ratio_stores_no_prefix(monkeypatch):
    from lmcache.integration.vllm.lmcache_mp_metadata import LMCacheMPRequestMetadata

    _, tracker = _blended_tracker(monkeypatch, hit=0, store=False)
    assert LMCacheMPRequestMetadata.GetStoreMetadata(tracker, 256, [16]) is None
