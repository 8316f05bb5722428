"""The valid-request fuzzer's judge: a 5xx or an error event in a started stream fails, a 4xx is a
counted refusal, an answer from another model than the one named fails; its strategies draw
requests of every route, seeded."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, seed, settings

from tests.support.fuzz_runner import judge
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
    assert routes == {"/invocations", "/v1/chat/completions", "/v1/completions"}
    assert named == {None, "pirate"} and sizes <= {1, 2, 4, 8} and len(sizes) > 1
