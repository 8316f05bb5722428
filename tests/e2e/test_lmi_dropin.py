"""An LMI user's model directory, unchanged: serving.properties, a model-level model.py written
against LMI's `djl_python` formatter contract, and adapters (one with its own model.py) whose
adapter_config.json names the hub model they were fine-tuned from.

The model-level input formatter turns the deployment's own body shape ({"question": ...}) into an
LMI request; its output formatter gets vLLM's response objects (whole, or each stream chunk) and
what it returns is sent. The adapter's output formatter wins for the adapter's requests.
"""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from tests.e2e.conftest import _adapters_for
from tests.e2e.test_lora import HEADER, HELLO
from tests.support.server import DEMO_PROPS, running_server

pytestmark = pytest.mark.e2e

HUB_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the adapters say; the server serves lmi-demo

MODEL_PY = '''
import json

from djl_python import Input
from djl_python.encode_decode import decode
from djl_python.input_parser import input_formatter
from djl_python.output_formatter import output_formatter

import helpers  # a module beside model.py
from djl_python.async_utils import create_non_stream_output


async def handle(inputs: Input):
    """LMI's custom handler: takes requests that ask for it, leaves the rest to the server."""
    payload = decode(inputs, inputs.get_property("Content-Type"))
    if payload.get("handler") != "custom":
        return None
    if payload.get("fail"):
        raise RuntimeError("custom handler intentionally failed")
    props = inputs.get_properties()
    return create_non_stream_output({"custom_handler_used": True, "echo": payload.get("inputs"), "model_id": props.get("model_id")})


@input_formatter
def custom_input_formatter(decoded_payload, tokenizer=None, **kwargs):
    if "question" not in decoded_payload:
        return decoded_payload  # LMI and OpenAI bodies pass through
    if decoded_payload["question"] == "fail":
        raise ValueError("input formatter refused the question")
    if tokenizer is None or not tokenizer.encode(decoded_payload["question"]):
        raise ValueError("the engine's tokenizer was not handed over")
    return {
        "inputs": decoded_payload["question"],
        "parameters": {"max_new_tokens": decoded_payload.get("max_len", 8), "temperature": 0},
        "stream": decoded_payload.get("stream", False),
    }


@output_formatter
def custom_output_formatter(response):
    if isinstance(response, str):  # a stream chunk, the string vLLM yields: "data: {...}"
        data = response[len("data: "):].strip()
        if data == "[DONE]":
            return {"piece": None, "done": True, "formatted_by": "model"}
        choice = (json.loads(data).get("choices") or [{}])[0]
        piece = choice["text"] if "text" in choice else (choice.get("delta") or {}).get("content")
        return {"piece": piece, "formatted_by": "model"}
    choice = response.choices[0]
    text = choice.message.content if hasattr(choice, "message") else choice.text
    return helpers.wrap(text, response)
'''

HELPERS_PY = '''
def wrap(text, response):
    return {"answer": text, "formatted_by": "model", "type": type(response).__name__}
'''

ADAPTER_MODEL_PY = '''
from djl_python.output_formatter import output_formatter


@output_formatter
def adapter_output(response):
    choice = response.choices[0]
    return {"adapter_answer": choice.text, "formatted_by": "adapter", "type": type(response).__name__}
'''

RAISING_MODEL_PY = '''
from djl_python.output_formatter import output_formatter


@output_formatter
def broken(response):
    raise RuntimeError("output formatter intentionally failed")
'''


@pytest.fixture(scope="module")
def lmi_dir(tmp_path_factory):
    from lmi_server.demo.builder import ensure_demo_model

    model_dir = tmp_path_factory.mktemp("lmi-model-dir")
    (model_dir / "model.py").write_text(MODEL_PY)
    (model_dir / "helpers.py").write_text(HELPERS_PY)
    root = model_dir / "adapters"  # LMI's layout: adapters/ beside serving.properties
    root.mkdir()
    _adapters_for(ensure_demo_model(), root)
    shutil.rmtree(root / "shouter")
    shutil.copytree(root / "hello-printer", root / "formatted")
    (root / "formatted" / "model.py").write_text(ADAPTER_MODEL_PY)
    shutil.copytree(root / "hello-printer", root / "raising")
    (root / "raising" / "model.py").write_text(RAISING_MODEL_PY)
    for name in ("hello-printer", "formatted", "raising"):
        cfg_path = root / name / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["base_model_name_or_path"] = HUB_BASE  # fine-tuned from the hub id
        cfg_path.write_text(json.dumps(cfg))
    props = {**DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8"}
    with running_server(model_dir, props) as proc:
        yield proc


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
