"""A request's segments looked up in the LMCache server, each as a request of its own.

Why: the server keys chunks by a hash chain from a request's first token, so a segment sent with
its own token ids (from 0) and the request's cache salt gets keys that do not depend on where it
stands in the prompt: no change to the server. This is the `lookup` that `plan.plan_prompt` takes,
over the scheduler adapter LMCache's MP connector already has (`maybe_submit_lookup_request` /
`check_lookup_result`, non-blocking: None while the server has not answered).

A lookup locks the chunks it found until they are retrieved; `release` frees the locks of hits
that will not be (the plan was dropped, the request aborted) and ends each segment's session on
the server, so nothing waits for the locks' TTL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class SchedulerAdapter(Protocol):
    """What this module uses of LMCache's `LMCacheMPSchedulerAdapter` (0.5.6)."""

    def maybe_submit_lookup_request(self, request_id: str, token_ids: list[int], cache_salt: str = ...,
                                    request_configs: dict[str, Any] | None = ..., reserve_last_token: bool = ...) -> None: ...

    def check_lookup_result(self, request_id: str) -> int | None: ...

    def free_lookup_locks(self, token_ids: list[int], start: int, end: int, request_id: str,
                          cache_salt: str = ..., request_configs: dict[str, Any] | None = ...) -> None: ...

    def end_session(self, request_id: str) -> None: ...

    def cleanup_lookup_result(self, request_id: str) -> None: ...


def segment_request_id(request_id: str, token_ids: Sequence[int]) -> str:
    """The id a segment's lookup runs under: the request's, plus a digest of the segment's tokens
    (the same segment twice in one prompt is one lookup)."""
    digest = hashlib.sha1(b",".join(str(t).encode() for t in token_ids)).hexdigest()[:16]
    return f"{request_id}#blend-{digest}"


@dataclass
class SegmentLookups:
    adapter: SchedulerAdapter
    request_id: str
    cache_salt: str = ""
    request_configs: dict[str, Any] | None = None
    _tokens: dict[str, list[int]] = field(default_factory=dict)
    _hits: dict[str, int] = field(default_factory=dict)

    def __call__(self, token_ids: Sequence[int]) -> int | None:
        """Tokens of the segment's head the server holds (whole chunks), None while it has not answered."""
        rid = segment_request_id(self.request_id, token_ids)
        if rid in self._hits:
            return self._hits[rid]
        if rid not in self._tokens:
            self._tokens[rid] = list(token_ids)
            self.adapter.maybe_submit_lookup_request(rid, token_ids=self._tokens[rid], cache_salt=self.cache_salt,
                                                     request_configs=self.request_configs, reserve_last_token=False)
        hit = self.adapter.check_lookup_result(rid)
        if hit is not None:
            self._hits[rid] = int(hit)
        return hit

    def segment_id(self, token_ids: Sequence[int]) -> str:
        """The request id the worker retrieves this segment's hit under."""
        return segment_request_id(self.request_id, token_ids)

    def release(self, retrieved: Sequence[str] = ()) -> None:
        """Free the locks of every hit not in `retrieved` (segment ids), end every segment's session
        on the server and forget the lookups."""
        kept = set(retrieved)
        for rid, tokens in self._tokens.items():
            hit = self._hits.get(rid, 0)
            if hit and rid not in kept:
                self.adapter.free_lookup_locks(tokens, 0, hit, rid, cache_salt=self.cache_salt,
                                               request_configs=self.request_configs)
            self.adapter.end_session(rid)
            self.adapter.cleanup_lookup_result(rid)
        self._tokens.clear()
        self._hits.clear()
