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
