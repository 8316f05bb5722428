"""The worker's half of blending: run the blended prefill of a request into its KV blocks, and
store segments' KV from the blocks, inside the engine's worker process.

A `BlendJob` (before the step's forward): the cached segments are read from the store, K moved
to the segments' places in this prompt (`forward.place_segments`), the blended prefill runs over
the model's own modules (`forward.blend_prefill` with `VLLMLlamaAdapter`), and every layer's KV of
the prompt's tokens but the last is written into the request's blocks (`paged.scatter`). vLLM's
forward then computes the last token against that KV. Segments that missed are stored from the
result, K moved back to segment-local positions.

A `StoreJob` (after the forward that completed a prefill served as usual): each segment's KV is
read from the blocks (`paged.store_segment`) and stored.

The model: vLLM's connector API hands the connector the KV caches, never the model, so the
worker finds the served model's module among the process's live objects once (the one instance of
the architecture the engine built).
"""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lmi_server.kvcache.blend import forward, paged
from lmi_server.kvcache.blend.epic import epic_prefill
from lmi_server.kvcache.blend.guided import guided_prefill
from lmi_server.kvcache.blend.rope import RopeSpec, rerotate
from lmi_server.kvcache.blend.scheduling import BlendJob, StoreJob, open_store
from lmi_server.kvcache.blend.settings import BlendConfig
from lmi_server.kvcache.blend.store import BlendCounters

logger = logging.getLogger("lmi_server.kvcache.blend")

_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


class BlendWorkerError(RuntimeError):
    """The worker cannot blend in this engine; the message says why."""


def layers_in_order(kv_caches: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The paged KV tensors by decoder layer index (vLLM names them `model.layers.<i>.self_attn.attn`)."""
    indexed = []
    for name, tensor in kv_caches.items():
        match = _LAYER_INDEX.search(name)
        if match is None:
            raise BlendWorkerError(f"KV cache layer {name!r} has no decoder layer index")
        indexed.append((int(match.group(1)), tensor))
    indexed.sort(key=lambda item: item[0])
    if [i for i, _ in indexed] != list(range(len(indexed))):
        raise BlendWorkerError("the KV cache does not hold one tensor per decoder layer 0..N-1")
    return [tensor for _, tensor in indexed]


def find_model(architecture: str) -> Any:
    """The engine's model instance of `architecture` in this process."""
    found = [obj for obj in gc.get_objects()
             if type(obj).__name__ == architecture and isinstance(obj, torch.nn.Module)]
    if len(found) != 1:
        raise BlendWorkerError(f"expected one {architecture} in the engine's worker, found {len(found)}")
    return found[0]


class _Clock:
    """Seconds per phase of one blend, for the log."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now

    @property
    def total(self) -> float:
        return sum(self.laps.values())

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.3f} s" for name, seconds in self.laps.items())


class BlendWorker:
    def __init__(self, config: BlendConfig, hf_config: Mapping[str, Any], architecture: str, model: Any = None) -> None:
        self.config = config
        self.spec = RopeSpec.from_hf_config(hf_config)
        self.architecture = architecture
        self.store = open_store(config)
        self.counters = BlendCounters(config.store_dir)
        self.layers: list[torch.Tensor] = []
        self._adapter: forward.VLLMLlamaAdapter | None = forward.VLLMLlamaAdapter(model) if model is not None else None

    def register(self, kv_caches: Mapping[str, torch.Tensor], attention_layers: Mapping[str, Any] | None = None) -> None:
        self.layers = layers_in_order(kv_caches)
        for layer in (attention_layers or {}).values():
            isa = getattr(layer, "isa", None)
            if isa is not None:
                paged.check_isa(isa)

    @property
    def block_size(self) -> int:
        return int(self.layers[0].shape[2])

    def adapter(self) -> forward.VLLMLlamaAdapter:
        if self._adapter is None:
            self._adapter = forward.VLLMLlamaAdapter(find_model(self.architecture))
            if self._adapter.num_layers != len(self.layers):
                raise BlendWorkerError(
                    f"the model has {self._adapter.num_layers} layers, the KV cache {len(self.layers)}")
        return self._adapter

    def run(self, jobs: Sequence[BlendJob | StoreJob]) -> None:
        for job in jobs:
            if isinstance(job, BlendJob):
                self.blend(job)
            else:
                self.store_from_blocks(job)

    @torch.inference_mode()
    def blend(self, job: BlendJob) -> None:
        clock = _Clock()
        adapter = self.adapter()
        n = len(job.token_ids)
        pieces, missed = [], 0
        for start, length, cached in job.segments:
            if not cached:
                continue
            kv = self.store.load(job.token_ids[start : start + length], job.salt, cached)
            if kv is None:
                missed += 1
                continue
            pieces.append((start, kv))
        clock.lap("load")
        dtype = self.layers[0].dtype
        reused_kv, reused = forward.place_segments(
            n, pieces, self.spec, num_layers=adapter.num_layers, num_kv_heads=adapter.num_kv_heads,
            head_dim=adapter.head_dim, dtype=dtype,
        )
        exact = torch.zeros(n, dtype=torch.bool)
        if job.prefix:
            # vLLM's prefix cache already holds these tokens' KV in the request's first blocks
            held = paged.slot_mapping(job.block_ids, 0, job.prefix, self.block_size)
            for (k, v), layer in zip(reused_kv, self.layers):
                k[: job.prefix], v[: job.prefix] = paged.gather(layer, held)
            reused[: job.prefix] = True
            exact[: job.prefix] = True
        clock.lap("place")
        for start, length in job.exact:
            exact[start : start + length] = True
        if job.mode == "epic":
            result = epic_prefill(adapter, job.token_ids, reused_kv, reused, tokens=job.epic_tokens,
                                  exact=exact & reused, overwrite_reused=True)
        elif job.mode == "guided":
            result = guided_prefill(adapter, job.token_ids, reused_kv, reused, ratio=job.recompute_ratio,
                                    exact=exact & reused, overwrite_reused=True)
        else:
            result = forward.blend_prefill(adapter, job.token_ids, reused_kv, reused, ratio=job.recompute_ratio,
                                           check_layer=self.config.check_layer, exact=exact & reused,
                                           overwrite_reused=True)  # placed for this job only
        clock.lap("forward")
        slots = paged.slot_mapping(job.block_ids, job.prefix, n - 1 - job.prefix, self.block_size)
        for layer, (k, v) in zip(self.layers, result.kv):
            paged.scatter(layer, slots, k[job.prefix : n - 1], v[job.prefix : n - 1])  # shared prefix blocks stay as they are
        clock.lap("scatter")
        n_reused = int(reused.sum()) - job.prefix  # from segments; the prefix is vLLM's own
        recomputed = int(reused[result.selected].sum()) if n_reused else 0
        stored, written = self._store_missed(job, result.kv)
        clock.lap("store")
        self.counters.add(blended_requests=1, reused_tokens=n_reused - recomputed, recomputed_tokens=recomputed,
                          computed_tokens=n - n_reused - job.prefix, stored_segments=stored, stored_bytes=written,
                          missed_loads=missed, blend_seconds=clock.total)
        logger.info("blended request %s (%s): %d tokens, %d held by vLLM's prefix cache, %d reused, %d of them "
                    "recomputed, %d computed; %s", job.request_id, job.mode, n, job.prefix, n_reused - recomputed, recomputed,
                    n - n_reused - job.prefix, clock)

    def _store_missed(self, job: BlendJob, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, int]:
        """Store the segments the plan says missed, from the blended prefill's own KV (those tokens
        were all computed in full)."""
        stored = written = 0
        for start, length, cached in job.to_store:
            local = torch.arange(length)
            seg_kv = [(self._to_local(k[start : start + length], local, start), v[start : start + length]) for k, v in kv]
            written += self.store.save(job.token_ids[start : start + length], job.salt, seg_kv, skip_tokens=cached)
            stored += 1
        return stored, written

    def _to_local(self, k: torch.Tensor, local: torch.Tensor, start: int) -> torch.Tensor:
        return rerotate(k, local + start, local, self.spec) if start else k

    @torch.inference_mode()
    def store_from_blocks(self, job: StoreJob) -> None:
        stored = written = 0
        contexts = job.contexts or [None] * len(job.segments)
        for (start, length, cached), context in zip(job.segments, contexts):
            slots = paged.slot_mapping(job.block_ids, start, length, self.block_size)
            seg_kv = [paged.store_segment(layer, slots, self.spec, at_start=start, to_start=0) for layer in self.layers]
            written += self.store.save(job.token_ids[start : start + length], job.salt, seg_kv, skip_tokens=cached,
                                       context=context)
            stored += 1
        if stored:
            self.counters.add(stored_segments=stored, stored_bytes=written)
