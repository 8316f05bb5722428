"""The OpenAI Responses API and the Anthropic Messages API, spoken by their official clients, the
OpenAI Agents SDK and the coding-agent CLIs (Codex, Claude Code), against ONE real server of the
embedded assistant (SmolLM2-135M-Instruct) with an API key and LoRA on (its example adapters):
the session's `assistant` (tests/e2e/conftest.py), shared with test_assistant_kit.py and
test_assistant_eagle.py.

The model is tiny: the checks are about the protocol (shapes, ids, forced tool calls, round trips,
stored responses) and take answers from what the server itself logged. The model directory's
model.py pins greedy decoding (an LMI input formatter, which also shows formatters run on these
routes): Claude Code samples at temperature 1, and a 135M model then rambles to the context's end.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from tests.e2e.conftest import ASSISTANT_KEY
from tests.e2e.test_tools import WEATHER_TOOL, check_against_schema
from tests.support import agent_clis

KEY = ASSISTANT_KEY
MODEL = "smollm2-135m-instruct"
ADAPTER = "pirate"
QUESTION = "What is the capital of France?"
FUNCTION_TOOL = {"type": "function", "name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
                 "parameters": WEATHER_TOOL["function"]["parameters"]}
ANTHROPIC_TOOL = {"name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
                  "input_schema": WEATHER_TOOL["function"]["parameters"]}


@pytest.fixture(scope="session")
def openai_client(assistant):
    from openai import OpenAI

    return OpenAI(base_url=assistant.base_url + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def anthropic_client(assistant):
    from anthropic import Anthropic

    return Anthropic(base_url=assistant.base_url, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def context_length(assistant):
    answer = httpx.post(assistant.base_url + "/tokenize", json={"model": MODEL, "prompt": "x"},
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    return answer.json()["max_model_len"]


# --- OpenAI Responses API ------------------------------------------------------------------------

@pytest.mark.parametrize("model", [MODEL, ADAPTER])
def test_responses_answer(openai_client, model):
    answer = openai_client.responses.create(model=model, input=QUESTION, max_output_tokens=30)
    assert answer.status == "completed" and answer.id.startswith("resp_") and answer.model == model
    assert answer.output_text.strip() and answer.usage.output_tokens > 0
    if model == MODEL:
        assert "Paris" in answer.output_text


def test_responses_stream(openai_client):
    events = list(openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=30, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text


def _forced_call(client, model=MODEL):
    answer = client.responses.create(
        model=model, input="What is the weather in Paris for the next 3 days?", tools=[FUNCTION_TOOL],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120,
    )
    calls = [item for item in answer.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    check_against_schema(json.loads(calls[0].arguments))
    return answer, calls[0]


def test_responses_forced_function_call(openai_client):
    _forced_call(openai_client)


def test_responses_tool_result_round_trip(openai_client):
    first, call = _forced_call(openai_client)
    follow = openai_client.responses.create(
        model=MODEL, tools=[FUNCTION_TOOL], tool_choice="none", max_output_tokens=40,
        input=[
            {"role": "user", "content": "What is the weather in Paris for the next 3 days?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees, all 3 days."},
        ],
    )
    assert follow.status == "completed" and follow.output_text.strip()
    assert follow.usage.input_tokens > first.usage.input_tokens  # the call and its result were in the prompt


def test_responses_store_and_previous_response_id(openai_client):
    import openai

    first = openai_client.responses.create(model=MODEL, input="My name is Ada. Say hello to me.", max_output_tokens=20, store=True)
    stored = openai_client.responses.retrieve(first.id)
    assert stored.id == first.id and stored.output_text == first.output_text
    follow = openai_client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                            max_output_tokens=20)
    alone = openai_client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=20)
    assert follow.previous_response_id == first.id and follow.status in ("completed", "incomplete")
    # the first turn (question and answer) was rendered before the new question
    assert follow.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_doesnotexist0000")
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve("resp_doesnotexist0000")


def test_responses_output_budget_beyond_the_context_is_clamped(openai_client, context_length):
    raw = openai_client.responses.with_raw_response.create(model=MODEL, input=QUESTION, max_output_tokens=32000)
    answer = raw.parse()
    fitted = context_length - answer.usage.input_tokens
    assert raw.headers["x-lmi-max-tokens-clamped"] == f"32000->{fitted}"
    assert answer.status == "completed" and answer.max_output_tokens == fitted
    small = openai_client.responses.with_raw_response.create(model=MODEL, input=QUESTION, max_output_tokens=30)
    assert "x-lmi-max-tokens-clamped" not in small.headers


def test_responses_refusals_are_openai_shaped(assistant, openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as unknown:
        openai_client.responses.create(model="no-such-model", input=QUESTION, max_output_tokens=5)
    assert ADAPTER in str(unknown.value)  # the 404 names what is served
    bad = httpx.post(assistant.base_url + "/v1/responses", json={"model": MODEL, "input": 5},
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert bad.status_code in (400, 422) and bad.json()["error"]["message"]
    assert httpx.post(assistant.base_url + "/v1/responses", json={"model": MODEL, "input": "x"}, timeout=60).status_code == 401
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    with pytest.raises(openai.BadRequestError) as text_only:  # the assistant reads text: a 400, not vLLM's 500
        openai_client.responses.create(model=MODEL, max_output_tokens=5,
                                       input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}, image]}])
    assert "input_image" in str(text_only.value)


# --- Anthropic Messages API ----------------------------------------------------------------------

@pytest.mark.parametrize("model", [MODEL, ADAPTER])
def test_messages_answer_with_a_system_prompt(anthropic_client, model):
    answer = anthropic_client.messages.create(
        model=model, system="You are a helpful assistant.", max_tokens=30, messages=[{"role": "user", "content": QUESTION}],
    )
    assert answer.type == "message" and answer.role == "assistant" and answer.model == model
    assert answer.content[0].type == "text" and answer.content[0].text.strip()
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.usage.input_tokens > 0
    if model == MODEL:
        assert "Paris" in answer.content[0].text


def test_messages_stream(anthropic_client):
    with anthropic_client.messages.stream(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": QUESTION}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and text == final.content[0].text and final.stop_reason in ("end_turn", "max_tokens")


def test_messages_forced_tool_use(anthropic_client):
    answer = anthropic_client.messages.create(
        model=MODEL, max_tokens=120, tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
    )
    uses = [block for block in answer.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    check_against_schema(uses[0].input)
    assert answer.stop_reason == "tool_use"


def test_count_tokens_is_what_the_message_uses(anthropic_client):
    asked = {"model": MODEL, "system": "Be brief.", "messages": [{"role": "user", "content": QUESTION}]}
    counted = anthropic_client.messages.count_tokens(**asked)
    used = anthropic_client.messages.create(max_tokens=5, **asked)
    assert counted.input_tokens == used.usage.input_tokens > 0


def test_messages_output_budget_beyond_the_context_is_clamped(anthropic_client, context_length):
    raw = anthropic_client.messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": QUESTION}]
    )
    answer = raw.parse()
    assert raw.headers["x-lmi-max-tokens-clamped"] == f"32000->{context_length - answer.usage.input_tokens}"
    assert "Paris" in answer.content[0].text


def test_messages_refusals_are_anthropic_shaped(assistant, anthropic_client):
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as unknown:
        anthropic_client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.body["type"] == "error" and unknown.value.body["error"]["type"] == "not_found_error"
    assert ADAPTER in unknown.value.body["error"]["message"]
    url, headers = assistant.base_url + "/v1/messages", {"x-api-key": KEY}
    hi = [{"role": "user", "content": "hi"}]
    for body in ({"model": MODEL, "messages": hi}, {"model": MODEL, "messages": hi, "max_tokens": "lots"}):
        bad = httpx.post(url, json=body, headers=headers, timeout=60)
        assert bad.status_code in (400, 422)
        assert bad.json()["type"] == "error" and bad.json()["error"]["type"] == "invalid_request_error"
    broken = httpx.post(url, content=b"{not json", headers={**headers, "content-type": "application/json"}, timeout=60)
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as text_only:
        anthropic_client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [image]}])
    assert text_only.value.body["error"]["type"] == "invalid_request_error" and "image" in text_only.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=assistant.base_url, api_key="wrong-key-0123456", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"


# --- /tokenize and /detokenize -------------------------------------------------------------------

def test_tokenize_detokenize_round_trip(assistant, context_length):
    headers = {"Authorization": f"Bearer {KEY}"}
    tokens = httpx.post(assistant.base_url + "/tokenize", json={"model": MODEL, "prompt": "Hello, front doors!"},
                        headers=headers, timeout=60).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == context_length
    text = httpx.post(assistant.base_url + "/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]},
                      headers=headers, timeout=60).json()
    assert text["prompt"] == "Hello, front doors!"
    unknown = httpx.post(assistant.base_url + "/tokenize", json={"model": "no-such-model", "prompt": "x"}, headers=headers, timeout=60)
    assert unknown.status_code == 404
    outside = httpx.post(assistant.base_url + "/detokenize", json={"model": MODEL, "tokens": [2**62]}, headers=headers, timeout=60)
    assert outside.status_code == 400 and "tokens" in outside.json()["error"]["message"]


# --- OpenAI Agents SDK ---------------------------------------------------------------------------

@pytest.mark.parametrize("model", [MODEL, ADAPTER])
def test_agents_sdk_run(assistant, model):
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    client = AsyncOpenAI(base_url=assistant.base_url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    agent = Agent(name="assistant", instructions="Answer in one short sentence.",
                  model=OpenAIResponsesModel(model=model, openai_client=client))
    result = Runner.run_sync(agent, QUESTION, max_turns=1)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    if model == MODEL:
        assert "Paris" in result.final_output


# --- the coding-agent CLIs -----------------------------------------------------------------------

@pytest.fixture(scope="session")
def cli_bins():
    return agent_clis.install()


def _log(assistant) -> str:
    return assistant.log_path.read_text(errors="replace")


def _sent(log: str) -> list[str]:
    return [s.strip() for s in agent_clis.logged_outputs(log)]


def _logged_after(assistant, start: int, printed: str) -> tuple[str, list[str]]:
    """The log since `start` and the answers it holds, once `printed` is among them (a stream's
    answer is logged when vLLM's generator ends, which may be just after the client has it all)."""
    deadline = time.monotonic() + 30
    while True:
        log = _log(assistant)[start:]
        if printed in _sent(log) or time.monotonic() > deadline:
            return log, _sent(log)
        time.sleep(0.5)


def test_codex_exec_through_the_responses_api(assistant, cli_bins, context_length, tmp_path):
    start = len(_log(assistant))
    done = agent_clis.run_codex(cli_bins, tmp_path / "codex", assistant.base_url, KEY, MODEL, QUESTION, context_length)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.strip()
    _, sent = _logged_after(assistant, start, printed)
    assert printed and printed in sent, (printed, sent[-3:])


def test_claude_code_through_the_messages_api(assistant, cli_bins, context_length, tmp_path):
    start = len(_log(assistant))
    done = agent_clis.run_claude(cli_bins, tmp_path / "claude", assistant.base_url, KEY, MODEL, QUESTION)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    printed = done.stdout.strip()
    log, sent = _logged_after(assistant, start, printed)
    assert printed and printed in sent, (printed, sent[-3:])
    # Claude Code asks max_tokens 32000, more than the context: it was served with the budget that fits
    budgets = [int(n) for n in re.findall(r"Received request \S+: params: SamplingParams\(.*?max_tokens=(\d+)", log)]
    assert budgets and context_length // 2 < max(budgets) < context_length, budgets
