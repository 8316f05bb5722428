"""End to end through real HTTP against the real server and vLLM engine on the demo model."""

from __future__ import annotations

import json
import time

import httpx
import pytest

PROMPT = "def parse_args(argv):\n    "


def post(server, path, body=None, *, content=None, headers=None, timeout=120):
    return httpx.post(server.base_url + path, json=body, content=content, headers=headers, timeout=timeout)


def assert_healthy(server):
    r = post(server, "/invocations", {"inputs": "import os", "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["generated_text"], str)


# ---------------------------------------------------------------- /ping and /v1/models


def test_ping_answered_503_while_loading_then_200(server):
    assert 503 in server.ping_history, server.ping_history
    assert server.ping_history[-1] == 200
    assert httpx.get(server.base_url + "/ping").status_code == 200


def test_models_lists_the_served_name(busy_server):
    """With LoRA off, the served name alone (the shared server lists its adapters too: test_lora.py)."""
    from openai import OpenAI

    client = OpenAI(base_url=busy_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ids = [m.id for m in client.models.list().data]
    assert ids == ["lmi-demo"]


# ---------------------------------------------------------------- OpenAI API with the official client


def test_chat_completion_with_openai_client(openai_client):
    resp = openai_client.chat.completions.create(
        model="lmi-demo", messages=[{"role": "user", "content": "Write a loop"}], max_tokens=8, temperature=0
    )
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.completion_tokens == 8 or resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 0


def test_chat_streaming_with_openai_client(openai_client):
    stream = openai_client.chat.completions.create(
        model="lmi-demo",
        messages=[{"role": "user", "content": "Write a loop"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert text
    assert usage and usage[-1].completion_tokens >= 1
    full = openai_client.chat.completions.create(
        model="lmi-demo", messages=[{"role": "user", "content": "Write a loop"}], max_tokens=8, temperature=0
    )
    assert full.choices[0].message.content == text


def test_completion_and_streaming_agree(openai_client):
    full = openai_client.completions.create(model="lmi-demo", prompt=PROMPT, max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].text for c in openai_client.completions.create(
        model="lmi-demo", prompt=PROMPT, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert full.choices[0].text == streamed
    assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens <= 12


def test_usage_reports_prompt_tokens_details(server):
    r = post(server, "/v1/completions", {"model": "lmi-demo", "prompt": PROMPT * 40, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert "cached_tokens" in r.json()["usage"]["prompt_tokens_details"]


# ---------------------------------------------------------------- vLLM's render API (a KV-aware router reads it)


@pytest.fixture(scope="module")
def demo_tokenizer():
    from transformers import AutoTokenizer

    from lmi_server.demo.builder import ensure_demo_model

    return AutoTokenizer.from_pretrained(str(ensure_demo_model()))


def test_completion_render_returns_the_prompts_token_ids(server, demo_tokenizer):
    r = post(server, "/v1/completions/render", {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 200, r.text
    (rendered,) = r.json()
    assert rendered["token_ids"] == demo_tokenizer(PROMPT).input_ids
    served = post(server, "/v1/completions", {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": 1}).json()
    assert served["usage"]["prompt_tokens"] == len(rendered["token_ids"])  # what generation reads


def test_chat_render_returns_the_templated_prompts_token_ids(server, demo_tokenizer):
    messages = [{"role": "user", "content": "Write a loop"}]
    r = post(server, "/v1/chat/completions/render", {"model": "lmi", "messages": messages})
    assert r.status_code == 200, r.text
    rendered = r.json()
    assert rendered["token_ids"] == demo_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert rendered["model"] == "lmi-demo"  # "lmi" names the base model, as on the other routes
    served = post(server, "/v1/chat/completions", {"model": "lmi-demo", "messages": messages, "max_tokens": 1}).json()
    assert served["usage"]["prompt_tokens"] == len(rendered["token_ids"])


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/v1/completions/render", {"model": "lmi-demo"}, 422),  # no prompt
        ("/v1/completions/render", {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": -1}, 422),
        ("/v1/completions/render", {"model": "no-such-model", "prompt": PROMPT}, 404),
        ("/v1/chat/completions/render", {"model": "lmi-demo", "messages": "not a list"}, 422),
        ("/v1/chat/completions/render", [1, 2], 400),
        # a Harmony-format message (gpt-oss only) or an image for a text-only model: 400, not a 500
        ("/v1/chat/completions/render", {"model": "lmi-demo", "messages": [{"author": {"role": "user"}, "content": []}]}, 400),
        ("/v1/chat/completions/render", {"model": "lmi-demo", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400),
    ],
)
def test_render_refuses_a_bad_body(server, path, body, status):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    r = post(server, path, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


# ---------------------------------------------------------------- /invocations: three schemas


def test_invocations_lmi_schema_matches_openai_greedy(server):
    lmi = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "do_sample": False}})
    assert lmi.status_code == 200, lmi.text
    oai = post(server, "/v1/completions", {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    assert lmi.json() == {"generated_text": oai.json()["choices"][0]["text"]}


def test_invocations_lmi_details_and_full_text(server):
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True, "return_full_text": True, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["generated_text"].startswith(PROMPT)
    details = body["details"]
    assert details["generated_tokens"] == 6 and details["finish_reason"] == "length"
    assert len(details["tokens"]) == 6
    assert all(isinstance(t["id"], int) and t["log_prob"] <= 0 for t in details["tokens"])
    assert PROMPT + "".join(t["text"] for t in details["tokens"]) == body["generated_text"]


def test_invocations_lmi_list_of_inputs(server):
    r = post(server, "/invocations", {"inputs": ["import os", "class A:"], "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list) and len(r.json()) == 2
    assert all("generated_text" in item for item in r.json())


def test_invocations_lmi_seeded_sampling_is_reproducible(server):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "do_sample": True, "temperature": 0.9, "seed": 42}}
    a, b = post(server, "/invocations", body).json(), post(server, "/invocations", body).json()
    assert a == b


def test_invocations_lmi_streams_jsonlines(server):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", server.base_url + "/invocations", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/jsonlines")
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    # LMI's shape: a token on every line (with its log probability), the text on the last one
    tokens = [line["token"] for line in lines]
    assert len(tokens) == 8 and all(isinstance(t["id"], int) and t["log_prob"] <= 0 for t in tokens)
    assert all(line["generated_text"] is None for line in lines[:-1])
    assert lines[-1]["generated_text"] == "".join(t["text"] for t in tokens)
    full = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "ignore_eos": True}}).json()
    assert full["generated_text"] == lines[-1]["generated_text"]


def test_invocations_chat_schema(server):
    r = post(server, "/invocations", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_invocations_chat_schema_streams_openai_chunks(server):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.base_url + "/invocations", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/jsonlines")  # LMI streams jsonlines on /invocations
        lines = [line for line in r.iter_lines() if line.strip()]
    chunks = [json.loads(line) for line in lines]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)


def test_invocations_passes_vllm_sampling_parameters_through(server):
    params = {"max_new_tokens": 6, "min_p": 0.05, "stop_token_ids": [], "include_stop_str_in_output": False,
              "skip_special_tokens": True, "ignore_eos_token": True, "repetition_penalty": 1.0, "details": True,
              "decoder_input_details": True}
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": params})
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    assert details["generated_tokens"] == 6 and details["finish_reason"] == "length"
    prefill = details["prefill"]  # the prompt's tokens with their log probabilities
    assert len(prefill) >= 2 and prefill[0]["log_prob"] is None and all(t["log_prob"] <= 0 for t in prefill[1:])
    assert "".join(t["text"] for t in prefill[1:]) in PROMPT


def test_invocations_reports_a_stop_sequence_stop_as_lmi_does(server):
    first = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "ignore_eos_token": True}})
    word = first.json()["generated_text"].strip().split()[0]
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "stop_sequences": [word], "details": True}})
    assert r.status_code == 200, r.text
    assert r.json()["details"]["finish_reason"] == "stop_sequence", r.text


def test_invocations_model_lmi_names_the_base_model(server):
    r = post(server, "/invocations", {"model": "lmi", "prompt": "import sys", "max_tokens": 3})
    assert r.status_code == 200, r.text
    r = post(server, "/invocations", {"model": "lmi", "inputs": "import sys", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text


def test_invocations_completion_schema(server):
    r = post(server, "/invocations", {"prompt": "import sys", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "text_completion"


# ---------------------------------------------------------------- bad input, each followed by a good request


@pytest.mark.parametrize(
    "path,kwargs,status,needle",
    [
        ("/invocations", {"content": b'{"inputs": "x",'}, 400, "not valid JSON"),
        ("/invocations", {"content": b""}, 400, "empty"),
        ("/invocations", {"body": [1, 2]}, 400, "JSON object"),
        ("/invocations", {"body": {"question": "hi"}}, 424, "none of the accepted schemas"),
        ("/invocations", {"body": {"inputs": "x", "parameters": {"max_new_tokens": "many"}}}, 400, "max_new_tokens"),
        ("/invocations", {"body": {"inputs": "x", "parameters": {"temprature": 0.5}}}, 400, "temprature"),
        ("/invocations", {"body": {"inputs": "x", "parameters": {"top_p": 3}}}, 400, "top_p"),
        ("/invocations", {"body": {"inputs": "x", "parameters": {"min_p": "low"}}}, 400, "min_p"),
        ("/invocations", {"body": {"inputs": "x", "parameters": {"temperature": -1, "do_sample": True}}}, 400, "temperature"),
        ("/invocations", {"body": {"inputs": "word " * 5000, "parameters": {"max_new_tokens": 4}}}, 424, "context length"),
        ("/invocations", {"body": {"messages": "not a list"}}, 424, "messages"),
        ("/v1/chat/completions", {"body": {"model": "lmi-demo", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}}, 422, "temperature"),
        ("/v1/completions", {"body": {"model": "lmi-demo", "prompt": "x", "max_tokens": -3}}, 422, "max_tokens"),
        ("/v1/completions", {"body": {"model": "lmi-demo", "prompt": "word " * 5000, "max_tokens": 4}}, 400, "context length"),
        ("/v1/completions", {"body": {"model": "no-such-model", "prompt": "x"}}, 404, "no-such-model"),
        ("/v1/chat/completions", {"content": b"{" + b" " * 300000 + b"}"}, 413, "exceeds the limit"),
        ("/invocations", {"content": b"x" * 300000}, 413, "exceeds the limit"),
    ],
)
def test_bad_input_gets_clear_error_then_server_still_serves(server, path, kwargs, status, needle):
    body = kwargs.get("body")
    content = kwargs.get("content")
    r = post(server, path, body, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    payload = r.json()
    message = payload["error"] if isinstance(payload["error"], str) else payload["error"]["message"]
    assert needle.lower() in message.lower(), message
    assert_healthy(server)


# ---------------------------------------------------------------- metrics and disconnects


def metric_value(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_metrics_has_engine_and_server_series(server, openai_client):
    openai_client.completions.create(model="lmi-demo", prompt="x = 1", max_tokens=3, stream=True).close()
    list(openai_client.completions.create(model="lmi-demo", prompt="x = 1", max_tokens=3, stream=True))
    text = httpx.get(server.base_url + "/metrics").text
    assert metric_value(text, "lmi_requests_total", route="/v1/completions", status="200") >= 1
    assert metric_value(text, "lmi_request_latency_seconds_count", route="/v1/completions") >= 1
    assert metric_value(text, "lmi_time_to_first_token_seconds_count", route="/v1/completions") >= 1
    assert metric_value(text, "vllm:prompt_tokens_total") > 0
    assert metric_value(text, "vllm:time_to_first_token_seconds_count") > 0


def test_client_disconnect_mid_stream_aborts_generation(server):
    def metrics() -> str:
        return httpx.get(server.base_url + "/metrics").text

    def generated() -> float:
        return metric_value(metrics(), "vllm:generation_tokens_total") or 0.0

    before = generated()
    body = {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (metric_value(metrics(), "vllm:num_requests_running") or 0) > 0:
        time.sleep(0.25)
    assert (metric_value(metrics(), "vllm:num_requests_running") or 0) == 0
    settled = generated()
    time.sleep(2)
    assert generated() == settled, "the engine kept generating after the client left"
    assert settled - before < 3000, "the request ran to completion instead of being aborted"
    assert_healthy(server)
