"""The README's speculative-decoding example on the embedded assistant: `option.speculative_method=eagle`
and nothing else uses the EAGLE head shipped for SmolLM2-135M-Instruct, drafts are accepted, and
the greedy answer stays a real one."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_api import metric_value
from tests.support.server import running_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def assistant_with_eagle(tmp_path_factory):
    props = {"option.speculative_method": "eagle", "option.cpu_kv_cache_space": "1"}
    with running_server(tmp_path_factory.mktemp("assistant-eagle"), props) as proc:
        yield proc


def test_the_shipped_head_drafts_and_the_answer_stays_right(assistant_with_eagle):
    from openai import OpenAI

    log = assistant_with_eagle.log_path.read_text(errors="replace")
    assert "demo/assistant/eagle" in log  # the built-in head, found without a path
    client = OpenAI(base_url=assistant_with_eagle.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    answer = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30, temperature=0,
    )
    assert "Paris" in answer.choices[0].message.content
    text = httpx.get(assistant_with_eagle.base_url + "/metrics", timeout=30).text
    assert metric_value(text, "vllm:spec_decode_num_draft_tokens_total") > 0
    assert metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") > 0
