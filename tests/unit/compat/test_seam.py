"""The seam's functions do what their callers rely on, run against the installed vLLM and LMCache
(their real classes and modules; only what would need a running engine is stood in for)."""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

import pytest

from lmi_server.compat import lmcache as compat_lmcache
from lmi_server.compat import vllm as compat_vllm

pytestmark = pytest.mark.unit


def test_replace_mp_context_is_what_the_launcher_then_uses(monkeypatch):
    from vllm.v1.engine import utils as launch

    monkeypatch.setattr(launch, "get_mp_context", launch.get_mp_context)  # put back after the test
    context = multiprocessing.get_context("spawn")
    assert compat_vllm.replace_mp_context(context)
    assert launch.get_mp_context() is context


def test_waiting_swapped_runs_a_step_over_the_given_requests_and_puts_the_rest_back_in_order():
    from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue

    class Request:  # vLLM's queue keeps requests in a set and a deque: identity is all it needs
        pass

    a, b, c, d = (Request() for _ in range(4))
    scheduler = SimpleNamespace(policy=SchedulingPolicy.FCFS, waiting=create_request_queue(SchedulingPolicy.FCFS))
    for request in (a, b, c, d):
        scheduler.waiting.add_request(request)
    with compat_vllm.waiting_swapped(scheduler, [b, d]):
        assert list(scheduler.waiting) == [b, d]
        scheduler.waiting.pop_request()  # the step schedules b only
    assert list(scheduler.waiting) == [d, a, c]


def test_defer_decode_never_moves_a_request_earlier():
    request = SimpleNamespace(next_decode_eligible_step=9)
    compat_vllm.defer_decode(request, 5)
    assert request.next_decode_eligible_step == 9
    compat_vllm.defer_decode(request, 12)
    assert request.next_decode_eligible_step == 12


def test_content_part_kind_by_vllms_rule():
    assert compat_vllm.content_part_kind({"type": "text", "text": "hi"}) == "text"
    assert compat_vllm.content_part_kind({"image_url": {"url": "data:,"}}) == "image_url"


def test_anthropic_image_url_of_a_base64_source():
    url = compat_vllm.anthropic_image_url({"type": "base64", "media_type": "image/png", "data": "AAAA"})
    assert url == "data:image/png;base64,AAAA"


def test_cli_actions_of_vllms_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    actions = compat_vllm.cli_actions(make_arg_parser(FlexibleArgumentParser(prog="t")))
    assert "max_model_len" in actions and callable(actions["compilation_config"].type)


def test_wrap_engine_generate_wraps_once():
    engine = SimpleNamespace(generate=lambda: "vllm")

    def wrap(generate):
        def gated():
            return "gated " + generate()
        gated.mark = True
        return gated

    assert compat_vllm.wrap_engine_generate(engine, wrap, "mark")
    assert not compat_vllm.wrap_engine_generate(engine, wrap, "mark")
    assert engine.generate() == "gated vllm"


def test_config_keys_are_read_from_the_installed_lmcache():
    keys = compat_lmcache.config_keys()
    assert "chunk_size" in keys and "local_cpu" in keys


def test_guarded_stores_drop_a_timeout_and_give_lazy_offload_its_receipt():
    from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPWorkerAdapter

    adapter = LMCacheMPWorkerAdapter.__new__(LMCacheMPWorkerAdapter)  # no cache server to connect to
    adapter._completed_store_requests, adapter._failed_store_requests, adapter.lazy_offload = {}, set(), True

    def times_out(request_id, *args, **kwargs):
        raise TimeoutError("no answer")

    adapter.submit_store_request = times_out
    compat_lmcache.guard_worker_stores(adapter, __import__("logging").getLogger("test"))
    adapter.submit_store_request("r1", None, None)
    assert adapter._completed_store_requests == {"r1": 1} and adapter._failed_store_requests == {"r1"}
