"""The scheduler's half of blending: which prompts to blend, what the worker does for each, and
what vLLM is told.

For every new request the connector asks `decide`: the prompt is cut at the separator (or at the
document boundaries the request gives, `kv_transfer_params.lmi_blend_boundaries`; where it has
neither, where its content says: `segments.split_at_content`) and each segment looked up in the segment store (`store.py`). Where the cached segments cover at least
`min_reused_tokens` and the blend would compute less than what LMCache's prefix hit leaves to
compute (`blend_cost`; a request that names its own ratio skips this rule), the request is
*blended*: the connector reports every prompt token but the last as loaded synchronously, vLLM
allocates blocks for the whole prompt and schedules the last token, and the worker, before that
step's forward, fills the blocks with the blended KV (`worker.py`); LMCache then stores that KV as
the prompt's prefix (`stores_as_prefix`). A prompt with segments but too little of them cached
is served as usual and its segments are *stored* from the paged KV once its prefill is done, so
the next prompt that holds them (in any order) reuses them.

Jobs travel to the worker in the step's connector metadata (`lmi_blend_jobs`); they are plain data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lmi_server.kvcache.blend.modes import DEFAULT_MODE
from lmi_server.kvcache.blend.plan import BlendPlan, SegmentReuse, plan_prompt
from lmi_server.kvcache.blend.segments import ContentCuts, ContextKeys, Separator, key_salt
from lmi_server.kvcache.blend.settings import (
    BlendConfig,
    names_own_blend,
    prompt_boundaries,
    request_mode,
    request_ratio,
)
from lmi_server.kvcache.blend.store import SegmentStore

logger = logging.getLogger("lmi_server.kvcache.blend")


@dataclass
class BlendJob:
    """Blend this request's prompt into its blocks before this step's forward."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    segments: list[tuple[int, int, int]]
    """(start, length, cached tokens) of each segment."""
    salt: bytes
    recompute_ratio: float
    to_store: list[tuple[int, int, int]] = field(default_factory=list)
    """Segments that missed, stored from the blended prefill's KV (the plan's `to_store`)."""
    exact: list[tuple[int, int]] = field(default_factory=list)
    """(start, length) of segments whose cached KV is exact here: kept, not recomputation candidates."""
    prefix: int = 0
    """Tokens at the prompt's head whose KV vLLM's prefix cache put in the blocks: read, kept, not written."""
    mode: str = DEFAULT_MODE
    """`cacheblend` (the ratio's share by deviation at the check layer) or `epic` (`epic_tokens` per span)."""
    epic_tokens: int = 0


@dataclass
class StoreJob:
    """After this step's forward (which completes the prefill), store these segments' KV."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    segments: list[tuple[int, int, int]]
    """(start, length, tokens already stored) of each segment to store."""
    salt: bytes
    contexts: list[bytes] = field(default_factory=list)
    """Per segment to store, the context key of its end: the prompt was computed in full, so the
    stored KV is exact after that prefix (`SegmentStore.mark_exact`)."""


@dataclass
class _Tracked:
    request: Any
    plan: BlendPlan
    blend: bool
    own_ratio: bool = False
    """The request named its own recompute ratio (`kv_transfer_params`)."""
    block_ids: list[int] = field(default_factory=list)
    done: bool = False


class BlendScheduler:
    """Per-request blend decisions and the jobs they turn into, in the engine's scheduler process."""

    def __init__(self, config: BlendConfig, separator: Separator, content: ContentCuts | None = None,
                 num_layers: int = 0) -> None:
        self.config = config
        self.separator = separator
        self.content = content
        self.check_cost = (config.check_layer + 1) / num_layers if num_layers > config.check_layer else 0.0
        """The share of a full prefill the blend spends on every token, reused or not: the layers
        below the check layer and the check layer's Q/K/V."""
        self.store = open_store(config)
        self._tracked: dict[str, _Tracked] = {}

    @classmethod
    def from_vllm_config(cls, config: BlendConfig, vllm_config: Any) -> BlendScheduler:
        """Tokenize the separator and read the tokenizer's line breaks and special tokens (once, here)."""
        from transformers import AutoTokenizer

        model_config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(
            model_config.tokenizer, revision=model_config.tokenizer_revision,
            trust_remote_code=model_config.trust_remote_code,
        )
        hf_config = getattr(model_config, "hf_text_config", None) or model_config.hf_config
        return cls(config, Separator.from_tokenizer(tokenizer, config.separator), content_cuts(tokenizer, config.chunk_size),
                   int(getattr(hf_config, "num_hidden_layers", 0) or 0))

    def salt(self, request: Any) -> bytes:
        return key_salt(self.config.model_identity, getattr(request, "cache_salt", None))

    def decide(self, request: Any, prefix_hit_tokens: int, local_hit_tokens: int = 0) -> int | None:
        """Tokens to report as loaded (every prompt token but the last, past the `local_hit_tokens`
        vLLM's prefix cache holds) when this request is blended; None when it is served as usual (its
        segments then stored after its prefill, if any is new). `prefix_hit_tokens`: the whole
        prefix hit, vLLM's and LMCache's."""
        request_id = request.request_id
        self._tracked.pop(request_id, None)
        if getattr(request, "lora_request", None) is not None:
            return None  # LoRA layers need the engine's batch metadata; the blend forward has none
        if getattr(request, "mm_features", None):
            # an image is a run of identical placeholder tokens: segments keyed by token ids cannot
            # tell two pictures apart (LMCache's prefix keys can: it folds the images' hashes in)
            return None
        prompt = list(request.prompt_token_ids or ())
        if len(prompt) != request.num_tokens:
            return None  # resumed with output tokens: the plain path
        salt = self.salt(request)
        params = getattr(request, "kv_transfer_params", None)
        own_ratio = names_own_blend(params)
        try:
            ratio = request_ratio(params, self.config.recompute_ratio)
            mode, epic_tokens = request_mode(params, self.config.mode, self.config.epic_tokens)
            boundaries = prompt_boundaries(params, len(prompt))
        except ValueError as exc:
            # The API refuses these with a 400 where it can (offsets past a text prompt's end are
            # known only here): served as usual, and said so.
            logger.warning("request %s is not blended: %s", request_id, exc)
            return None
        contexts = ContextKeys(prompt, salt)
        plan = plan_prompt(
            prompt, self.separator, lambda ids: self.store.cached_tokens(ids, salt),
            recompute_ratio=ratio, chunk_size=self.config.chunk_size, min_reused_tokens=0, boundaries=boundaries,
            content=self.content, exact=lambda seg: self.store.is_exact(seg.token_ids, salt, contexts.at(seg.end)),
            prefix=local_hit_tokens, mode=mode, epic_tokens=epic_tokens,
        )
        if not isinstance(plan, BlendPlan):
            return None
        # A request that names its ratio asked for a blend at that ratio: it gets one whenever its
        # segments are found (the cost rule is the server's choice for the others).
        blend = plan.segment_reused_tokens >= self.config.min_reused_tokens and (
            own_ratio or self.blend_cost(plan) < len(prompt) - prefix_hit_tokens)
        if blend or plan.to_store(self.config.chunk_size):
            self._tracked[request_id] = _Tracked(request, plan, blend, own_ratio)
        if blend:
            logger.debug("blending request %s: %s", request_id, plan.to_dict())
            return plan.external_tokens - local_hit_tokens
        return None

    def blend_cost(self, plan: BlendPlan) -> float:
        """Tokens' worth of a full prefill the blend costs (every token up to the check layer, then
        what it computes and recomputes), to weigh against what LMCache's prefix leaves to compute:
        a prompt whose prefix hit covers nearly everything is cheaper served as a prefix, whatever
        its segments."""
        if plan.mode == "epic":
            check = 0.0  # EPIC has no check layer
        elif plan.mode == "guided":
            check = float(plan.computed_tokens)  # no check layer: a first pass of the computed tokens
        else:
            check = plan.prompt_len * self.check_cost
        return check + plan.computed_tokens + plan.recomputed_tokens

    def stores_as_prefix(self, request_id: str) -> bool:
        """Whether a blended request's KV is stored in LMCache as its prompt's prefix: yes at the
        server's ratio, so LMCache's prefixes hold either exact KV or KV blended as the server
        blends; not for a request that named its own ratio."""
        tracked = self._tracked.get(request_id)
        return tracked is not None and tracked.blend and not tracked.own_ratio

    def is_blended(self, request_id: str) -> bool:
        tracked = self._tracked.get(request_id)
        return tracked is not None and tracked.blend

    def on_alloc(self, request_id: str, block_ids: Sequence[int]) -> None:
        tracked = self._tracked.get(request_id)
        if tracked is not None:
            tracked.block_ids = list(block_ids)

    def jobs(self, scheduler_output: Any) -> list[BlendJob | StoreJob]:
        """This step's jobs: blends of newly scheduled blended requests, stores of requests whose
        prefill completes in this step."""
        if not self._tracked:
            return []
        jobs: list[BlendJob | StoreJob] = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is not None:
                tracked.block_ids = list(new.block_ids[0])
                jobs.extend(self._job(new.req_id, tracked, new.num_computed_tokens + scheduled.get(new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        for idx, request_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(request_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[idx]
            if new_blocks and request_id not in cached.resumed_req_ids:
                tracked.block_ids.extend(new_blocks[0])
            jobs.extend(self._job(request_id, tracked, cached.num_computed_tokens[idx] + scheduled.get(request_id, 0)))
        return jobs

    def _job(self, request_id: str, tracked: _Tracked, computed_after_step: int) -> list[BlendJob | StoreJob]:
        if tracked.done:
            return []
        plan, request = tracked.plan, tracked.request
        if tracked.blend:
            tracked.done = True
            _report_cached_tokens(request, plan)
            return [BlendJob(request_id, list(request.prompt_token_ids), list(tracked.block_ids),
                             [_triple(s) for s in plan.segments], self.salt(request), plan.recompute_ratio,
                             [_triple(s) for s in plan.to_store(self.config.chunk_size)],
                             [(s.start, s.length) for s in plan.segments if s.exact], plan.prefix,
                             plan.mode, plan.epic_tokens)]
        if computed_after_step < plan.prompt_len:
            return []
        tracked.done = True
        to_store = plan.to_store(self.config.chunk_size)
        salt = self.salt(request)
        contexts = ContextKeys(request.prompt_token_ids, salt)
        return [StoreJob(request_id, list(request.prompt_token_ids), list(tracked.block_ids),
                         [_triple(s) for s in to_store], salt, [contexts.at(s.end) for s in to_store])]

    def finished(self, request_id: str) -> None:
        self._tracked.pop(request_id, None)


def content_cuts(tokenizer: Any, chunk_size: int) -> ContentCuts:
    """Pieces of one chunk at most (each stored as one), about half a chunk on average."""
    avg = max(2, min(128, chunk_size))
    low = max(1, avg // 2)
    return ContentCuts.from_tokenizer(tokenizer, min_len=low, avg_len=avg, max_len=chunk_size, window=min(8, low))


def open_store(config: BlendConfig) -> SegmentStore:
    return SegmentStore(config.store_dir, chunk_size=config.chunk_size, max_bytes=config.store_max_bytes)


def _triple(seg: SegmentReuse) -> tuple[int, int, int]:
    return (seg.start, seg.length, seg.cached)


def _report_cached_tokens(request: Any, plan: BlendPlan) -> None:
    """The usage a client sees (`prompt_tokens_details.cached_tokens`) counts the tokens whose KV
    was reused and kept, not the `prompt_len - 1` the connector reported as loaded."""
    stats = getattr(request, "prefill_stats", None)
    if stats is None:
        return
    kept = max(0, plan.reused_tokens - plan.recomputed_tokens)
    local = min(plan.prefix, kept)
    stats.num_cached_tokens = kept
    stats.num_external_cached_tokens = kept - local
    stats.num_local_cached_tokens = local
    stats.num_computed_tokens = stats.num_prompt_tokens - kept
