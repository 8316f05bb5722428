"""EAGLE speculative decoding through the HTTP API on the trained demo kit.

Losslessness is checked against the shared server (same model, same float32 settings, no
speculation): greedy outputs must be identical token for token.
"""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import BASE_PROPS
from tests.e2e.test_api import metric_value
from tests.support.server import running_server

PROMPTS = [
    "def read_lines(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "    for i, item in enumerate(items):\n        ",
    "try:\n    import json\nexcept ImportError:\n    ",
]


@pytest.fixture(scope="module")
def eagle_server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("eagle-model")
    props = {**BASE_PROPS, "option.speculative_method": "eagle", "option.num_speculative_tokens": "3"}
    with running_server(model_dir, props) as proc:
        yield proc


def greedy(server, prompt: str, n: int = 48) -> dict:
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": "lmi-demo", "prompt": prompt, "max_tokens": n, "temperature": 0},
        timeout=180,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_eagle_is_configured_from_the_demo_kit(eagle_server):
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(eagle_server.model_dir)],
        capture_output=True, text=True, timeout=120,
    )
    spec = json.loads(out.stdout)["vllm_engine_args"]["speculative_config"]
    assert spec["method"] == "eagle" and spec["num_speculative_tokens"] == 3


def test_greedy_output_is_identical_with_and_without_eagle(server, eagle_server):
    for prompt in PROMPTS:
        assert greedy(eagle_server, prompt)["text"] == greedy(server, prompt)["text"], prompt


def test_sampling_with_eagle_on_a_cpu_engine_is_refused_naming_the_option(eagle_server):
    """vLLM 0.32's CPU rejection sampler never fills the per-token temperature, top_p and top_k it
    samples drafts with (uninitialized memory; a top_k read from it kills the engine): sampling is
    a 400 there, greedy is served."""
    body = {"model": "lmi-demo", "prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0.8, "seed": 7, "top_k": 5,
            "ignore_eos": True, "logprobs": 1}
    r = httpx.post(eagle_server.base_url + "/v1/completions", json=body, timeout=180)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "temperature" and "option.speculative_method" in r.json()["error"]["message"]
    r = httpx.post(eagle_server.base_url + "/v1/completions", json={**body, "temperature": 0}, timeout=180)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 32, r.text
    assert httpx.get(eagle_server.base_url + "/ping").status_code == 200


def test_speculation_metrics_move(eagle_server):
    before = metric_value(httpx.get(eagle_server.base_url + "/metrics").text, "vllm:spec_decode_num_draft_tokens_total") or 0
    greedy(eagle_server, PROMPTS[1], 32)
    text = httpx.get(eagle_server.base_url + "/metrics").text
    assert metric_value(text, "vllm:spec_decode_num_draft_tokens_total") > before
    assert metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") > 0
    rate = metric_value(text, "lmi_spec_decode_acceptance_rate")
    assert 0 < rate <= 1
    assert metric_value(text, "lmi_spec_decode_mean_acceptance_length") > 1
