"""LMCache's MP connector for CPU hosts, with one guard and one faster copy: a KV store that the
cache server does not answer in time is dropped instead of failing the engine step, and KV moves
between LMCache's chunks and vLLM's CPU KV cache block by block (`block_copy`).

With the CPU tier in /dev/shm (engine_driven transfer, `mp_shm`), the worker first asks the cache
server for slots (PREPARE_STORE) and LMCache 0.5.6 raises when that answer does not come within the
connector's RPC timeout. Nothing above it catches the error, so a cache server that dies while a
store is in flight takes the engine down with it. Dropping the store is what the connector itself
does once its health ping has failed: the request keeps its KV in the engine, only the copy in
the cache tier is missing, and later requests recompute those tokens.

With `option.lmcache_blend` on, the same connector also blends (CacheBlend): the scheduler side
decides per prompt (`blend/scheduling.py`), the worker side fills the blocks of blended prompts and
stores segments (`blend/worker.py`); LMCache's prefix path serves every other prompt as before.

vLLM loads this class by name (`kv_connector_module_path` + `kv_connector` in the transfer config);
it runs inside the engine's worker and scheduler processes.
"""

from __future__ import annotations

import logging
from typing import Any

from lmi_server.compat import lmcache as compat_lmcache
from lmi_server.compat import vllm as compat_vllm
from lmi_server.engine_log import engine_logger
from lmi_server.kvcache import block_copy
from lmi_server.kvcache.blend.scheduling import BlendJob, StoreJob
from lmi_server.kvcache.blend.settings import BlendConfig
from lmi_server.kvcache.namespaced_connector import NamespacedLMCacheMPConnector

logger = logging.getLogger("lmi_server.kvcache.connector")


class GuardedLMCacheMPConnector(NamespacedLMCacheMPConnector):
    """`LMCacheMPConnector` (keys in the server's KV namespace) whose worker side survives an
    unanswered store and copies KV block-wise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if block_copy.install():
            logger.info("LMCache KV copies to and from the paged KV cache run block-wise")
        adapter = compat_lmcache.worker_adapter(self)
        if adapter is not None:
            guard_stores(adapter)
        self._blend_scheduler = self._blend_worker = None
        vllm_config = args[0] if args else kwargs.get("vllm_config")
        transfer = getattr(vllm_config, "kv_transfer_config", None)
        config = BlendConfig.from_extra_config(getattr(transfer, "kv_connector_extra_config", None))
        if config is None:
            return
        if compat_lmcache.scheduler_adapter(self) is not None:
            from lmi_server.kvcache.blend.scheduling import BlendScheduler

            self._blend_scheduler = BlendScheduler.from_vllm_config(config, vllm_config)
        if adapter is not None:
            from lmi_server.kvcache.blend.worker import BlendWorker

            hf_config = vllm_config.model_config.hf_config
            self._blend_worker = BlendWorker(config, hf_config.to_dict(), vllm_config.model_config.architecture)
        blend_log = engine_logger("lmi_server.kvcache.blend")
        blend_log.info("KV blending on: segments at %r, recompute ratio %g", config.separator, config.recompute_ratio)

    # --- scheduler side -------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        matched, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        blender = self._blend_scheduler
        if blender is None or matched is None:
            return matched, is_async
        # vLLM's prefix cache holds `num_computed_tokens` (block-aligned): a blend keeps them as they are
        external = blender.decide(request, prefix_hit_tokens=num_computed_tokens + matched,
                                  local_hit_tokens=num_computed_tokens)
        if external is None:
            return matched, is_async
        self._blend_in_place_of_prefix(request, external, store=blender.stores_as_prefix(request.request_id))
        return external, False

    def _blend_in_place_of_prefix(self, request: Any, blended_tokens: int, *, store: bool) -> None:
        """A blended request loads nothing through LMCache's prefix path: free the lookup's locks.

        Its KV is still stored there as this prompt's prefix when `store` (the server's own ratio):
        the blocks hold it once the blend has run, before the step's forward, and LMCache's store
        reads them after the forward (`wait_for_save`). Telling LMCache that `blended_tokens` are
        computed is what lets its store reach past the prefix hit. A later request on the same
        prefix (the next question on a document) then takes a prefix hit instead of blending the
        prompt again. A request that names its own ratio stores nothing there."""
        compat_lmcache.release_prefix_hit(self, request.request_id, blended_tokens, store=store)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if self._blend_scheduler is not None:
            block_ids = blocks.get_block_ids() or ((),)
            self._blend_scheduler.on_alloc(request.request_id, block_ids[0])

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        metadata = super().build_connector_meta(scheduler_output)
        if self._blend_scheduler is not None:
            metadata.lmi_blend_jobs = self._blend_scheduler.jobs(scheduler_output)
        return metadata

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._blend_scheduler is not None:
            self._blend_scheduler.finished(request.request_id)
        return super().request_finished(request, block_ids)

    # --- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        if self._blend_worker is not None:
            from vllm.config import get_layers_from_vllm_config
            from vllm.model_executor.layers.attention import Attention

            layers = get_layers_from_vllm_config(compat_vllm.connector_vllm_config(self), Attention, list(kv_caches))
            self._blend_worker.register(kv_caches, layers)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        super().start_load_kv(forward_context, **kwargs)
        jobs = getattr(compat_vllm.connector_metadata(self), "lmi_blend_jobs", None)
        if self._blend_worker is not None and jobs:
            self._blend_worker.run([job for job in jobs if isinstance(job, BlendJob)])

    def wait_for_save(self) -> None:
        super().wait_for_save()
        jobs = getattr(compat_vllm.connector_metadata(self), "lmi_blend_jobs", None)
        if self._blend_worker is not None and jobs:
            self._blend_worker.run([job for job in jobs if isinstance(job, StoreJob)])


def guard_stores(adapter: Any) -> None:
    """Wrap the worker adapter's per-request store so that a timed-out store is logged and dropped
    (the same outcome as a store submitted while the server is known to be unhealthy)."""
    compat_lmcache.guard_worker_stores(adapter, logger)
