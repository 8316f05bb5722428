"""The pipeline hands each answer's usage to the per-tenant and per-adapter series
(lmi_server/usage_metrics.py): a JSON answer's `usage`, a stream's text events and its first token,
and the admission outcome by adapter; with a fake vLLM serving layer."""

from __future__ import annotations

from prometheus_client import REGISTRY
from pydantic import BaseModel

from tests.unit.api.test_pipeline import Choice, app_with_engine, post
from tests.unit.test_usage_metrics import bounds  # noqa: F401 - fresh label bounds (earlier tests' names gone)

BASE = {"tenant": "default", "adapter": "base"}


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionWithUsage(BaseModel):
    choices: list[Choice]
    usage: Usage


class FakeCompletions:
    async def create_completion(self, request, raw_request):
        if request.stream:
            async def events():
                yield 'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
                yield 'data: {"choices":[{"index":0,"text":"b"}]}\n\n'
                yield "data: [DONE]\n\n"
            return events()
        return CompletionWithUsage(choices=[Choice(text="xyz")], usage=Usage(prompt_tokens=6, completion_tokens=3, total_tokens=9))


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def snapshot() -> dict[str, float]:
    return {
        "prompt": value("lmi_usage_prompt_tokens_total", **BASE),
        "generated": value("lmi_usage_generation_tokens_total", **BASE),
        "ttft": value("lmi_usage_time_to_first_token_seconds_count", **BASE),
        "admitted": value("lmi_adapter_requests_total", adapter="base", outcome="admitted"),
        "waits": value("lmi_adapter_queue_wait_seconds_count", adapter="base"),
    }


def test_json_and_streamed_answers_are_counted_by_tenant_and_adapter(tmp_path, bounds):  # noqa: F811
    app, _ = app_with_engine(tmp_path)
    app.state.ctx.owner.state.serving.openai_serving_completion = FakeCompletions()
    before = snapshot()
    r = post(app, "/v1/completions", {"model": "base-model", "prompt": "p", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 6
    s = post(app, "/v1/completions", {"model": "base-model", "prompt": "p", "max_tokens": 2, "stream": True})
    assert s.status_code == 200 and '"text":"b"' in s.text
    after = snapshot()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"prompt": 6, "generated": 3 + 2, "ttft": 1, "admitted": 2, "waits": 2}
