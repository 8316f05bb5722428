"""The speculative-decoding example (docs/speculative.md) on the embedded assistant: `option.speculative_method=eagle`
and nothing else uses the EAGLE head shipped for SmolLM2-135M-Instruct, drafts are accepted, and
the greedy answer stays a real one. That server is the session's `assistant_eagle`
(tests/e2e/conftest.py), which tests/e2e/test_speculative.py takes over next; the EAGLE-3 server is
this module's own (one speculative method per engine)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import ASSISTANT_KEY
from tests.e2e.test_api import metric_value
from tests.support.prestart import prestartable
from tests.support.server import running_server

pytestmark = pytest.mark.e2e


def test_the_shipped_head_drafts_and_the_answer_stays_right(assistant_eagle):
    from openai import OpenAI

    log = assistant_eagle.log_path.read_text(errors="replace")
    assert "demo/assistant/eagle" in log  # the built-in head, found without a path
    client = OpenAI(base_url=assistant_eagle.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    answer = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30, temperature=0,
    )
    assert "Paris" in answer.choices[0].message.content
    text = httpx.get(assistant_eagle.base_url + "/metrics", timeout=30).text
    assert metric_value(text, "vllm:spec_decode_num_draft_tokens_total") > 0
    assert metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") > 0


PROMPTS = [  # none of them in the corpus the EAGLE-3 head learned from
    "What causes rain?", "How do vaccines work?", "Write a short poem about the sea.",
    "How do I count words in a string in Python?", "List three uses of copper.",
    "Explain what an API is in two sentences.",
]


@pytest.fixture(scope="module")
@prestartable
def assistant_with_eagle3(tmp_path_factory):
    props = {"option.speculative_method": "eagle3", "option.cpu_kv_cache_space": "1"}
    with running_server(tmp_path_factory.mktemp("assistant-eagle3"), props) as proc:
        yield proc


def greedy(server, prompt: str) -> list[dict]:
    # the shared assistant wants its API key; the EAGLE-3 server, which has none, ignores it
    headers = {"Authorization": f"Bearer {ASSISTANT_KEY}"}
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=headers, json={
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 48, "temperature": 0, "logprobs": True, "top_logprobs": 2}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["content"]


def test_eagle3_alone_uses_the_shipped_head_and_keeps_greedy_outputs(assistant_with_eagle3, assistant_with_lora):
    """`option.speculative_method=eagle3` and nothing else: the EAGLE-3 head shipped for the assistant
    drafts, and greedy outputs are those without speculation (the shared assistant's base model,
    asked without an adapter, in the same float32). Where one differs, the first divergence
    must be a numerical near-tie of the plain run (top-2 logprob gap < 1e-3), not a wrong acceptance."""
    log = assistant_with_eagle3.log_path.read_text(errors="replace")
    assert "demo/assistant/eagle3" in log
    identical = 0
    for prompt in PROMPTS:
        plain, spec = greedy(assistant_with_lora, prompt), greedy(assistant_with_eagle3, prompt)
        tokens_plain, tokens_spec = [t["token"] for t in plain], [t["token"] for t in spec]
        if tokens_plain == tokens_spec:
            identical += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(tokens_plain + [None], tokens_spec + [None])) if a != b)
        assert at < len(plain), (prompt, "the speculative run went on past the plain run's end")
        top = plain[at]["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] - top[1]["logprob"] < 1e-3, (prompt, at, top)
    assert identical >= len(PROMPTS) - 1
    text = httpx.get(assistant_with_eagle3.base_url + "/metrics", timeout=30).text
    drafted = metric_value(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric_value(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafted > 0 and accepted / drafted > 0.2  # a real acceptance rate, not an occasional hit
