"""The LMI protocol translation, schema detection of /invocations, the one exception -> HTTP map,
and request-body reading (no engine)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from lmi_server.adapters.formatters import FormatterError, FormatterInvalid
from lmi_server.adapters.registry import AdapterConflict, AdapterNotFound, AdapterUnavailable
from lmi_server.adapters.validation import AdapterInvalid
from lmi_server.api.body import MAX_JSON_DEPTH, json_depth_exceeds, read_json_body
from lmi_server.api.errors import (
    APIError,
    from_adapter_error,
    from_vllm_error,
    install_error_handlers,
    stream_error_event,
    validation_message,
)
from lmi_server.api.sagemaker.lmi_protocol import LMIRequest, ParameterError, finish_reason, format_response, stream_jsonlines, to_completion_body
from lmi_server.api.context import Shape
from lmi_server.api.sagemaker.schema import detect_schema

# ---------------------------------------------------------------------------------- LMI protocol


def test_lmi_request_validation():
    assert LMIRequest.model_validate({"inputs": "hi"}).parameters.max_new_tokens == 30
    assert LMIRequest.model_validate({"inputs": "a", "parameters": {"stop": "x"}}).parameters.stop == ["x"]
    for bad in ({"inputs": ""}, {"inputs": ["a", ""]}, {"inputs": "a", "parameters": {"max_new_tokens": 0}}, {"inputs": "a", "x": 1}):
        with pytest.raises(ValueError):
            LMIRequest.model_validate(bad)


VLLM_FIELDS = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
               "include_stop_str_in_output", "skip_special_tokens", "logprobs", "prompt_logprobs", "min_tokens", "n",
               "truncate_prompt_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty"}


def test_greedy_unless_sampling_is_asked():
    body = to_completion_body(LMIRequest.model_validate({"inputs": "hi"}), None)
    assert body == {"prompt": "hi", "max_tokens": 30, "stream": False, "return_token_ids": True, "temperature": 0.0}
    sampled = to_completion_body(LMIRequest.model_validate({"inputs": "hi", "parameters": {"top_p": 0.9}}), "ad")
    assert sampled["temperature"] == 1.0 and sampled["top_p"] == 0.9 and sampled["model"] == "ad"
    off = to_completion_body(LMIRequest.model_validate({"inputs": "hi", "parameters": {"top_p": 0.9, "do_sample": False}}), None)
    assert off["temperature"] == 0.0 and "top_p" not in off


def test_lmi_names_become_vllm_names_and_the_rest_passes_through():
    req = LMIRequest.model_validate({
        "inputs": ["a", "b"], "stream": False,
        "parameters": {"min_new_tokens": 2, "seed": 7, "stop": ["x"], "stop_sequences": ["y"], "details": True,
                       "top_n_tokens": 3, "ignore_eos_token": True, "truncate": 5, "min_p": 0.1, "stop_token_ids": [3],
                       "include_stop_str_in_output": True, "skip_special_tokens": False, "repetition_penalty": 1.1},
    })
    body = to_completion_body(req, None, VLLM_FIELDS)
    assert body["min_tokens"] == 2 and body["seed"] == 7 and body["stop"] == ["x", "y"] and body["logprobs"] == 3
    assert body["ignore_eos"] is True and body["truncate_prompt_tokens"] == 5 and body["min_p"] == 0.1
    assert body["stop_token_ids"] == [3] and body["include_stop_str_in_output"] and body["skip_special_tokens"] is False
    assert body["repetition_penalty"] == 1.1
    stream = to_completion_body(LMIRequest.model_validate({"inputs": "a", "stream": True}), None)
    # every streamed token carries its log probability, and usage arrives with each chunk
    assert stream["stream_options"] == {"include_usage": True, "continuous_usage_stats": True} and stream["logprobs"] == 1
    prefill = to_completion_body(LMIRequest.model_validate({"inputs": "a", "parameters": {"details": True, "decoder_input_details": True}}), None)
    assert prefill["prompt_logprobs"] == 1
    alone = to_completion_body(LMIRequest.model_validate({"inputs": "a", "parameters": {"decoder_input_details": True}}), None)
    assert "prompt_logprobs" not in alone  # LMI returns the prefill with details only


def test_unknown_or_envelope_parameters_are_named():
    with pytest.raises(ParameterError) as err:
        to_completion_body(LMIRequest.model_validate({"inputs": "a", "parameters": {"temprature": 0.5}}), None, VLLM_FIELDS)
    assert err.value.param == "temprature" and "parameters.temprature" in str(err.value)
    with pytest.raises(ParameterError) as err:
        to_completion_body(LMIRequest.model_validate({"inputs": "a", "parameters": {"stream": True}}), None, VLLM_FIELDS)
    assert err.value.param == "stream"
    with pytest.raises(ParameterError) as err:
        to_completion_body(LMIRequest.model_validate({"inputs": "a", "stream": True, "parameters": {"decoder_input_details": True}}), None)
    assert err.value.param == "decoder_input_details"


def test_finish_reasons_follow_lmi():
    assert finish_reason({"finish_reason": "stop", "stop_reason": None}) == "eos_token"
    assert finish_reason({"finish_reason": "stop", "stop_reason": "###"}) == "stop_sequence"
    assert finish_reason({"finish_reason": "stop", "stop_reason": 7}) == "stop_sequence"  # a stop token id
    assert finish_reason({"finish_reason": "length"}) == "length"


def test_format_response_single_list_full_text_details_and_prefill():
    completion = {"choices": [
        {"index": 1, "text": " two", "finish_reason": "length", "token_ids": [5], "logprobs": {"tokens": [" two"], "token_logprobs": [-0.5]}},
        {"index": 0, "text": " one", "finish_reason": "stop", "token_ids": [4], "logprobs": None},
    ]}
    req = LMIRequest.model_validate({"inputs": ["a", "b"], "parameters": {"details": True}})
    out = format_response(req, completion)
    assert [o["generated_text"] for o in out] == [" one", " two"]
    assert out[0]["details"]["finish_reason"] == "eos_token" and out[1]["details"]["tokens"] == [{"id": 5, "text": " two", "log_prob": -0.5}]
    single = LMIRequest.model_validate({"inputs": "a", "parameters": {"return_full_text": True}})
    assert format_response(single, {"choices": [{"index": 0, "text": "!"}]}) == {"generated_text": "a!"}
    with_prefill = LMIRequest.model_validate({"inputs": "ab", "parameters": {"details": True, "decoder_input_details": True}})
    choice = {"index": 0, "text": "c", "finish_reason": "length", "token_ids": [9], "prompt_token_ids": [1, 2],
              "prompt_logprobs": [None, {2: {"logprob": -0.25, "decoded_token": "b"}, 3: {"logprob": -0.1, "decoded_token": "x"}}]}
    details = format_response(with_prefill, {"choices": [choice]})["details"]
    assert details["prefill"] == [{"id": 1, "text": "", "log_prob": None}, {"id": 2, "text": "b", "log_prob": -0.25}]


def _collect(gen):
    async def go():
        return [line async for line in gen]

    return asyncio.run(go())


def _sse(*chunks):
    async def gen():
        for chunk in chunks:
            yield "data: " + json.dumps(chunk) + "\n\n"
        yield "data: [DONE]\n\n"

    return gen()


def test_stream_jsonlines_puts_the_text_and_details_on_the_last_token_line():
    req = LMIRequest.model_validate({"inputs": "p", "stream": True, "parameters": {"details": True}})
    sse = _sse(
        {"choices": [{"text": "a", "token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}}], "usage": {"prompt_tokens": 3}},
        {"choices": [{"text": "b", "token_ids": [2], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop", "stop_reason": "x"}],
         "usage": {"prompt_tokens": 3}},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    lines = [json.loads(line) for line in _collect(stream_jsonlines(req, sse))]
    assert len(lines) == 2  # no separate closing line
    assert lines[0] == {"index": 0, "token": {"id": 1, "text": "a", "log_prob": -1.0}, "generated_text": None, "details": None}
    assert lines[-1]["token"] == {"id": 2, "text": "b", "log_prob": -0.5}
    assert lines[-1]["generated_text"] == "ab"
    assert lines[-1]["details"] == {"finish_reason": "stop_sequence", "generated_tokens": 2, "inputs": "p", "input_length": 3}


def test_stream_jsonlines_error_event_ends_the_stream_as_lmi_clients_read_it():
    req = LMIRequest.model_validate({"inputs": "p", "stream": True})
    lines = _collect(stream_jsonlines(req, _sse({"choices": [{"text": "a", "token_ids": [1]}]}, {"error": {"message": "boom"}})))
    last = json.loads(lines[-1])
    assert last["details"]["finish_reason"] == "error" and last["error"] == "boom" and last["code"] == 424


# ---------------------------------------------------------------------------------- schema detection


def test_detect_schema_by_validation_in_priority_order():
    assert detect_schema({"inputs": "hi"})[0] == "lmi"
    assert detect_schema({"messages": [{"role": "user", "content": "hi"}]})[0] == "chat"
    assert detect_schema({"prompt": "hi"})[0] == "completion"


def test_detect_schema_errors_name_the_closest_schema():
    with pytest.raises(APIError) as err:  # a bad parameter: 400 naming it
        detect_schema({"inputs": "hi", "parameters": {"max_new_tokens": "many"}})
    assert err.value.status == 400 and err.value.body(Shape.LMI)["code"] == 400 and "max_new_tokens" in err.value.message
    with pytest.raises(APIError) as err:  # a bad envelope: LMI's "Input parsing failed", 424
        detect_schema({"inputs": 5})
    assert err.value.status == 424 and err.value.message.startswith("Input parsing failed")
    with pytest.raises(APIError) as err:
        detect_schema({"messages": "not a list"})
    assert err.value.status == 424 and "invalid chat request" in err.value.message
    assert err.value.body(Shape.LMI) == {"error": err.value.message, "code": 424}
    with pytest.raises(APIError) as err:
        detect_schema({"question": "hi"})
    assert err.value.status == 424 and "matches none" in err.value.message
    with pytest.raises(APIError) as err:
        detect_schema(["inputs"])
    assert err.value.status == 400


# ---------------------------------------------------------------------------------- errors


def test_error_bodies_in_each_schema():
    assert APIError(404, "gone", param="model").body() == {"error": {"message": "gone", "type": "NotFoundError", "code": 404, "param": "model"}}
    assert APIError(424, "bad").body(Shape.LMI) == {"error": "bad", "code": 424}
    assert APIError(424, "bad").body(Shape.TGI) == {"error": "bad", "code": 424}
    anthropic = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert APIError(400, "bad").body(Shape.ANTHROPIC) == anthropic
    assert APIError(429, "slow").body(Shape.ANTHROPIC)["error"]["type"] == "rate_limit_error"
    too_long = APIError(400, "long", lmi_status=424)  # one failure, another status on LMI's routes
    assert (too_long.status_for(Shape.OPENAI), too_long.status_for(Shape.LMI)) == (400, 424)
    assert too_long.response(Shape.LMI).status_code == 424
    assert APIError(418, "tea").body()["error"]["type"] == "ServerError"
    assert stream_error_event(APIError(424, "x"), Shape.OPENAI, "sse") == b'data: {"error": {"message": "x", "type": "FailedDependencyError", "code": 424}}\n\n'
    assert stream_error_event(APIError(424, "x"), Shape.LMI, "jsonl") == b'{"error": "x", "code": 424}\n'


def test_validation_message_lists_the_first_problems():
    errors = [{"loc": ("body", f"f{i}"), "msg": "bad"} for i in range(7)]
    assert validation_message(errors) == "f0: bad; f1: bad; f2: bad; f3: bad; f4: bad (and 2 more)"
    assert validation_message([{"loc": ("body",), "msg": "x"}]) == "body: x"


def test_vllm_error_responses_keep_their_status_except_in_the_lmi_schema():
    class Err:
        code, message, param = 400, "too long", "prompt"

    class Response:
        error = Err()

    assert from_vllm_error(Response()).status == 400
    assert from_vllm_error(Response()).status_for(Shape.LMI) == 424  # LMI's CI: input too long is a 424

    class BadValue:
        code, message, param = 400, "temperature must be non-negative", "temperature"

    class ValueResponse:
        error = BadValue()

    assert from_vllm_error(ValueResponse()).status_for(Shape.LMI) == 400  # a bad value stays vLLM's 400


@pytest.mark.parametrize("exc, status", [
    (AdapterNotFound("a", []), 404),
    (AdapterConflict("taken"), 409),
    (AdapterInvalid("bad config"), 400),
    (FormatterInvalid("model.py failed to import"), 400),
    (AdapterUnavailable("cannot load"), 424),
    (FormatterError("formatter raised"), 424),
])
def test_adapter_errors_map_to_one_status_each(exc, status):
    assert from_adapter_error(exc).status == status
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise exc

    r = TestClient(app).get("/boom")
    assert r.status_code == status and r.json()["error"]["code"] == status


def test_unexpected_errors_are_500():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("oops")

    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError" and "oops" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------------- body


def _body_app(limit: int) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(request: Request):
        return {"got": await read_json_body(request, limit)}

    return TestClient(app)


def test_read_json_body_limits_and_syntax():
    client = _body_app(100)
    assert client.post("/echo", content=b'{"a": 1}').json() == {"got": {"a": 1}}
    assert client.post("/echo", content=b"x" * 200).status_code == 413
    r = client.post("/echo", content=b"   ")
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    r = client.post("/echo", content=b"{nope")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert _body_app(10_000).post("/echo", content=deep.encode()).status_code == 400


def test_json_depth_is_measured_without_recursion():
    assert not json_depth_exceeds({"a": [1, {"b": 2}]}, limit=3)
    assert json_depth_exceeds({"a": [1, {"b": []}]}, limit=3)
    value: list = []
    for _ in range(100_000):
        value = [value]
    assert json_depth_exceeds(value)


def test_tgi_compat_shapes_a_list_and_server_sent_events():
    from lmi_server.api.sagemaker.lmi_protocol import as_sse, tgi_list

    assert tgi_list({"generated_text": "a"}) == [{"generated_text": "a"}]
    assert tgi_list([{"generated_text": "a"}]) == [{"generated_text": "a"}]

    async def lines():
        yield '{"token": 1}\n'

    assert _collect(as_sse(lines())) == ['data: {"token": 1}\n\n']
