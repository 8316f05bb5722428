"""The scheduler's blend plan for one prompt: which of its tokens come from cached segments, which
the blend forward computes, and how many tokens the connector reports to vLLM.

Why a plan: vLLM asks the connector once per request (`get_num_new_matched_tokens`) how many of
its prompt tokens the connector will supply, and may ask again while lookups are pending. A
blended prompt is supplied whole except its last token, which vLLM computes itself against the
blended KV; the worker (`start_load_kv`) then follows the plan the scheduler made. The plan is
pure bookkeeping: no torch, no vLLM, the cache lookups passed in.

Each segment is looked up as a request of its own (its token ids from 0, the request's cache
salt), so its hit is the segment's head in whole chunks, wherever it stands in this prompt
(`segments.py`). A segment shorter than a chunk, and a segment's tail past its last whole chunk,
are computed; so are separators and segments that missed. Segments with a whole chunk missing are
stored after the forward (K at segment-local positions), so the next prompt that holds them reuses
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from lmi_server.kvcache.blend.modes import DEFAULT_MODE, recomputed_count
from lmi_server.kvcache.blend.recompute import validate_ratio
from lmi_server.kvcache.blend.segments import (
    DEFAULT_CHUNK_SIZE,
    MIN_SEGMENT,
    ContentCuts,
    Segment,
    SegmentationError,
    Separator,
    split_at_boundaries,
    split_at_content,
    split_at_separator,
)

DEFAULT_MIN_REUSED_TOKENS = 256
"""Below this many reused tokens the plain path is cheaper than blending (LMCache's `blend_min_tokens`)."""

Lookup = Callable[[Sequence[int]], "int | None"]
"""A segment's token ids -> how many of its first tokens are cached (whole chunks), None while pending."""


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Final = _Pending()
"""A lookup has not answered yet: ask again on the next scheduler step (vLLM's `None` matched tokens)."""


@dataclass(frozen=True)
class SegmentReuse:
    start: int
    """Offset of the segment's first token in the prompt."""
    length: int
    cached: int
    """Tokens of the segment's head that come from the cache (0: computed, and stored after)."""
    exact: bool = False
    """Cached whole, with KV computed after the very same prompt prefix: kept, never recomputed."""

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class BlendPlan:
    prompt_len: int
    segments: tuple[SegmentReuse, ...]
    recompute_ratio: float
    pieces: bool = False
    """Cut where the content says (`segments.split_at_content`): every segment is one chunk at most
    and is stored whole, its tail included; else documents, stored in whole chunks."""
    prefix: int = 0
    """Tokens `[0, prefix)` whose KV vLLM's prefix cache already holds in the request's blocks: kept
    as they are (exact here), neither loaded nor written; segments start at or after it."""
    mode: str = DEFAULT_MODE
    """`cacheblend` (the ratio's share, picked at the check layer), `epic` (`epic_tokens` per span) or
    `guided` (the ratio's share, picked by the question's attention)."""
    epic_tokens: int = 0

    @property
    def external_tokens(self) -> int:
        """What the connector reports to vLLM: every prompt token but the last, which vLLM computes."""
        return self.prompt_len - 1

    def reused_offsets(self) -> list[int]:
        """Prompt offsets whose KV comes from the cache (re-rotated to here), the last token never."""
        last = self.prompt_len - 1
        held = list(range(min(self.prefix, last)))
        return held + [i for seg in self.segments for i in range(seg.start, seg.start + seg.cached) if i < last]

    @property
    def reused_tokens(self) -> int:
        return len(self.reused_offsets())

    @property
    def segment_reused_tokens(self) -> int:
        """Reused tokens that come from cached segments (not from vLLM's prefix cache)."""
        return self.reused_tokens - min(self.prefix, self.prompt_len - 1)

    @property
    def exact_tokens(self) -> int:
        """Reused tokens whose KV is exact where it stands (not candidates for recomputation)."""
        last = self.prompt_len - 1
        return min(self.prefix, last) + sum(
            min(seg.end, last) - seg.start for seg in self.segments if seg.exact and seg.start < last)

    @property
    def computed_tokens(self) -> int:
        """Tokens the blend forward computes in full: separators, misses, segment tails (the last token
        is vLLM's and counted here too)."""
        return self.prompt_len - self.reused_tokens

    @property
    def recomputed_tokens(self) -> int:
        """Reused tokens whose KV is recomputed as well: the ratio's share of those not exact (at most;
        `cacheblend`), or the first `epic_tokens` of each span of them (`epic`)."""
        if self.mode == "epic":
            return recomputed_count(self._candidates(), self.epic_tokens)
        return math.ceil(self.recompute_ratio * (self.reused_tokens - self.exact_tokens) - 1e-9)

    def _candidates(self) -> list[bool]:
        """Per prompt token: reused and not exact (what EPIC's spans are made of)."""
        last = self.prompt_len - 1
        mask = [False] * self.prompt_len
        for seg in self.segments:
            if not seg.exact:
                for i in range(seg.start, min(seg.start + seg.cached, last)):
                    mask[i] = True
        return mask

    def to_store(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[SegmentReuse]:
        """Segments to store after the forward: pieces not cached; documents with a whole chunk not
        cached (a document shorter than a chunk is never stored). What is stored is not stored again."""
        if self.pieces:
            return [seg for seg in self.segments if seg.cached < seg.length]
        return [seg for seg in self.segments if seg.cached < seg.length // chunk_size * chunk_size]

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_len,
            "segments": [{"start": s.start, "length": s.length, "cached": s.cached, "exact": s.exact} for s in self.segments],
            "reused_tokens": self.reused_tokens,
            "computed_tokens": self.computed_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "cut": "content" if self.pieces else "documents",
            "mode": self.mode,
            "prefix_cached": self.prefix,
        }


def plan_prompt(
    token_ids: Sequence[int],
    separator: Separator | Sequence[int],
    lookup: Lookup,
    *,
    recompute_ratio: float,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    min_reused_tokens: int = DEFAULT_MIN_REUSED_TOKENS,
    boundaries: Sequence[int] | None = None,
    content: ContentCuts | None = None,
    exact: Callable[[Segment], bool] | None = None,
    prefix: int = 0,
    mode: str = DEFAULT_MODE,
    epic_tokens: int = 0,
) -> BlendPlan | None | _Pending:
    """The plan for `token_ids`, cut at the document `boundaries` the request gave, else at the
    separator, else (where the prompt holds no separator and `content` is given) where its content
    says (`exact(segment)` tells, for a segment cached whole, whether its KV was computed after
    this very prefix); PENDING while a segment's lookup has not answered, or None where
    blending would not pay (fewer than two segments: prefix caching covers one; or fewer than
    `min_reused_tokens` reused). A lookup's answer that is not whole chunks of the segment (or
    the whole segment) is a SegmentationError: the cache and the plan disagree on the chunk size."""
    validate_ratio(recompute_ratio)
    if chunk_size <= 0:
        raise SegmentationError(f"chunk_size must be positive, got {chunk_size}")
    pieces = False
    if boundaries is not None:
        segments = split_at_boundaries(token_ids, boundaries)
    else:
        segments = split_at_separator(token_ids, separator)
        if len(segments) < 2 and content is not None:
            segments, pieces = split_at_content(token_ids, content), True
    if len(segments) < 2:
        return None
    # vLLM's prefix cache holds [0, prefix): segments inside it are not looked up; one that
    # straddles it is computed past it (and not stored: what is stored is whole segments)
    segments = [seg for seg in segments if seg.start >= prefix]
    smallest = MIN_SEGMENT if pieces else chunk_size
    answers: list[int | None] = [lookup(seg.token_ids) if len(seg) >= smallest else 0 for seg in segments]
    if any(answer is None for answer in answers):
        return PENDING
    reuse = tuple(_checked(seg, int(answer), chunk_size) for seg, answer in zip(segments, answers))
    if exact is not None:
        reuse = tuple(
            SegmentReuse(r.start, r.length, r.cached, True) if r.cached == r.length and exact(seg) else r
            for r, seg in zip(reuse, segments)
        )
    plan = BlendPlan(len(token_ids), reuse, recompute_ratio, pieces, prefix, mode, epic_tokens)
    if plan.segment_reused_tokens < min_reused_tokens:
        return None
    return plan


def _checked(seg: Segment, cached: int, chunk_size: int) -> SegmentReuse:
    if not 0 <= cached <= len(seg) or (cached % chunk_size and cached != len(seg)):
        raise SegmentationError(
            f"the cache answered {cached} tokens for a segment of {len(seg)}: not whole chunks of {chunk_size}"
        )
    return SegmentReuse(seg.start, len(seg), cached)
