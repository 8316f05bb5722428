"""Per-tenant and per-adapter series (lmi_server/usage_metrics.py, metric_labels.py): the label bound,
token counters, TTFT and the admission outcomes by adapter, read back from the default registry."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from lmi_server import metric_labels, usage_metrics
from lmi_server.admission import Admission, Rejected
from lmi_server.metric_labels import LabelBound
from lmi_server.usage_metrics import Usage


@pytest.fixture
def bounds():
    """Fresh label bounds of 3 names each (the process-wide ones are restored after)."""
    saved = [(b, b.limit, b.seen()) for b in (metric_labels.tenant_label, metric_labels.adapter_label)]
    for b in (metric_labels.tenant_label, metric_labels.adapter_label):
        b.reset(3)
    yield
    for b, limit, seen in saved:
        b.reset(limit)
        b._seen.extend(seen)


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_label_bound_keeps_the_first_names_and_counts_the_rest_as_other():
    bound = LabelBound(2, always=("base",))
    assert [bound(n) for n in ("a", "b", "c", "a", "base", "d")] == ["a", "b", "other", "a", "base", "other"]
    assert bound.seen() == ["a", "b"]


def test_configure_sets_both_bounds(bounds):
    metric_labels.configure(max_tenants=1, max_adapters=2)
    assert metric_labels.tenant_label("t1") == "t1" and metric_labels.tenant_label("t2") == "other"
    assert [metric_labels.adapter_label(n) for n in ("a1", "a2", "a3")] == ["a1", "a2", "other"]


def test_admission_labels_tenants_within_the_bound(bounds):
    async def run():
        adm = Admission(queue_size=4, slots=8)
        for name in ("ta", "tb", "tc", "td", "te"):
            (await adm.acquire(name)).release()

    before = value("lmi_tenant_requests_total", tenant="other", outcome="admitted")
    asyncio.run(run())
    assert value("lmi_tenant_requests_total", tenant="other", outcome="admitted") - before == 2
    assert metric_labels.tenant_label.seen() == ["ta", "tb", "tc"]


def test_json_usage_is_counted_by_tenant_and_adapter(bounds):
    labels = {"tenant": "alice", "adapter": "pirate"}
    p0, g0 = value("lmi_usage_prompt_tokens_total", **labels), value("lmi_usage_generation_tokens_total", **labels)
    usage = Usage("alice", SimpleNamespace(name="pirate"), time.perf_counter())
    body = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}
    assert usage.json(body) is body
    Usage("alice", SimpleNamespace(name="pirate"), 0).json({"type": "message", "usage": {"input_tokens": 2, "output_tokens": 3}})
    assert value("lmi_usage_prompt_tokens_total", **labels) - p0 == 13
    assert value("lmi_usage_generation_tokens_total", **labels) - g0 == 8


def test_base_model_requests_are_labelled_base(bounds):
    before = value("lmi_usage_generation_tokens_total", tenant="bob", adapter="base")
    Usage("bob", None, 0).json({"usage": {"prompt_tokens": 1, "completion_tokens": 4}})
    assert value("lmi_usage_generation_tokens_total", tenant="bob", adapter="base") - before == 4


async def _chunks(items):
    for item in items:
        yield item


def _drain(usage: Usage, items) -> list:
    async def run():
        return [c async for c in usage.stream(_chunks(items))]

    return asyncio.run(run())


def test_stream_with_usage_counts_its_usage_and_one_ttft(bounds):
    labels = {"tenant": "carol", "adapter": "shouter"}
    ttft0 = value("lmi_usage_time_to_first_token_seconds_count", **labels)
    p0, g0 = value("lmi_usage_prompt_tokens_total", **labels), value("lmi_usage_generation_tokens_total", **labels)
    items = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":" there"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n',
        b"data: [DONE]\n\n",
    ]
    assert _drain(Usage("carol", SimpleNamespace(name="shouter"), time.perf_counter()), items) == items
    assert value("lmi_usage_time_to_first_token_seconds_count", **labels) - ttft0 == 1
    assert value("lmi_usage_prompt_tokens_total", **labels) - p0 == 7
    assert value("lmi_usage_generation_tokens_total", **labels) - g0 == 2


def test_stream_without_usage_counts_text_events(bounds):
    labels = {"tenant": "dave", "adapter": "base"}
    g0 = value("lmi_usage_generation_tokens_total", **labels)
    items = ['{"token": {"text": "a"}}\n', '{"token": {"text": "b"}}\n', '{"token": {"text": "c"}}\n']  # LMI jsonlines
    _drain(Usage("dave", None, time.perf_counter()), items)
    assert value("lmi_usage_generation_tokens_total", **labels) - g0 == 3


def test_anthropic_stream_usage_is_read_from_its_events(bounds):
    labels = {"tenant": "erin", "adapter": "base"}
    p0, g0 = value("lmi_usage_prompt_tokens_total", **labels), value("lmi_usage_generation_tokens_total", **labels)
    items = [
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":6}}\n\n',
    ]
    _drain(Usage("erin", None, time.perf_counter()), items)
    assert value("lmi_usage_prompt_tokens_total", **labels) - p0 == 9
    assert value("lmi_usage_generation_tokens_total", **labels) - g0 == 6


def test_admission_outcomes_and_wait_by_adapter(bounds):
    adapter = SimpleNamespace(name="pirate")
    a0 = value("lmi_adapter_requests_total", adapter="pirate", outcome="admitted")
    r0 = value("lmi_adapter_requests_total", adapter="pirate", outcome="queue_full")
    w0 = value("lmi_adapter_queue_wait_seconds_count", adapter="pirate")
    usage_metrics.admitted(adapter, 0.2)
    usage_metrics.refused(adapter, Rejected("queue_full", "busy", 1).reason)
    assert value("lmi_adapter_requests_total", adapter="pirate", outcome="admitted") - a0 == 1
    assert value("lmi_adapter_requests_total", adapter="pirate", outcome="queue_full") - r0 == 1
    assert value("lmi_adapter_queue_wait_seconds_count", adapter="pirate") - w0 == 1


def test_adapters_past_the_bound_are_other(bounds):
    before = value("lmi_adapter_requests_total", adapter="other", outcome="admitted")
    for name in ("x1", "x2", "x3", "x4", "x5"):
        usage_metrics.admitted(SimpleNamespace(name=name), 0.0)
    usage_metrics.admitted(None, 0.0)  # the base model never counts against the bound
    assert value("lmi_adapter_requests_total", adapter="other", outcome="admitted") - before == 2
    assert value("lmi_adapter_requests_total", adapter="base", outcome="admitted") >= 1
