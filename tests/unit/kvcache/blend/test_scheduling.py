"""The scheduler's blend decisions over a real segment store, with vLLM's request and scheduler
output stood in by plain objects: a prompt whose segments are new is served as usual and stored
once its prefill is done (not before); the same documents in another order are then blended (every
prompt token but the last reported as loaded, one job with the request's blocks); what blending
cannot serve or would not pay for stays on the usual path."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from lmi_server.kvcache.blend.scheduling import BlendJob, BlendScheduler, StoreJob
from lmi_server.kvcache.blend.segments import Separator
from lmi_server.kvcache.blend.settings import BlendConfig

pytestmark = pytest.mark.unit

SEP, CHUNK = (7, 7), 4
DOCS = [[10, 11, 12, 13, 14, 15, 16, 17, 18], [20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
QUERY = [50, 51]


def prompt(order):
    ids = []
    for i in order:
        ids += list(SEP) + DOCS[i]
    return ids + list(SEP) + QUERY


def scheduler(tmp_path, min_reused=8):
    config = BlendConfig(separator=" # # ", recompute_ratio=0.25, check_layer=1, chunk_size=CHUNK,
                         min_reused_tokens=min_reused, store_dir=str(tmp_path / "store"), store_max_bytes=10**9,
                         model_identity="tiny")
    return BlendScheduler(config, Separator(SEP))


def request(rid, ids, lora=None, salt=None):
    stats = SimpleNamespace(num_prompt_tokens=len(ids), num_cached_tokens=0, num_external_cached_tokens=0,
                            num_local_cached_tokens=0, num_computed_tokens=len(ids))
    return SimpleNamespace(request_id=rid, prompt_token_ids=ids, num_tokens=len(ids), lora_request=lora,
                           cache_salt=salt, prefill_stats=stats)


def new_step(rid, blocks, computed, scheduled):
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=(blocks,), num_computed_tokens=computed)],
        num_scheduled_tokens={rid: scheduled},
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set()),
    )


def cached_step(rid, new_blocks, computed, scheduled):
    return SimpleNamespace(
        scheduled_new_reqs=[], num_scheduled_tokens={rid: scheduled},
        scheduled_cached_reqs=SimpleNamespace(req_ids=[rid], new_block_ids=[(new_blocks,)], num_computed_tokens=[computed],
                                              resumed_req_ids=set()),
    )


def store_job_kv(sched, job):
    """What the worker would store: per-segment KV (contents do not matter to the scheduler)."""
    for start, length, skip in job.segments:
        kv = [(torch.zeros(length, 1, 2), torch.zeros(length, 1, 2))]
        sched.store.save(job.token_ids[start : start + length], job.salt, kv, skip_tokens=skip)


def test_new_segments_are_stored_after_the_prefill_then_reused_in_any_order(tmp_path):
    sched = scheduler(tmp_path)
    first = request("r1", prompt([0, 1, 2]))
    n = len(first.prompt_token_ids)
    assert sched.decide(first, prefix_hit_tokens=0) is None
    sched.on_alloc("r1", [3, 4])
    # chunked prefill: no store while the prompt is not computed in full
    assert sched.jobs(new_step("r1", [3, 4], 0, 16)) == []
    jobs = sched.jobs(cached_step("r1", [9, 8], 16, n - 16))
    assert len(jobs) == 1 and isinstance(jobs[0], StoreJob)
    assert jobs[0].block_ids == [3, 4, 9, 8]
    assert [(s, l) for s, l, _ in jobs[0].segments] == [(2, 9), (13, 8), (23, 10)]  # the query is too short
    assert sched.jobs(cached_step("r1", [], n, 1)) == []  # once
    store_job_kv(sched, jobs[0])
    sched.finished("r1")

    second = request("r2", prompt([2, 0, 1]))
    n = len(second.prompt_token_ids)
    assert sched.decide(second, prefix_hit_tokens=0) == n - 1
    assert sched.is_blended("r2")
    (job,) = sched.jobs(new_step("r2", [5, 6, 7, 1], n - 1, 1))
    assert isinstance(job, BlendJob) and job.block_ids == [5, 6, 7, 1] and job.token_ids == second.prompt_token_ids
    assert [c for _, _, c in job.segments] == [10, 9, 8, 0]
    # usage reports what was reused and kept: 27 reused, a quarter of them (7) recomputed
    assert second.prefill_stats.num_cached_tokens == 27 - 7 and second.prefill_stats.num_computed_tokens == n - 20
    assert sched.jobs(cached_step("r2", [], n, 1)) == []


def test_what_stays_on_the_usual_path(tmp_path):
    sched = scheduler(tmp_path)
    warm = request("w", prompt([0, 1, 2]))
    sched.decide(warm, 0)
    (job,) = sched.jobs(new_step("w", [1, 2, 3], 0, len(warm.prompt_token_ids)))
    store_job_kv(sched, job)
    ids = prompt([1, 2, 0])
    assert sched.decide(request("lora", ids, lora=object()), 0) is None
    assert sched.decide(request("salted", ids, salt="other-tenant"), 0) is None
    with_image = request("image", ids)
    with_image.mm_features = [object()]  # placeholder tokens: the same ids for any picture
    assert sched.decide(with_image, 0) is None
    assert sched.decide(request("prefix", ids), prefix_hit_tokens=len(ids)) is None  # LMCache's prefix covers more
    assert sched.decide(request("one", DOCS[0] + QUERY), 0) is None  # no separator: nothing to blend
    assert not sched.jobs(new_step("one", [1], 0, 11))
    assert scheduler(tmp_path, min_reused=100).decide(request("few", ids), 0) is None
    assert sched.decide(request("ok", ids), 0) == len(ids) - 1


def test_documents_cut_where_the_request_says_are_reused_without_a_separator(tmp_path):
    """`kv_transfer_params.lmi_blend_boundaries`: the prompt is cut at the offsets the request gives
    (no separator in it), and its documents are found again in another order."""
    sched = scheduler(tmp_path)

    def plain(order):
        ids, starts = [], []
        for i in order:
            starts.append(len(ids))
            ids += DOCS[i]
        starts.append(len(ids))
        return ids + QUERY, starts

    ids, starts = plain([0, 1, 2])
    first = request("b1", ids)
    first.kv_transfer_params = {"lmi_blend_boundaries": starts}
    assert sched.decide(first, 0) is None
    (job,) = sched.jobs(new_step("b1", [1, 2, 3], 0, len(ids)))
    assert [(s, l) for s, l, _ in job.segments] == [(0, 9), (9, 8), (17, 10)]
    store_job_kv(sched, job)

    ids, starts = plain([2, 0, 1])
    again = request("b2", ids)
    assert sched.decide(again, 0) is None  # no separator, no boundaries: one segment, the usual path
    again.kv_transfer_params = {"lmi_blend_boundaries": starts}
    assert sched.decide(again, 0) == len(ids) - 1
    (job,) = sched.jobs(new_step("b2", [4, 5, 6, 7], len(ids) - 1, 1))
    assert [(s, l, c) for s, l, c in job.segments] == [(0, 10, 10), (10, 9, 9), (19, 8, 8), (27, 2, 0)]

    past_the_end = request("b3", ids)
    past_the_end.kv_transfer_params = {"lmi_blend_boundaries": [3, len(ids) + 1]}
    assert sched.decide(past_the_end, 0) is None  # the API refuses it where it can; here: the usual path


def test_documents_in_an_ordinary_prompt_are_found_by_their_content(tmp_path):
    """No separator, no boundaries: documents joined by blank lines (LMCache's long-doc-permutator)
    are cut where their content says, stored once, blended in another order, and no piece is
    stored twice."""
    import random

    from lmi_server.kvcache.blend.segments import ContentCuts

    nl = 3
    cuts = ContentCuts(newlines={nl: 1}, special_ids=frozenset({1}), min_len=16, avg_len=32, max_len=64, window=4)
    config = BlendConfig(separator=" # # ", recompute_ratio=0.25, check_layer=1, chunk_size=64, min_reused_tokens=64,
                         store_dir=str(tmp_path / "store"), store_max_bytes=10**9, model_identity="tiny")
    sched = BlendScheduler(config, Separator(SEP), cuts)
    rng = random.Random(0)
    docs = [[rng.randrange(100, 900) for _ in range(150)] for _ in range(3)]

    system = [rng.randrange(100, 900) for _ in range(40)]

    def joined(order):
        ids = [1, 40, nl, *system, 1, nl, 1, 41, nl]
        for k, i in enumerate(order):
            ids += ([nl, nl] if k else []) + docs[i]
        return ids + [1, nl, 1, 41, nl]

    first = request("c1", joined([0, 1, 2]))
    assert sched.decide(first, prefix_hit_tokens=0) is None
    (job,) = sched.jobs(new_step("c1", [1, 2, 3, 4, 5, 6, 7, 8], 0, len(first.prompt_token_ids)))
    assert isinstance(job, StoreJob) and sum(length for _, length, _ in job.segments) == 490
    assert all(length <= 64 for _, length, _ in job.segments)
    assert len(job.contexts) == len(job.segments)  # the prompt was computed in full: exact where it stood
    for (start, length, _), context in zip(job.segments, job.contexts):
        kv = [(torch.zeros(length, 1, 2), torch.zeros(length, 1, 2))]
        sched.store.save(job.token_ids[start : start + length], job.salt, kv, context=context)
    stored = len(list((tmp_path / "store").glob("*.kv")))

    second = request("c2", joined([2, 0, 1]))
    n = len(second.prompt_token_ids)
    # LMCache's prefix leaves 30 tokens to compute: cheaper than blending 450 reused tokens at 0.25
    assert sched.decide(request("c2-prefix", second.prompt_token_ids), prefix_hit_tokens=n - 30) is None
    # CacheBlend's check layer: every token runs 2 of 4 layers first
    deep = BlendScheduler(dataclasses.replace(config, mode="cacheblend"), Separator(SEP), cuts, num_layers=4)
    assert deep.blend_cost(_plan_of(deep, second)) > n / 2
    assert sched.decide(second, prefix_hit_tokens=3) == n - 1
    (job,) = sched.jobs(new_step("c2", [9, 10, 11, 12, 13, 14, 15, 16], n - 1, 1))
    assert isinstance(job, BlendJob)
    assert sum(cached for _, _, cached in job.segments) == 490  # every document token found again
    assert job.to_store == []  # nothing new: nothing stored again
    # the system prompt stands where it stood, after the same tokens: its KV is exact, kept whole,
    # and the ratio is spent on the moved documents only
    assert job.exact == [(3, 40)]
    assert second.prefill_stats.num_cached_tokens == 490 - 113  # ceil(0.25 x 450) recomputed
    assert len(list((tmp_path / "store").glob("*.kv"))) == stored

    third = request("c3", joined([1, 2]) [:-5] + [nl, nl] + docs[0][:100] + [1, nl])
    assert sched.decide(third, prefix_hit_tokens=0) == len(third.prompt_token_ids) - 1
    (job,) = sched.jobs(new_step("c3", [1, 2, 3, 4, 5, 6, 7], 0, 1))
    # a document cut short: its head pieces are found, its new tail is stored (once)
    assert 0 < sum(length for _, length, _ in job.to_store) < 100


def _plan_of(sched, req):
    from lmi_server.kvcache.blend.plan import plan_prompt

    return plan_prompt(req.prompt_token_ids, sched.separator, lambda ids: sched.store.cached_tokens(ids, sched.salt(req)),
                       recompute_ratio=sched.config.recompute_ratio, chunk_size=sched.config.chunk_size,
                       min_reused_tokens=0, content=sched.content, mode=sched.config.mode)


def test_a_request_naming_its_ratio_is_blended_and_stores_no_prefix(tmp_path):
    """The cost rule is the server's choice: a request that names its own ratio gets the blend it
    asked for (ratio 1 costs more than LMCache's prefix, and is still blended, so that it can be
    checked against a full prefill); its KV is not stored as LMCache's prefix. A blend at the
    server's ratio is (the next question on the same documents takes LMCache's prefix hit)."""
    sched = scheduler(tmp_path)
    warm = request("w", prompt([0, 1, 2]))
    sched.decide(warm, 0)
    (job,) = sched.jobs(new_step("w", [1, 2, 3], 0, len(warm.prompt_token_ids)))
    store_job_kv(sched, job)
    ids = prompt([1, 2, 0])
    own = request("own", ids)
    own.kv_transfer_params = {"lmi_blend_recompute_ratio": 1.0}
    assert sched.decide(own, prefix_hit_tokens=len(ids) - 2) == len(ids) - 1
    assert not sched.stores_as_prefix("own")
    server = request("server", ids)
    assert sched.decide(server, prefix_hit_tokens=0) == len(ids) - 1
    assert sched.stores_as_prefix("server")
    assert sched.decide(request("near", ids), prefix_hit_tokens=len(ids) - 2) is None  # the prefix is cheaper
    assert not sched.stores_as_prefix("near")


def test_a_blend_keeps_what_vllms_prefix_cache_holds(tmp_path):
    """vLLM's prefix cache holds the prompt's head (block-aligned): the blend reports only the tokens
    past it, plans no segment inside it, and the job tells the worker where it ends."""
    sched = scheduler(tmp_path)
    warm = request("w", prompt([0, 1, 2]))
    sched.decide(warm, 0)
    (job,) = sched.jobs(new_step("w", [1, 2, 3], 0, len(warm.prompt_token_ids)))
    store_job_kv(sched, job)
    ids = prompt([0, 2, 1])  # the first document where it stood
    n, held = len(ids), 8
    assert sched.decide(request("held", ids), prefix_hit_tokens=held, local_hit_tokens=held) == n - 1 - held
    (job,) = sched.jobs(new_step("held", [4, 5, 6, 7], held, 1))
    assert isinstance(job, BlendJob) and job.prefix == held
    assert all(start >= held for start, _, _ in job.segments)
    assert sched.decide(request("all-held", ids), prefix_hit_tokens=n - 3, local_hit_tokens=n - 3) is None


def test_the_epic_mode_recomputes_the_head_of_each_span_and_skips_the_check_layer(tmp_path):
    """In EPIC mode the job carries the mode and its token count, the usage counts k tokens per span
    of reused tokens as recomputed, and the cost rule has no check-layer term (it blends where
    CacheBlend's cost would not pay)."""
    sched = _with_documents_stored(tmp_path)
    ids = prompt([2, 0, 1])
    epic = request("e", ids)
    epic.kv_transfer_params = {"lmi_blend_mode": "epic", "lmi_blend_epic_tokens": 2}
    assert sched.decide(epic, prefix_hit_tokens=0) == len(ids) - 1
    assert not sched.stores_as_prefix("e")  # a request's own mode, like its own ratio
    (job,) = sched.jobs(new_step("e", [5, 6, 7, 1], len(ids) - 1, 1))
    assert (job.mode, job.epic_tokens) == ("epic", 2)
    # three documents reused (10 + 9 + 8 tokens), each its own span behind a separator: 2 recomputed each
    assert epic.prefill_stats.num_cached_tokens == 27 - 6
    plan = _plan_of(sched, request("x", ids))
    epic_plan = type(plan)(plan.prompt_len, plan.segments, plan.recompute_ratio, plan.pieces, plan.prefix, "epic", 2)
    assert epic_plan.recomputed_tokens == 6 and sched.blend_cost(epic_plan) < sched.blend_cost(plan)


def test_the_guided_mode_costs_its_first_pass_and_the_ratios_share_not_a_check_layer(tmp_path):
    """The question-guided mode: the job carries the mode and the request's ratio, the usage counts
    the ratio's share of the reused tokens as recomputed (as CacheBlend), and the cost rule counts a
    first pass of the computed tokens in place of the check layer over the whole prompt."""
    sched = _with_documents_stored(tmp_path)
    ids = prompt([2, 0, 1])
    guided = request("g", ids)
    guided.kv_transfer_params = {"lmi_blend_mode": "guided", "lmi_blend_recompute_ratio": 0.5}
    assert sched.decide(guided, prefix_hit_tokens=0) == len(ids) - 1
    assert not sched.stores_as_prefix("g")
    (job,) = sched.jobs(new_step("g", [5, 6, 7, 1], len(ids) - 1, 1))
    assert (job.mode, job.recompute_ratio) == ("guided", 0.5)
    assert guided.prefill_stats.num_cached_tokens == 27 - 14  # ceil(0.5 x 27) of the reused recomputed
    plan = _plan_of(sched, request("x", ids))
    guided_plan = type(plan)(plan.prompt_len, plan.segments, plan.recompute_ratio, plan.pieces, plan.prefix, "guided", 0)
    assert guided_plan.recomputed_tokens == plan.recomputed_tokens
    assert sched.blend_cost(guided_plan) == 2 * plan.computed_tokens + plan.recomputed_tokens


def _with_documents_stored(tmp_path):
    """A scheduler whose store holds the three documents, from a prompt served as usual."""
    sched = scheduler(tmp_path)
    warm = request("w", prompt([0, 1, 2]))
    sched.decide(warm, 0)
    (job,) = sched.jobs(new_step("w", [1, 2, 3], 0, len(warm.prompt_token_ids)))
    store_job_kv(sched, job)
    return sched
