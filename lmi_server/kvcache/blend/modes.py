"""The blend modes and their per-request checks, torch-free (the API and the scheduler use them):
`cacheblend` recomputes the share of reused tokens whose KV deviates most at a check layer
(`forward.blend_prefill`), `epic` the first tokens of each span of reused tokens (`epic.py`),
`guided` the share of reused tokens the question attends to most (`guided.py`)."""

from __future__ import annotations

from collections.abc import Sequence

MODES = ("cacheblend", "epic", "guided")
"""The blend modes: CacheBlend's deviation-picked share, EPIC's first tokens of each span, or the
question-guided share."""
DEFAULT_MODE = "guided"
"""The question-guided share keeps LMCache's rag-qa-quality score within 2 points of a full prefill on
the assistant, where CacheBlend's deviation and EPIC's span heads lose 4-5 (README, blend modes)."""
DEFAULT_EPIC_TOKENS = 32
MAX_EPIC_TOKENS = 4096


def validate_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"the blend mode must be one of {', '.join(MODES)}, got {str(mode)[:40]!r}")
    return str(mode)


def validate_epic_tokens(tokens: object) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= MAX_EPIC_TOKENS:
        raise ValueError(f"the EPIC token count must be an integer in [0, {MAX_EPIC_TOKENS}], got {str(tokens)[:40]!r}")
    return tokens


def recomputed_count(candidates: Sequence[bool], k: int) -> int:
    """How many reused tokens `select_epic` recomputes, from a plain mask (the scheduler's cost)."""
    total = run = 0
    for flag in candidates:
        run = run + 1 if flag else 0
        total += 1 if flag and run <= k else 0
    return total
