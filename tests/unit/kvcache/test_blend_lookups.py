"""Segment lookups over the LMCache scheduler adapter's protocol (a recording fake adapter: the
server answers after one poll), feeding the scheduler's blend plan."""

from __future__ import annotations

from lmi_server.kvcache.blend.lookups import SegmentLookups, segment_request_id
from lmi_server.kvcache.blend.plan import PENDING, plan_prompt

CHUNK = 4
SEP = (900, 901)
DOC_A, DOC_B = list(range(10, 18)), list(range(20, 29))


class FakeAdapter:
    """Answers a lookup on the second poll with the whole chunks of the stored heads."""

    def __init__(self, stored):
        self.stored = [tuple(s) for s in stored]
        self.calls: list[tuple] = []
        self.polls: dict[str, int] = {}
        self.tokens: dict[str, tuple] = {}

    def maybe_submit_lookup_request(self, request_id, token_ids, cache_salt="", request_configs=None, reserve_last_token=False):
        self.calls.append(("lookup", request_id, cache_salt, reserve_last_token))
        self.tokens[request_id] = tuple(token_ids)

    def check_lookup_result(self, request_id):
        self.polls[request_id] = self.polls.get(request_id, 0) + 1
        if self.polls[request_id] < 2:
            return None
        tokens, best = self.tokens[request_id], 0
        for s in self.stored:
            n = 0
            while n + CHUNK <= min(len(s), len(tokens)) and s[: n + CHUNK] == tokens[: n + CHUNK]:
                n += CHUNK
            best = max(best, n)
        return best

    def free_lookup_locks(self, token_ids, start, end, request_id, cache_salt="", request_configs=None):
        self.calls.append(("free", request_id, start, end))

    def end_session(self, request_id):
        self.calls.append(("end", request_id))

    def cleanup_lookup_result(self, request_id):
        self.calls.append(("cleanup", request_id))


def test_segments_are_looked_up_once_each_under_their_own_ids_and_feed_the_plan():
    adapter = FakeAdapter([DOC_A])
    lookups = SegmentLookups(adapter, "req-1", cache_salt="tenant-x")
    tokens = list(SEP) + DOC_B + list(SEP) + DOC_A
    plan = lambda: plan_prompt(tokens, SEP, lookups, recompute_ratio=0.15, chunk_size=CHUNK, min_reused_tokens=1)  # noqa: E731
    assert plan() is PENDING  # the server has not answered yet
    result = plan()
    assert [(s.length, s.cached) for s in result.segments] == [(9, 0), (8, 8)]
    submitted = [c for c in adapter.calls if c[0] == "lookup"]
    assert submitted == [("lookup", segment_request_id("req-1", DOC_B), "tenant-x", False),
                         ("lookup", segment_request_id("req-1", DOC_A), "tenant-x", False)]  # once each
    assert plan().reused_tokens == 7  # answered from what is known: no new lookups
    assert len([c for c in adapter.calls if c[0] == "lookup"]) == 2


def test_the_same_segment_at_another_position_has_the_same_id():
    assert segment_request_id("r", DOC_A) == segment_request_id("r", list(DOC_A))
    assert segment_request_id("r", DOC_A) != segment_request_id("r", DOC_B)
    assert segment_request_id("r", DOC_A) != segment_request_id("s", DOC_A)


def test_release_frees_the_locks_of_hits_not_retrieved_and_ends_every_session():
    adapter = FakeAdapter([DOC_A, DOC_B])
    lookups = SegmentLookups(adapter, "req-2")
    for _ in range(2):
        lookups(DOC_A), lookups(DOC_B)
    a, b = lookups.segment_id(DOC_A), lookups.segment_id(DOC_B)
    adapter.calls.clear()
    lookups.release(retrieved=[a])
    assert ("free", b, 0, 8) in adapter.calls and not any(c[0] == "free" and c[1] == a for c in adapter.calls)
    assert {c[1] for c in adapter.calls if c[0] == "end"} == {a, b}
    assert {c[1] for c in adapter.calls if c[0] == "cleanup"} == {a, b}
    adapter.calls.clear()
    lookups.release()
    assert adapter.calls == []  # released once
