"""LMCache's non-API names, each behind one small function; `USES` lists them for the contract tests.

All of them are inside LMCache's vLLM MP connector (`lmcache_mp_connector`, its scheduler and
worker adapters) and its pure-torch transfer kernels: LMCache's configuration offers no hook for a
key namespace, a store that times out, or a KV copy routine.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmi_server.compat.contract import Use

_CONNECTOR = "lmcache.integration.vllm.lmcache_mp_connector"
_ADAPTERS = "lmcache.integration.vllm.vllm_multi_process_adapter"
_KERNELS = "lmcache.v1.platform.torch_ops.mp_mem_kernels"
_KERNEL = "_transfer_per_layer_fused"
_VALID_RANGE = "_valid_block_range_indices"
_TRACKER = "LMCacheMPRequestTracker"
_NO_CONFIG = "LMCache's configuration has no option for it"

USES: tuple[Use, ...] = (
    Use("lmcache", _CONNECTOR, "get_dcp_decorated_model_name", "replace",
        "the connector calls this module function for the model name in every cache key",
        "compat.lmcache.wrap_model_name", "the key's model name is not configurable",
        params=("vllm_config", "kv_cache_config")),
    Use("lmcache", _CONNECTOR, "LMCacheMPConnector.worker_adapter", "read", "the worker side of the connector",
        "compat.lmcache.worker_adapter", _NO_CONFIG, assigned_in="LMCacheMPConnector.__init__"),
    Use("lmcache", _CONNECTOR, "LMCacheMPConnector.scheduler_adapter", "read", "the scheduler side of the connector",
        "compat.lmcache.release_prefix_hit", _NO_CONFIG, assigned_in="LMCacheMPConnector.__init__"),
    Use("lmcache", _CONNECTOR, "LMCacheMPConnector.request_trackers", "read",
        "request id -> tracker of each request the scheduler side follows", "compat.lmcache.release_prefix_hit",
        _NO_CONFIG, assigned_in="LMCacheMPConnector.__init__"),
    *(Use("lmcache", _CONNECTOR, f"{_TRACKER}.{field}", kind, what, "compat.lmcache.release_prefix_hit",
          _NO_CONFIG, assigned_in=f"{_TRACKER}.__init__")
      for field, kind, what in (
          ("num_lmcache_hit_tokens", "write", "tokens the lookup found (their locks are held)"),
          ("cache_salt", "read", "the request's cache salt, passed back to free_lookup_locks"),
          ("request_configs", "read", "the request's LMCache options, passed back to free_lookup_locks"),
          ("max_offload_tokens", "write", "0 stores none of the request's KV"))),
    Use("lmcache", _CONNECTOR, f"{_TRACKER}.num_scheduled_tokens", "write",
        "tokens whose KV is computed: a store reaches this far", "compat.lmcache.release_prefix_hit", _NO_CONFIG),
    Use("lmcache", _CONNECTOR, f"{_TRACKER}.get_token_ids", "call", "the request's token ids",
        "compat.lmcache.release_prefix_hit", _NO_CONFIG, params=("self",)),
    Use("lmcache", _ADAPTERS, "LMCacheMPSchedulerAdapter.free_lookup_locks", "call",
        "releases the read locks a lookup took, without retrieving", "compat.lmcache.release_prefix_hit",
        _NO_CONFIG, params=("self", "token_ids", "start", "end", "request_id", "cache_salt", "request_configs")),
    Use("lmcache", _ADAPTERS, "LMCacheMPWorkerAdapter.submit_store_request", "replace",
        "the worker adapter's per-request store (wrapped on the instance)", "compat.lmcache.guard_worker_stores",
        "a timed-out store raises through vLLM's engine step; no option drops it",
        params=("self", "request_id", "op", "event", "cache_salt", "request_configs")),
    Use("lmcache", _ADAPTERS, "LMCacheMPWorkerAdapter._completed_store_requests", "write",
        "request id -> receipts counted before lazy offload unpins its blocks", "compat.lmcache.guard_worker_stores",
        _NO_CONFIG, assigned_in="LMCacheMPWorkerAdapter.__init__"),
    Use("lmcache", _ADAPTERS, "LMCacheMPWorkerAdapter._failed_store_requests", "write",
        "ids of stores that failed", "compat.lmcache.guard_worker_stores", _NO_CONFIG,
        assigned_in="LMCacheMPWorkerAdapter.__init__"),
    Use("lmcache", _ADAPTERS, "LMCacheMPWorkerAdapter.lazy_offload", "read", "whether stores are lazily offloaded",
        "compat.lmcache.guard_worker_stores", _NO_CONFIG, assigned_in="LMCacheMPWorkerAdapter.__init__"),
    Use("lmcache", "lmcache.v1.config", "_CONFIG_DEFINITIONS", "read",
        "a module-level dict literal whose keys are the in-process config's keys (read from the source)",
        "compat.lmcache.config_keys", "LMCache lists its config keys nowhere public"),
    Use("lmcache", _KERNELS, _KERNEL, "replace",
        "the per-layer packed-K/V copy between chunks and paged KV, looked up by module-level name",
        "compat.lmcache.replace_transfer_kernel", "transfer kernels are not pluggable",
        params=("layer_tensors", "object_tensors", "block_ids", "n_block_ids", "blocks_per_object", "block_size",
                "format_spec", "is_d2h", "skip_prefix_n_blocks")),
    Use("lmcache", _KERNELS, _VALID_RANGE, "call", "(first, end, token offset) of an object's valid blocks",
        "compat.lmcache.replace_transfer_kernel", "a private helper of the kernel replaced",
        params=("object_idx", "n_block_ids", "blocks_per_object", "block_size", "skip_prefix_n_blocks")),
)


INTERNAL: tuple[Use, ...] = (
    Use("lmcache", "lmcache.v1.multiprocess.transport.factory", "RequestClientFactory.create", "call",
        "a request client for the MP cache server (its readiness probe: get_chunk_size)",
        "lmi_server.kvcache.mp_server", "LMCache's MP server has no documented client API",
        params=("server_url", "context"), private=False),
)
"""Public-named entry points of LMCache's internal modules that callers use in place (not patched)."""

def wrap_model_name(wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace LMCache's model-name function by `wrap(original)` once per process (the wrapper
    carries attribute `mark`)."""
    from lmcache.integration.vllm import lmcache_mp_connector as connector

    current = connector.get_dcp_decorated_model_name
    if not getattr(current, mark, False):
        wrapper = wrap(current)
        wrapper.__wrapped__ = current  # the contract check reads LMCache's signature through it
        connector.get_dcp_decorated_model_name = wrapper


def worker_adapter(connector: Any) -> Any:
    """The connector's worker adapter (None in the scheduler process)."""
    return getattr(connector, "worker_adapter", None)


def scheduler_adapter(connector: Any) -> Any:
    """The connector's scheduler adapter (None in a worker process)."""
    return getattr(connector, "scheduler_adapter", None)


def guard_worker_stores(adapter: Any, log: logging.Logger) -> None:
    """A store that times out is logged and dropped, as LMCache drops a store submitted while the
    cache server is known to be unhealthy (lazy offload still gets the receipt it waits for)."""
    submit = adapter.submit_store_request

    def submit_store_request(request_id: str, *args: Any, **kwargs: Any) -> None:
        try:
            submit(request_id, *args, **kwargs)
        except TimeoutError as exc:
            if getattr(adapter, "lazy_offload", False):
                # Lazy offload waits for one receipt per rank before it unpins the blocks.
                adapter._completed_store_requests[request_id] = 1
                adapter._failed_store_requests.add(request_id)
            log.warning("LMCache store for request %s dropped: %s", request_id, exc)

    adapter.submit_store_request = submit_store_request


def release_prefix_hit(connector: Any, request_id: str, computed_tokens: int, *, store: bool) -> None:
    """Load nothing for `request_id` through LMCache's prefix path: free the lookup's locks; with
    `store`, tell LMCache `computed_tokens` are computed (its store then reaches that far), else
    store none of the request's KV."""
    tracker = connector.request_trackers.get(request_id)
    if tracker is None:
        return
    if tracker.num_lmcache_hit_tokens:
        connector.scheduler_adapter.free_lookup_locks(
            token_ids=tracker.get_token_ids(), start=0, end=tracker.num_lmcache_hit_tokens,
            request_id=request_id, cache_salt=tracker.cache_salt, request_configs=tracker.request_configs,
        )
    tracker.num_lmcache_hit_tokens = 0
    if store:
        tracker.num_scheduled_tokens = computed_tokens
    else:
        tracker.max_offload_tokens = 0


def replace_transfer_kernel(make: Callable[[Any, Any], Any], mark: str) -> bool | None:
    """Replace LMCache's per-layer packed-K/V transfer kernel by `make(original, valid_range)`
    (which carries attribute `mark`): True when in place (now or before), False when this LMCache
    has no such kernel, None when LMCache's torch kernels do not import."""
    try:
        from lmcache.v1.platform.torch_ops import mp_mem_kernels
    except ImportError:
        return None
    original = getattr(mp_mem_kernels, _KERNEL, None)
    valid_range = getattr(mp_mem_kernels, _VALID_RANGE, None)
    if original is None or valid_range is None:
        return False
    if getattr(original, mark, False):
        return True
    kernel = make(original, valid_range)
    kernel.__wrapped__ = original  # the contract check reads LMCache's signature through it
    setattr(mp_mem_kernels, _KERNEL, kernel)
    return True


def config_keys() -> frozenset[str]:
    """Every key LMCache's in-process config defines, read from the installed `lmcache/v1/config.py`
    without importing it (importing lmcache pulls in torch); empty when it cannot be read."""
    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    path = Path(next(iter(spec.submodule_search_locations))) / "v1" / "config.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return frozenset()
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_CONFIG_DEFINITIONS" and isinstance(node.value, ast.Dict):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return frozenset()
