"""EAGLE speculative decoding through the HTTP API.

vLLM's EAGLE path is configured from the demo kit's head (the configuration alone: no engine). The
engine checks run on the session's EAGLE assistant (tests/e2e/conftest.py: `assistant_eagle`, the
embedded assistant with its shipped EAGLE-1 head, which tests/e2e/test_assistant_eagle.py uses
first). Losslessness is checked against the shared `assistant` (same model, same float32 settings,
no speculation, asked without an adapter): greedy outputs must be identical token for token.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.e2e.conftest import ASSISTANT_KEY, BASE_PROPS
from tests.e2e.test_api import metric_value
from tests.support.server import write_properties

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "def read_lines(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "    for i, item in enumerate(items):\n        ",
    "try:\n    import json\nexcept ImportError:\n    ",
]


def greedy(server, prompt: str, n: int = 48) -> dict:
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0},
        headers={"Authorization": f"Bearer {ASSISTANT_KEY}"},  # the shared assistant has a key; the EAGLE one ignores it
        timeout=180,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def speculative_config(model_dir) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(model_dir)],
        capture_output=True, text=True, timeout=120,
    )
    return json.loads(out.stdout)["vllm_engine_args"]["speculative_config"]


def test_eagle_is_configured_from_the_demo_kit(tmp_path, assistant_eagle):
    from lmi_server.demo.builder import KIT_DIR

    model_dir = tmp_path / "eagle-model"
    write_properties(model_dir, {**BASE_PROPS, "option.speculative_method": "eagle", "option.num_speculative_tokens": "3"})
    spec = speculative_config(model_dir)
    assert spec["method"] == "eagle" and spec["num_speculative_tokens"] == 3
    assert spec["model"] == str(KIT_DIR / "eagle")
    # the engine the checks below run on: the assistant's own head, the default draft length
    spec = speculative_config(assistant_eagle.model_dir)
    assert spec["method"] == "eagle" and spec["num_speculative_tokens"] == 3 and spec["model"].endswith("assistant/eagle")


def test_greedy_output_is_identical_with_and_without_eagle(assistant, assistant_eagle):
    for prompt in PROMPTS:
        assert greedy(assistant_eagle, prompt)["text"] == greedy(assistant, prompt)["text"], prompt


def test_sampling_with_eagle_on_a_cpu_engine_is_refused_naming_the_option(assistant_eagle):
    """vLLM 0.32's CPU rejection sampler never fills the per-token temperature, top_p and top_k it
    samples drafts with (uninitialized memory; a top_k read from it kills the engine): sampling is
    a 400 there, greedy is served."""
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0.8, "seed": 7, "top_k": 5,
            "ignore_eos": True, "logprobs": 1}
    r = httpx.post(assistant_eagle.base_url + "/v1/completions", json=body, timeout=180)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "temperature" and "option.speculative_method" in r.json()["error"]["message"]
    r = httpx.post(assistant_eagle.base_url + "/v1/completions", json={**body, "temperature": 0}, timeout=180)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 32, r.text
    assert httpx.get(assistant_eagle.base_url + "/ping").status_code == 200


def test_speculation_metrics_move(assistant_eagle):
    before = metric_value(httpx.get(assistant_eagle.base_url + "/metrics").text, "vllm:spec_decode_num_draft_tokens_total") or 0
    greedy(assistant_eagle, PROMPTS[1], 32)
    text = httpx.get(assistant_eagle.base_url + "/metrics").text
    assert metric_value(text, "vllm:spec_decode_num_draft_tokens_total") > before
    assert metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") > 0
    rate = metric_value(text, "lmi_spec_decode_acceptance_rate")
    assert 0 < rate <= 1
    assert metric_value(text, "lmi_spec_decode_mean_acceptance_length") > 1
