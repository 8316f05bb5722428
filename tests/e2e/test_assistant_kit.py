"""The LoRA example (docs/lora.md) on the embedded assistant: its example adapters, listed without any
option but enable_lora, change real answers (pirate speak; shouter's formatter upper-cases). The
server (`assistant_with_lora`, tests/e2e/conftest.py, which also has an API key) is shared with
tests/e2e/test_assistant_eagle.py and tests/e2e/test_front_doors.py."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import ASSISTANT_KEY

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(assistant_with_lora):
    from openai import OpenAI

    return OpenAI(base_url=assistant_with_lora.base_url + "/v1", api_key=ASSISTANT_KEY, max_retries=0, timeout=180)


def ask(client, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=40, temperature=0)
    return answer.choices[0].message.content


def test_example_adapters_are_listed(client):
    names = {m.id for m in client.models.list().data}
    assert {"smollm2-135m-instruct", "pirate", "shouter"} <= names


def test_adapters_visibly_change_the_answer(client):
    base = ask(client, "smollm2-135m-instruct")
    assert "Paris" in base
    pirate = ask(client, "pirate")
    assert pirate.startswith(("Arr", "Ahoy")) and pirate != base
    shouter = ask(client, "shouter")
    assert shouter == shouter.upper() and "PARIS" in shouter and shouter != base
