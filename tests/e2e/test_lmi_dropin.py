"""An LMI user's model directory, unchanged: serving.properties, a model-level model.py written
against LMI's `djl_python` formatter contract, and adapters (one with its own model.py) whose
adapter_config.json names the hub model they were fine-tuned from.

The model-level input formatter turns the deployment's own body shape ({"question": ...}) into an
LMI request; its output formatter gets vLLM's response objects (whole, or each stream chunk) and
what it returns is sent. The adapter's output formatter wins for the adapter's requests.

The server (`lmi_dir`, tests/e2e/conftest.py) is the one tests/e2e/test_fuzz.py fuzzes after this
module: a short context (option.max_model_len=128) and a batch of 16 for the fuzzer.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.test_lora import HEADER, HELLO
from tests.support.lmi_model_dir import HUB_BASE

pytestmark = pytest.mark.e2e

def post(server, path, body, headers=None):
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def test_a_custom_body_shape_is_turned_into_an_lmi_request_by_the_input_formatter(lmi_dir):
    r = post(lmi_dir, "/invocations", {"question": "def main():", "max_len": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["formatted_by"] == "model" and body["type"] == "CompletionResponse"
    assert isinstance(body["answer"], str) and body["answer"]


def test_openai_routes_get_the_model_level_formatters(lmi_dir):
    r = post(lmi_dir, "/v1/completions", {"model": "lmi-demo", "prompt": "import os", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["formatted_by"] == "model" and r.json()["type"] == "CompletionResponse"
    r = post(lmi_dir, "/v1/chat/completions", {
        "model": "lmi-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "ChatCompletionResponse"


def test_each_stream_chunk_goes_through_the_output_formatter(lmi_dir):
    with httpx.stream("POST", lmi_dir.base_url + "/v1/chat/completions", json={
            "model": "lmi-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(c["formatted_by"] == "model" and "piece" in c for c in chunks)
    # LMI schema, streamed: jsonlines, one formatted chunk per line
    with httpx.stream("POST", lmi_dir.base_url + "/invocations", json={"question": "def f():", "max_len": 5, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert lines and all(line["formatted_by"] == "model" for line in lines)
    assert lines[-1]["done"] is True  # LMI hands the formatter the end marker too


def test_a_custom_handle_takes_the_requests_it_wants_and_leaves_the_rest(lmi_dir):
    r = post(lmi_dir, "/invocations", {"handler": "custom", "inputs": "hello"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["custom_handler_used"] is True and body["echo"] == "hello" and body["model_id"]  # the model's properties
    failed = post(lmi_dir, "/invocations", {"handler": "custom", "fail": True})
    assert failed.status_code == 424 and failed.json()["code"] == 424
    assert "Custom handler failed" in failed.json()["error"] and "intentionally failed" in failed.json()["error"]
    served = post(lmi_dir, "/invocations", {"inputs": "def f():", "parameters": {"max_new_tokens": 3}})
    assert served.status_code == 200 and served.json()["formatted_by"] == "model"  # returned None: the server served it


def test_an_adapters_own_formatter_wins_for_its_requests(lmi_dir):
    r = post(lmi_dir, "/invocations", {"question": "def main():", "max_len": 12}, headers={HEADER: "formatted"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["formatted_by"] == "adapter" and body["adapter_answer"].startswith(HELLO)  # the model's input formatter ran
    # an adapter without a model.py gets the model-level formatters
    r = post(lmi_dir, "/invocations", {"inputs": "def main():", "parameters": {"max_new_tokens": 12}, "adapters": "hello-printer"})
    assert r.status_code == 200 and r.json()["formatted_by"] == "model" and r.json()["answer"].startswith(HELLO), r.text


def test_adapters_fine_tuned_from_the_hub_id_are_listed_and_serve(lmi_dir):
    names = {a["name"] for a in httpx.get(lmi_dir.base_url + "/adapters", timeout=30).json()["adapters"]}
    assert {"hello-printer", "formatted", "raising"} <= names
    assert f"names base model '{HUB_BASE}'" in lmi_dir.log_path.read_text(errors="replace")


def test_a_failing_formatter_is_lmis_424_and_the_server_keeps_serving(lmi_dir):
    r = post(lmi_dir, "/invocations", {"question": "fail"})
    assert r.status_code == 424 and "input formatter refused the question" in r.text
    r = post(lmi_dir, "/invocations", {"inputs": "x", "parameters": {"max_new_tokens": 3}}, headers={HEADER: "raising"})
    assert r.status_code == 424 and "output formatter intentionally failed" in r.text
    with httpx.stream("POST", lmi_dir.base_url + "/v1/completions", json={
            "model": "raising", "prompt": "x", "max_tokens": 4, "stream": True}, timeout=120) as s:
        s.read()
        assert s.status_code == 424
    r = post(lmi_dir, "/invocations", {"question": "import os", "max_len": 3})
    assert r.status_code == 200 and r.json()["formatted_by"] == "model"
