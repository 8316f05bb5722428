"""The valid-request fuzzer's judge: a 5xx or an error event in a started stream fails, a 4xx is a
counted refusal, an answer from another model than the one named fails; its strategies draw
requests of every route, seeded."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, seed, settings

from tests.support.fuzz_runner import Runner, Stats, fuzz, judge
from tests.support.valid_fuzz import Case, Target, batches


def _case(**kw) -> Case:
    return Case(kw.pop("route", "/v1/completions"), kw.pop("body", {"prompt": "x"}), **kw)


def test_server_errors_fail_and_refusals_are_counted():
    assert judge(_case(), 500, '{"error": "boom"}')[0]
    problems, refusal = judge(_case(), 400, json.dumps({"error": {"message": "n must be 1"}}))
    assert not problems and refusal.startswith("400 /v1/completions: n must be 1")
    stream = 'data: {"choices": [{"text": "a"}], "model": "m"}\n\ndata: {"error": {"message": "KeyError", "code": 500}}\n\n'
    assert any("error event 500" in p for p in judge(_case(expect_model="m"), 200, stream)[0])
    lmi_stream = '{"token": {"text": "a"}}\n{"error": "engine died", "code": 503}\n'
    assert judge(_case(route="/invocations"), 200, lmi_stream)[0]


def test_an_answer_from_another_model_fails():
    assert not judge(_case(expect_model="pirate"), 200, json.dumps({"model": "pirate", "choices": [{"text": "arr"}]}))[0]
    problems, _ = judge(_case(expect_model="pirate"), 200, json.dumps({"model": "base", "choices": [{"text": "hi"}]}))
    assert problems and "named 'pirate'" in problems[0]
    shouted = _case(route="/invocations", body={"inputs": "x"}, upper_case=True, adapter="shouter")
    assert not judge(shouted, 200, json.dumps({"generated_text": "HELLO THERE"}))[0]
    assert judge(shouted, 200, json.dumps({"generated_text": "hello there"}))[0]
    full = _case(route="/invocations", body={"inputs": "x", "parameters": {"return_full_text": True}}, upper_case=True)
    assert not judge(full, 200, json.dumps({"generated_text": "x HELLO"}))[0]  # the prompt is not the adapter's


def test_batches_cover_every_route_and_the_named_adapters():
    target = Target("t", "http://unused", "base-model", adapters=("pirate",), tools=True)
    routes, named, sizes = set(), set(), set()

    @seed(0)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(batches(target))
    def draw(batch):
        sizes.add(len(batch))
        for case in batch:
            routes.add(case.route)
            named.add(case.adapter)
            json.dumps(case.body)  # every body is JSON

    draw()
    assert routes >= {"/invocations", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"}
    assert named == {None, "pirate"} and sizes <= {1, 2, 4, 8} and len(sizes) > 1


def test_the_new_doors_answers_are_judged_by_their_text_and_their_error_events():
    shouted = _case(route="/v1/responses", body={"input": "x"}, upper_case=True, adapter="shouter")
    whole = {"object": "response", "model": "shouter", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "hello"}]}]}
    assert judge(shouted, 200, json.dumps(whole))[0]
    whole["output"][0]["content"][0]["text"] = "HELLO"
    assert not judge(shouted, 200, json.dumps(whole))[0]
    stream = "".join(f"event: e\ndata: {json.dumps(e)}\n\n" for e in (
        {"type": "response.output_text.delta", "delta": "HEL"}, {"type": "response.output_text.delta", "delta": "lo"}))
    assert judge(shouted, 200, stream)[0]
    failed = 'data: {"type": "response.failed", "response": {}}\n\n'
    assert any("error event 500" in p for p in judge(_case(route="/v1/responses"), 200, failed)[0])
    messages = _case(route="/v1/messages", body={"messages": []}, upper_case=True, adapter="shouter")
    assert judge(messages, 200, json.dumps({"type": "message", "model": "shouter", "content": [{"type": "text", "text": "hi"}]}))[0]
    deltas = 'data: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "HI"}}\n\n'
    assert not judge(messages, 200, deltas)[0]


class _Server:
    """A stand-in for a server under fuzzing: healthy, every request answered 200 with a text."""

    def __init__(self, fail_route: str | None = None):
        self.fail_route = fail_route

    def handler(self, request):
        import httpx

        if request.url.path == "/ping":
            return httpx.Response(200)
        body = json.loads(request.content or b"null")
        if request.url.path == "/v1/completions" and isinstance(body, dict) and body.get("max_tokens") == 1 and "calibrate" not in str(body):
            return httpx.Response(200, json={"usage": {"prompt_tokens": 80}})
        if request.url.path == self.fail_route:
            return httpx.Response(500, json={"error": "boom"})
        return httpx.Response(200, text="{}")


def _patched_fuzz(monkeypatch, server: _Server, **kwargs) -> Stats:
    import httpx

    transport = httpx.MockTransport(server.handler)
    real = httpx.Client

    def client(*args, **kw):
        kw["transport"] = transport
        return real(*args, **kw)

    monkeypatch.setattr(httpx, "Client", client)
    target = Target("t", "http://fuzzed", "m", adapters=("a",), sessions=False)
    return fuzz(target, kwargs.pop("seconds", 0.5), shrink_seconds=2, **kwargs)


def test_a_run_goes_on_past_its_budget_until_its_minimum_of_batches(monkeypatch):
    stats = _patched_fuzz(monkeypatch, _Server(), seconds=0.01, min_batches=5)
    assert stats.batches >= 5 and not stats.failed() and not stats.harness_errors


def test_a_5xx_fails_the_run_and_leaves_a_reproducer(monkeypatch):
    stats = _patched_fuzz(monkeypatch, _Server(fail_route="/v1/messages"), seconds=5)
    assert stats.failed() and stats.server_errors and stats.reproducer
    assert any(c["route"] == "/v1/messages" for c in stats.reproducer)
    assert "BATCH = json.loads(" in stats.reproducer_text()


def test_an_exception_of_the_fuzzer_itself_fails_the_run(monkeypatch):
    def broken(self, cases):
        raise KeyError("the harness broke")

    monkeypatch.setattr(Runner, "run_batch", broken)
    stats = _patched_fuzz(monkeypatch, _Server())
    assert stats.failed() and stats.harness_errors and "the harness broke" in stats.harness_errors[0]


def test_a_working_adapters_formatter_failing_on_a_valid_request_fails():
    body = json.dumps({"error": {"message": "Custom formatter failed: output formatter of adapter 'shouter' failed"}})
    assert judge(_case(route="/tokenize", adapter="shouter"), 424, body)[0]
    assert not judge(_case(route="/tokenize"), 424, body)[0]  # the model's own script: not the fuzzed adapters'


def test_a_run_goes_on_until_every_required_route_was_sent(monkeypatch):
    routes = frozenset({"/invocations", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"})
    stats = _patched_fuzz(monkeypatch, _Server(), seconds=0.01, routes=routes)
    assert set(stats.routes) >= routes and not stats.failed()
    assert stats.as_json()["routes_never_sent"] == []
