"""Suffix decoding on the embedded assistant: `option.speculative_method=suffix` and nothing else starts vLLM's
suffix proposer (Arctic Inference's extension, built by `make setup`), an agent's turn over a real file of
this repository comes back as it does without speculation, and repeating the turn is drafted from the
earlier response (vLLM's acceptance counters in /metrics grow).

One engine start of its own (the suffix server); the reference without speculation is the shared
`assistant_with_lora` server's base model (tests/e2e/conftest.py), asked without an adapter and with its
API key (the suffix server has none and ignores it)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ASSISTANT_KEY
from tests.e2e.test_api import metric_value
from tests.support.prestart import prestartable
from tests.support.server import running_server

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SOURCE = (REPO / "lmi_server" / "restart_budget.py").read_text()
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@pytest.fixture(scope="module")
@prestartable
def assistant_with_suffix(tmp_path_factory):
    props = {"option.speculative_method": "suffix", "option.cpu_kv_cache_space": "1"}
    with running_server(tmp_path_factory.mktemp("assistant-suffix"), props) as proc:
        yield proc


def agent_turn() -> list[dict]:
    """A coding agent's turn: it read a file (the tool result) and asks for the code back with a change."""
    return [
        {"role": "system", "content": "You are a coding agent. Return complete code."},
        {"role": "user", "content": "In lmi_server/restart_budget.py, add a docstring to the class."},
        {"role": "assistant", "content": '[read_file(path="lmi_server/restart_budget.py")]',
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "read_file", "arguments": '{"path": "lmi_server/restart_budget.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": SOURCE},
        {"role": "user", "content": "Return the whole file with the docstring added."},
    ]


def greedy(server, messages: list[dict], **extra) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", json={
        "model": "smollm2-135m-instruct", "messages": messages, "max_tokens": 96, "temperature": 0,
        "logprobs": True, "top_logprobs": 2, **extra},
        headers={"Authorization": f"Bearer {ASSISTANT_KEY}"}, timeout=600)  # the shared assistant has a key


def tokens(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["content"]


def accepted(server) -> float:
    return metric_value(httpx.get(server.base_url + "/metrics", timeout=30).text, ACCEPTED) or 0.0


def test_suffix_keeps_greedy_outputs_and_drafts_a_repeated_agent_turn(assistant_with_suffix, assistant_with_lora):
    log = assistant_with_suffix.log_path.read_text(errors="replace")
    assert "method='suffix'" in log or '"method": "suffix"' in log, "the engine did not start with suffix decoding"
    assert "Arctic Inference plugin is enabled" not in log
    plain = tokens(greedy(assistant_with_lora, agent_turn()))
    first = tokens(greedy(assistant_with_suffix, agent_turn()))
    before = accepted(assistant_with_suffix)
    again = tokens(greedy(assistant_with_suffix, agent_turn()))
    drafted = accepted(assistant_with_suffix) - before
    text = [t["token"] for t in plain]
    assert [t["token"] for t in again] == [t["token"] for t in first]
    if [t["token"] for t in first] != text:  # only a numerical near-tie of the plain run may flip a token
        at = next(i for i, (a, b) in enumerate(zip(text + [None], [t["token"] for t in first] + [None])) if a != b)
        assert at < len(plain), "the speculative run went on past the plain run's end"
        top = plain[at]["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] - top[1]["logprob"] < 1e-3, (at, top)
    # The repeated turn matches the first response cached in the global suffix tree: most of it is drafted.
    assert drafted >= len(again) // 2, (drafted, len(again))


def test_sampling_with_suffix_is_refused_on_cpu(assistant_with_suffix):
    """vLLM's CPU rejection sampler is shared by every speculative method: sampling stays a 400, not a crash."""
    r = greedy(assistant_with_suffix, agent_turn(), temperature=0.7)
    assert r.status_code == 400 and "temperature" in r.text, r.text
    assert tokens(greedy(assistant_with_suffix, agent_turn()))  # the engine still serves
