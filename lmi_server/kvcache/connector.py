"""LMCache's MP connector for CPU hosts, with one guard and one faster copy: a KV store that the
cache server does not answer in time is dropped instead of failing the engine step, and KV moves
between LMCache's chunks and vLLM's CPU KV cache block by block (`block_copy`).

With the CPU tier in /dev/shm (engine_driven transfer, `mp_shm`), the worker first asks the cache
server for slots (PREPARE_STORE) and LMCache 0.5.6 raises when that answer does not come within the
connector's RPC timeout. Nothing above it catches the error, so a cache server that dies while a
store is in flight takes the engine down with it. Dropping the store is what the connector itself
does once its health ping has failed: the request keeps its KV in the engine, only the copy in
the cache tier is missing, and later requests recompute those tokens.

vLLM loads this class by name (`kv_connector_module_path` + `kv_connector` in the transfer config);
it runs inside the engine's worker and scheduler processes.
"""

from __future__ import annotations

import logging
from typing import Any

from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector

from lmi_server.kvcache import block_copy

logger = logging.getLogger("lmi_server.kvcache.connector")


class GuardedLMCacheMPConnector(LMCacheMPConnector):
    """`LMCacheMPConnector` whose worker side survives an unanswered store and copies KV block-wise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if block_copy.install():
            logger.info("LMCache KV copies to and from the paged KV cache run block-wise")
        adapter = getattr(self, "worker_adapter", None)
        if adapter is not None:
            guard_stores(adapter)


def guard_stores(adapter: Any) -> None:
    """Wrap the worker adapter's per-request store so that a timed-out store is logged and dropped
    (the same outcome as a store submitted while the server is known to be unhealthy)."""
    submit = adapter.submit_store_request

    def submit_store_request(request_id: str, *args: Any, **kwargs: Any) -> None:
        try:
            submit(request_id, *args, **kwargs)
        except TimeoutError as exc:
            if getattr(adapter, "lazy_offload", False):
                # Lazy offload waits for one receipt per rank before it unpins the blocks.
                adapter._completed_store_requests[request_id] = 1
                adapter._failed_store_requests.add(request_id)
            logger.warning("LMCache store for request %s dropped: %s", request_id, exc)

    adapter.submit_store_request = submit_store_request
