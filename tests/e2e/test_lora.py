"""LoRA adapters end to end: the real server (vLLM engine, LoRA on) and the committed example
adapters, through HTTP. The `lora` server (tests/e2e/conftest.py: the shared `server`; max_loras=2,
so three adapters evict) is shared with the modules before this one, which name no existing
adapter, and with the concurrent fuzzer, which runs after every module."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

HELLO = 'print("hello world")'
SHOUT = "RAISE NOTIMPLEMENTEDERROR"
HEADER = "X-Amzn-SageMaker-Adapter-Identifier"


def post(server, path, body=None, headers=None, timeout=120, params=None):
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=timeout, params=params)


def lmi(server, inputs="def main():", adapter=None, header=None, **params):
    body = {"inputs": inputs, "parameters": {"max_new_tokens": 12, **params}}
    if adapter is not None:
        body["adapters"] = adapter
    return post(server, "/invocations", body, headers={HEADER: header} if header else None)


def loads(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    m = re.search(r'^lmi_adapter_loads_total\{adapter="%s"\} ([0-9.e+]+)$' % re.escape(name), text, re.M)
    return float(m.group(1)) if m else 0.0


def assert_healthy(server):
    r = lmi(server, "import os", max_new_tokens=2)
    assert r.status_code == 200, r.text
    r = lmi(server, "import os", adapter="hello-printer")
    assert r.status_code == 200 and r.json()["generated_text"].startswith(HELLO), r.text


# ---------------------------------------------------------------- discovery


def test_listing_before_any_load(lora):
    r = httpx.get(lora.base_url + "/adapters")
    assert r.status_code == 200
    body = r.json()
    names = [a["name"] for a in body["adapters"]]
    assert names == ["hello-copy", "hello-printer", "raising", "shouter"]
    assert all(a["status"] == "registered" and a["loads"] == 0 for a in body["adapters"])
    assert "no_such_module_for_lora_tests" in body["failed"]["broken-script"]
    shouter = next(a for a in body["adapters"] if a["name"] == "shouter")
    assert shouter["output_formatter"] and shouter["rank"] == 8
    models = [m["id"] for m in httpx.get(lora.base_url + "/v1/models").json()["data"]]
    assert models == ["lmi-demo", "hello-copy", "hello-printer", "raising", "shouter"]
    assert loads(lora, "hello-printer") == 0
    assert httpx.get(lora.base_url + "/models/lmi-demo/adapters").json()["adapters"] == body["adapters"]


# ---------------------------------------------------------------- lazy load, effect, formatters


def test_concurrent_first_calls_load_once(lora):
    def call(i):
        if i % 3 == 0:
            return lmi(lora, adapter="hello-printer")
        if i % 3 == 1:
            return lmi(lora, header="hello-printer")
        return post(lora, "/v1/completions", {"model": "hello-printer", "prompt": "x = 1", "max_tokens": 12, "temperature": 0})

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, range(6)))
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert loads(lora, "hello-printer") == 1
    described = httpx.get(lora.base_url + "/adapters/hello-printer").json()
    assert described["status"] == "loaded" and described["loads"] == 1


def test_adapter_effect_is_visible(lora):
    base = lmi(lora, "def main():")
    assert base.status_code == 200 and not base.json()["generated_text"].startswith(HELLO)
    for prompt in ("def main():", "import sys", "class Foo:"):
        r = lmi(lora, prompt, adapter="hello-printer")
        assert r.json()["generated_text"].startswith(HELLO), r.text
    chat = post(lora, "/v1/chat/completions", {
        "model": "hello-printer", "messages": [{"role": "user", "content": "Write a loop"}], "max_tokens": 12, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"].startswith(HELLO), chat.text
    assert chat.json()["model"] == "hello-printer"


def test_formatter_runs_for_its_adapter_only(lora):
    r = lmi(lora, "def main():", adapter="shouter")
    assert r.status_code == 200 and r.json()["generated_text"].startswith(SHOUT), r.text
    comp = post(lora, "/v1/completions", {"model": "shouter", "prompt": "import os", "max_tokens": 12, "temperature": 0})
    assert comp.json()["choices"][0]["text"].startswith(SHOUT), comp.text
    # streaming: SSE (OpenAI) and jsonlines (LMI)
    with httpx.stream("POST", lora.base_url + "/v1/completions", json={
            "model": "shouter", "prompt": "import os", "max_tokens": 12, "temperature": 0, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    streamed = "".join(c["text"] for e in events for c in e["choices"])
    assert streamed.startswith(SHOUT) and streamed == streamed.upper(), streamed
    with httpx.stream("POST", lora.base_url + "/invocations", json={
            "inputs": "import os", "parameters": {"max_new_tokens": 12}, "stream": True, "adapters": "shouter"}, timeout=120) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line.strip()]
    assert lines[-1]["generated_text"].startswith(SHOUT)
    assert "".join(line["token"]["text"] for line in lines[:-1]).startswith(SHOUT)
    # other adapters and the base model are untouched by shouter's formatter
    assert lmi(lora, "def main():", adapter="hello-printer").json()["generated_text"].startswith(HELLO)
    base_text = lmi(lora, "def main():", max_new_tokens=20).json()["generated_text"]
    assert SHOUT not in base_text


def test_precedence_header_then_body_then_model(lora):
    r = lmi(lora, adapter="hello-printer", header="shouter")
    assert r.json()["generated_text"].startswith(SHOUT)
    r = post(lora, "/v1/completions", {"model": "hello-printer", "prompt": "def main():", "max_tokens": 12, "temperature": 0},
             headers={HEADER: "shouter"})
    assert r.json()["choices"][0]["text"].startswith(SHOUT)
    r = post(lora, "/invocations", {"model": "lmi-demo", "prompt": "def main():", "max_tokens": 12, "temperature": 0},
             headers={HEADER: "hello-printer"})
    assert r.json()["choices"][0]["text"].startswith(HELLO)
    # LMI reads the body field `adapters` in any schema on /invocations
    r = post(lora, "/invocations", {"prompt": "import os", "max_tokens": 12, "temperature": 0, "adapters": "shouter"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(SHOUT), r.text
    r = post(lora, "/invocations", {"prompt": "def main():", "max_tokens": 12, "temperature": 0, "adapters": ["hello-printer"]})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(HELLO), r.text
    chat = {"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 12, "temperature": 0}
    base = post(lora, "/invocations", chat).json()["choices"][0]["message"]["content"]
    shouted = post(lora, "/invocations", {**chat, "adapters": "shouter"}).json()["choices"][0]["message"]["content"]
    assert shouted != base and shouted == shouted.upper(), (base, shouted)


def test_the_adapters_field_names_the_adapter_on_the_v1_routes(lora):
    chat = post(lora, "/v1/chat/completions", {
        "model": "lmi-demo", "adapters": "hello-printer", "messages": [{"role": "user", "content": "Write a loop"}],
        "max_tokens": 12, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"].startswith(HELLO), chat.text
    assert chat.json()["model"] == "hello-printer"
    comp = post(lora, "/v1/completions", {"prompt": "import os", "max_tokens": 12, "temperature": 0, "adapters": ["shouter"]})
    assert comp.status_code == 200 and comp.json()["choices"][0]["text"].startswith(SHOUT), comp.text


def test_eviction_and_reload(lora):
    before = {n: loads(lora, n) for n in ("hello-printer", "shouter", "hello-copy")}
    for name in ("hello-printer", "shouter", "hello-copy", "hello-printer", "shouter"):
        r = lmi(lora, "def main():", adapter=name)
        assert r.status_code == 200
        assert r.json()["generated_text"].startswith(SHOUT if name == "shouter" else HELLO), (name, r.text)
    after = {n: loads(lora, n) for n in before}
    # max_loras=2: hello-copy evicts one of the others; each reload is a counted load
    assert after["hello-copy"] - before["hello-copy"] == 1
    assert sum(after.values()) - sum(before.values()) >= 3
    resident = [a["name"] for a in httpx.get(lora.base_url + "/adapters").json()["adapters"] if a["status"] == "loaded"]
    assert len(resident) <= 2
    assert "lmi_adapter_evictions_total" in httpx.get(lora.base_url + "/metrics").text


# ---------------------------------------------------------------- errors, each followed by a healthy request


def test_unknown_adapter_is_404_naming_it(lora):
    r = lmi(lora, adapter="no-such-adapter")
    assert r.status_code == 404 and "no-such-adapter" in r.json()["error"]
    assert_healthy(lora)
    r = lmi(lora, header="ghost-adapter")
    assert r.status_code == 404 and "ghost-adapter" in r.json()["error"]
    r = post(lora, "/v1/completions", {"model": "phantom", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 404 and "phantom" in r.json()["error"]["message"]
    r = post(lora, "/v1/chat/completions", {"model": "lmi-demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
             headers={HEADER: "phantom"})
    assert r.status_code == 404 and "phantom" in r.json()["error"]["message"]
    assert_healthy(lora)


def test_broken_script_is_424(lora):
    r = lmi(lora, adapter="broken-script")
    assert r.status_code == 424 and "no_such_module_for_lora_tests" in r.json()["error"], r.text
    r = post(lora, "/v1/completions", {"model": "broken-script", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 424
    assert_healthy(lora)


def test_raising_formatter_is_424_with_its_message(lora):
    r = lmi(lora, adapter="raising")
    assert r.status_code == 424 and "formatter refused" in r.json()["error"], r.text
    r = post(lora, "/v1/completions", {"model": "raising", "prompt": "x", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 424 and "formatter refused" in r.json()["error"]["message"]
    with httpx.stream("POST", lora.base_url + "/v1/completions", json={
            "model": "raising", "prompt": "x", "max_tokens": 4, "stream": True}, timeout=120) as s:
        s.read()
        assert s.status_code == 424
    assert_healthy(lora)


def _copy(lora, src: str, name: str) -> Path:
    dst = lora.adapter_root / name
    shutil.copytree(lora.adapter_root / src, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def _widen_lora_a(path: Path) -> None:
    """Give every lora_A one more input column: tensors of a base with another hidden size."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    for key, value in list(tensors.items()):
        if ".lora_A." in key:
            tensors[key] = np.concatenate([value, np.zeros((value.shape[0], 1), value.dtype)], axis=1)
    save_file(tensors, str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize(
    "case, expected",
    [
        ("rank", "exceeds option.max_lora_rank=8"),
        ("base", "wrong base model"),
        ("missing", "adapter_model.safetensors is missing"),
        ("corrupt", "corrupt"),
        ("targets", "do not exist in the base model"),
        ("outside", "outside the allowed adapter root"),
        ("name", "invalid adapter name"),
        ("script", "failed to import"),
        ("pickle", "refused (read with torch.load(weights_only=True))"),
    ],
)
def test_register_validation_errors_are_400(lora, tmp_path, case, expected):
    name = f"bad-{case}"
    src = name
    if case == "outside":
        src = str(shutil.copytree(lora.adapter_root / "hello-printer", tmp_path / "elsewhere"))
    elif case == "name":
        name = "../evil"
        src = "hello-printer"
    else:
        path = _copy(lora, "hello-printer", name)
        if case == "rank":
            _edit_config(path, r=16)
        elif case == "base":  # another base's name AND its shapes: the shapes refuse it
            _edit_config(path, base_model_name_or_path="meta-llama/Llama-3.1-8B")
            _widen_lora_a(path)
        elif case == "missing":
            (path / "adapter_model.safetensors").unlink()
        elif case == "corrupt":
            (path / "adapter_model.safetensors").write_bytes(b"\x00" * 100)
        elif case == "targets":
            _edit_config(path, target_modules=["q_proj", "router_proj"])
        elif case == "script":
            (path / "model.py").write_text("def broken(:\n")
        elif case == "pickle":  # an adapter_model.bin whose unpickling would run a command
            _pickle_that_runs(path / "adapter_model.bin", tmp_path / "pwned")
            (path / "adapter_model.safetensors").unlink()
    r = post(lora, "/adapters", {"name": name, "src": src})
    assert r.status_code == 400, r.text
    assert expected in r.json()["error"]["message"]
    assert httpx.get(lora.base_url + f"/adapters/{name.replace('/', '%2F')}").status_code in (404, 400)
    assert not (tmp_path / "pwned").exists()
    assert_healthy(lora)


def _pickle_that_runs(path: Path, marker: Path) -> None:
    import os

    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": Payload()}, str(path))


def test_register_use_and_delete_through_the_api(lora):
    _copy(lora, "hello-printer", "fresh")
    r = post(lora, "/models/lmi-demo/adapters", params={"name": "fresh", "src": "fresh", "preload": "true"})
    assert r.status_code == 200, r.text
    assert r.json()["adapter"]["status"] == "loaded" and loads(lora, "fresh") == 1
    assert post(lora, "/adapters", {"name": "fresh", "src": "fresh"}).status_code == 409
    assert "fresh" in [m["id"] for m in httpx.get(lora.base_url + "/v1/models").json()["data"]]
    r = lmi(lora, adapter="fresh")
    assert r.json()["generated_text"].startswith(HELLO)

    # a request in flight when the adapter is deleted finishes normally
    result = {}

    def long_request():
        result["r"] = lmi(lora, "def main():", adapter="fresh", max_new_tokens=300, ignore_eos=True)

    t = threading.Thread(target=long_request)
    t.start()
    for _ in range(200):
        if httpx.get(lora.base_url + "/adapters/fresh").json().get("in_flight"):
            break
        time.sleep(0.05)
    d = httpx.delete(lora.base_url + "/adapters/fresh")
    assert d.status_code == 200, d.text
    assert lmi(lora, adapter="fresh").status_code == 404
    t.join(300)
    assert result["r"].status_code == 200 and result["r"].json()["generated_text"].startswith(HELLO)
    assert httpx.delete(lora.base_url + "/adapters/fresh").status_code == 404
    assert "fresh" not in [m["id"] for m in httpx.get(lora.base_url + "/v1/models").json()["data"]]
    # re-register under the model-scoped path (lazily: preload false), then delete there
    r = post(lora, "/models/lmi-demo/adapters", {"name": "fresh", "src": "fresh", "preload": False})
    assert r.status_code == 200 and r.json()["adapter"]["status"] == "registered"
    assert httpx.delete(lora.base_url + "/models/lmi-demo/adapters/fresh").status_code == 200
    # one model is served: any model name in the path addresses it (LMI's client uses its directory's name)
    assert httpx.get(lora.base_url + "/models/other-model/adapters").json()["adapters"] == httpx.get(lora.base_url + "/adapters").json()["adapters"]
    assert_healthy(lora)


def test_lmi_management_verbs_with_a_bin_adapter(lora):
    """PEFT's safe_serialization=False layout (adapter_model.bin), managed with LMI's verbs and
    defaults at LMI's paths: register (lazily), update (preload and pin), describe, delete."""
    import torch
    from safetensors.torch import load_file

    path = _copy(lora, "hello-printer", "hello-bin")
    torch.save(load_file(str(path / "adapter_model.safetensors")), str(path / "adapter_model.bin"))
    (path / "adapter_model.safetensors").unlink()
    r = post(lora, "/models/test/adapters", params={"name": "hello-bin", "src": "hello-bin", "preload": "false"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "Adapter hello-bin registered"
    assert r.json()["adapter"]["weights_file"] == "adapter_model.bin" and r.json()["adapter"]["status"] == "registered"
    r = post(lora, "/models/test/adapters/hello-bin/update", params={"preload": "true", "pin": "true"})
    assert r.status_code == 200 and r.json()["status"] == "Adapter hello-bin updated", r.text
    assert r.json()["adapter"]["status"] == "loaded" and r.json()["adapter"]["pin"] is True
    assert loads(lora, "hello-bin") == 1
    r = lmi(lora, adapter="hello-bin")
    assert r.status_code == 200 and r.json()["generated_text"].startswith(HELLO), r.text
    r = post(lora, "/adapters/hello-bin/update", {"pin": False})
    assert r.status_code == 400 and "Unpinning adapter is not supported" in r.text
    described = httpx.get(lora.base_url + "/models/any-name/adapters/hello-bin").json()
    assert {k: described[k] for k in ("name", "preload", "pin")} == {"name": "hello-bin", "preload": True, "pin": True}
    # LMI's integration client deletes through /models/test/adapters/{name}
    d = httpx.delete(lora.base_url + "/models/test/adapters/hello-bin")
    assert d.status_code == 200 and d.json()["status"] == "Adapter hello-bin unregistered", d.text
    assert lmi(lora, adapter="hello-bin").status_code == 404
    assert_healthy(lora)


def test_an_adapter_fine_tuned_from_a_hub_id_serves_when_its_tensors_match(lora):
    # The normal case on SageMaker: trained from "org/name", served from a local directory.
    path = _copy(lora, "hello-printer", "from-hub")
    _edit_config(path, base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")
    r = post(lora, "/adapters", {"name": "from-hub", "src": "from-hub"})
    assert r.status_code == 200, r.text
    r = lmi(lora, adapter="from-hub")
    assert r.status_code == 200 and r.json()["generated_text"].startswith(HELLO), r.text
    assert "names base model 'HuggingFaceTB/SmolLM2-135M-Instruct'" in lora.log_path.read_text(errors="replace")
    assert httpx.delete(lora.base_url + "/adapters/from-hub").status_code == 200


# ---------------------------------------------------------------- prompt log-probabilities with LoRA on

PROMPT = "DeepSpeed is a machine learning framework"
DETAILS = {"do_sample": True, "max_new_tokens": 16, "details": True, "decoder_input_details": True}


def _prompt_logprob_requests(rounds: int = 2) -> list[tuple[str, dict, int]]:
    """(path, body, expected status): every way of asking for prompt log-probabilities, beside
    ordinary requests, with the base model and with adapters."""
    completion = {"model": "lmi-demo", "prompt": PROMPT, "max_tokens": 8}
    chat = {"model": "lmi-demo", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    once = [
        ("/invocations", {"inputs": PROMPT, "parameters": DETAILS}, 200),
        ("/invocations", {"inputs": PROMPT, "parameters": DETAILS}, 200),
        ("/invocations", {"inputs": PROMPT, "parameters": DETAILS, "adapters": "hello-printer"}, 200),
        ("/invocations", {"inputs": PROMPT, "parameters": DETAILS, "adapters": "shouter"}, 200),
        ("/invocations", {"inputs": [PROMPT, PROMPT + " and more"], "parameters": DETAILS}, 200),
        ("/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 16}}, 200),
        ("/invocations", {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 16}, "adapters": "shouter"}, 200),
        ("/v1/completions", {**completion, "prompt_logprobs": 1}, 200),
        ("/v1/completions", {**completion, "prompt_logprobs": 0, "model": "hello-printer"}, 200),
        ("/v1/completions", {**completion, "echo": True, "logprobs": 1}, 200),
        ("/v1/completions", {**completion, "echo": True, "logprobs": 1, "stream": True}, 200),
        ("/v1/completions", {**completion, "prompt": [PROMPT, PROMPT + " x"], "prompt_logprobs": 1}, 200),
        ("/v1/completions", completion, 200),
        ("/v1/chat/completions", {**chat, "prompt_logprobs": 1}, 200),
        ("/v1/chat/completions", {**chat, "echo": True, "model": "shouter"}, 200),
        ("/v1/chat/completions", {**chat, "stream": True}, 200),
        # the newer doors call the engine through their own serving objects: they pass the gate too
        ("/v1/responses", {"model": "hello-printer", "input": PROMPT, "max_output_tokens": 8}, 200),
        ("/v1/responses", {"model": "shouter", "input": PROMPT, "max_output_tokens": 8, "stream": True}, 200),
        ("/v1/messages", {"model": "shouter", "max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}]}, 200),
        ("/v1/messages", {"model": "hello-printer", "max_tokens": 8, "stream": True,
                          "messages": [{"role": "user", "content": PROMPT}]}, 200),
        # one request's several sequences prefill in one step: refused, naming n and the option
        ("/v1/completions", {**completion, "prompt_logprobs": 1, "n": 2}, 400),
        ("/invocations", {"inputs": PROMPT, "parameters": {**DETAILS, "n": 2}}, 400),
    ]
    return once * rounds


def _send(server, path, body):
    if body.get("stream"):
        with httpx.stream("POST", server.base_url + path, json=body, timeout=180) as s:
            text = s.read().decode()
            return s.status_code, text
    r = post(server, path, body, timeout=180)
    return r.status_code, r.text


def carries_error(text: str) -> bool:
    """Whether a 200 answer (one JSON document, JSON lines or server-sent events) holds an error
    object: a top-level "error" key, not the word in generated text."""
    pieces = [text] + [line.removeprefix("data:").strip() for line in text.splitlines()]
    for piece in pieces:
        try:
            doc = json.loads(piece)
        except ValueError:
            continue
        if isinstance(doc, dict) and "error" in doc:
            return True
    return False


def test_carries_error_reads_error_objects_not_generated_words():
    assert carries_error('{"error": {"message": "boom"}}')
    assert carries_error('data: {"id": 1}\n\ndata: {"error": {"message": "boom"}}\n\n')
    assert carries_error('{"token": {"text": "a"}}\n{"error": "boom"}\n')
    assert not carries_error('{"generated_text": "\\nprint(\\"if error\\")", "details": {}}')
    assert not carries_error('data: {"choices": [{"text": "error"}]}\n\ndata: [DONE]\n\n')


def test_prompt_logprobs_beside_other_requests_keep_the_engine_alive(lora):
    """vLLM 0.32 on CPU kills its engine computing prompt log-probabilities for a step of more than
    one request with LoRA on: each such request now prefills alone; n > 1 is a 400."""
    requests = _prompt_logprob_requests()
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: _send(lora, r[0], r[1]), requests))
    for (path, body, expected), (status, text) in zip(requests, answers):
        assert status == expected, (path, body, status, text[:300])
        if expected == 400:
            assert "option.enable_lora" in text and "n=2" in text, text
        elif carries_error(text):
            raise AssertionError((path, body, text[:300]))
    prefilled = json.loads(answers[0][1])["details"]["prefill"]
    assert len(prefilled) > 3 and all(t["log_prob"] is not None for t in prefilled[1:])
    echo = json.loads(answers[9][1])["choices"][0]
    assert echo["text"].startswith(PROMPT) and echo["logprobs"]["token_logprobs"][1] is not None
    assert httpx.get(lora.base_url + "/ping").status_code == 200
    assert_healthy(lora)


def _sum(text: str, name: str, **labels) -> float:
    """Sum of a series' samples whose labels include `labels`, read from /metrics text."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def test_usage_series_by_tenant_and_adapter_move_with_requests(lora):
    """A JSON answer and a stream through an adapter move the per-tenant and per-adapter series (deltas:
    the server is shared); with no API keys, the tenant of an adapter's request is the adapter."""
    metrics = lambda: httpx.get(lora.base_url + "/metrics", timeout=30).text  # noqa: E731
    pair = {"tenant": "hello-printer", "adapter": "hello-printer"}
    before = metrics()
    comp = post(lora, "/v1/completions", {"model": "hello-printer", "prompt": "def f():", "max_tokens": 5, "temperature": 0})
    assert comp.status_code == 200, comp.text
    usage = comp.json()["usage"]
    body = {"model": "hello-printer", "prompt": "def g():", "max_tokens": 4, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", lora.base_url + "/v1/completions", json=body, timeout=120) as s:
        assert s.status_code == 200
        events = [line for line in s.iter_lines() if line.startswith("data: {")]
    after = metrics()

    def delta(name, **labels):
        return _sum(after, name, **labels) - _sum(before, name, **labels)

    assert delta("lmi_usage_prompt_tokens_total", **pair) == usage["prompt_tokens"]  # the stream sent no usage
    generated = delta("lmi_usage_generation_tokens_total", **pair)
    assert usage["completion_tokens"] + 1 <= generated <= usage["completion_tokens"] + len(events), (generated, usage)
    assert delta("lmi_usage_time_to_first_token_seconds_count", **pair) == 1  # streams only
    assert delta("lmi_adapter_requests_total", adapter="hello-printer", outcome="admitted") == 2
    assert delta("lmi_adapter_queue_wait_seconds_count", adapter="hello-printer") == 2
    assert delta("lmi_tenant_requests_total", tenant="hello-printer", outcome="admitted") == 2
    assert _sum(after, "lmi_adapter_resident", adapter="hello-printer") == 1


def test_more_busy_adapters_than_max_loras_keep_the_engine_alive(lora):
    """Three adapters busy at once on max_loras=2 (by SageMaker's adapter header, twelve at once):
    the tenant scheduler's step for a newcomer never lets a third adapter run beside two."""
    names = ["hello-printer", "shouter", "hello-copy"] * 4
    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda n: post(lora, "/invocations", {"inputs": "def main():", "parameters": {
            "max_new_tokens": 24, "do_sample": False}}, headers={HEADER: n}, timeout=300), names))
    for name, r in zip(names, answers):
        assert r.status_code == 200, (name, r.text[:300])
        assert r.json()["generated_text"].startswith(SHOUT if name == "shouter" else HELLO), (name, r.text)
    assert httpx.get(lora.base_url + "/ping").status_code == 200
    assert_healthy(lora)


def _responses_text(body: dict) -> str:
    return "".join(part["text"] for item in body["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def _sse_data(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_an_adapters_output_formatter_shapes_its_answer_on_every_front_door(lora):
    """shouter's formatter (written against the chat answer) upper-cases its text on /v1/responses
    and /v1/messages too, streamed or not: the same text as on /v1/chat/completions."""
    question = "Write a function that opens a file."
    chat = post(lora, "/v1/chat/completions", {"model": "shouter", "messages": [{"role": "user", "content": question}],
                                               "max_tokens": 12, "temperature": 0})
    assert chat.status_code == 200, chat.text
    expected = chat.json()["choices"][0]["message"]["content"]
    assert expected and expected == expected.upper() and any(c.isalpha() for c in expected)
    plain = post(lora, "/v1/chat/completions", {"model": "hello-printer", "messages": [{"role": "user", "content": question}],
                                                "max_tokens": 12, "temperature": 0}).json()["choices"][0]["message"]["content"]
    assert plain != plain.upper()  # other adapters untouched

    responses = {"model": "shouter", "input": question, "max_output_tokens": 12, "temperature": 0}
    r = post(lora, "/v1/responses", responses)
    assert r.status_code == 200, r.text
    assert _responses_text(r.json()) == expected
    with httpx.stream("POST", lora.base_url + "/v1/responses", json={**responses, "stream": True}, timeout=120) as s:
        events = _sse_data(s.read().decode())
        assert s.status_code == 200
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == expected
    done = [e for e in events if e["type"] == "response.output_text.done"]
    assert done and done[-1]["text"] == expected
    completed = next(e for e in events if e["type"] == "response.completed")
    assert _responses_text(completed["response"]) == expected

    messages = {"model": "shouter", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    r = post(lora, "/v1/messages", messages)
    assert r.status_code == 200, r.text
    assert "".join(b["text"] for b in r.json()["content"] if b["type"] == "text") == expected
    with httpx.stream("POST", lora.base_url + "/v1/messages", json={**messages, "stream": True}, timeout=120) as s:
        events = _sse_data(s.read().decode())
        assert s.status_code == 200
    streamed = "".join(e["delta"]["text"] for e in events if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta")
    assert streamed == expected
    # answers without generated text are not the formatter's: tokens and counts come back as they are
    r = post(lora, "/tokenize", {"model": "shouter", "prompt": question})
    assert r.status_code == 200 and r.json()["count"] > 3, r.text
    r = post(lora, "/v1/messages/count_tokens", {"model": "shouter", "messages": messages["messages"]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 3, r.text


def test_the_base_model_beside_adapter_requests_answers_as_alone(lora):
    """vLLM's CPU LoRA ops applied the adapter in the last slot to base-model tokens in an engine
    step beside adapter requests (index -1 read as the last slot): lmi_server/lora_cpu.py."""
    body = {"model": "lmi-demo", "prompt": "import os", "max_tokens": 24, "temperature": 0}
    alone = post(lora, "/v1/completions", body)
    assert alone.status_code == 200, alone.text
    busy_body = {**body, "max_tokens": 160, "ignore_eos": True}
    with ThreadPoolExecutor(4) as pool:
        busy = [pool.submit(post, lora, "/v1/completions", {**busy_body, "model": name})
                for name in ("hello-printer", "shouter", "hello-printer", "shouter")]
        time.sleep(1.0)  # the adapters' requests decode when the base model's arrives
        beside = post(lora, "/v1/completions", body)
        assert all(not f.done() for f in busy[:1]), "the adapter requests ended before the base model's request"
        assert all(f.result().status_code == 200 for f in busy)
    assert beside.status_code == 200, beside.text
    assert beside.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
