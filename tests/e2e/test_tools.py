"""Tool calling and structured output through vLLM's front-end options, with the official client.

The shared server sets `option.enable_auto_tool_choice=true` and `option.tool_call_parser=hermes`
(tests/e2e/conftest.py). A named `tool_choice` makes vLLM force the call's arguments with
structured output, so even the tiny demo model must return arguments valid for the schema.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}


def check_against_schema(args: dict) -> None:
    props = WEATHER_TOOL["function"]["parameters"]["properties"]
    assert set(args) == {"city", "unit", "days"}
    assert args["city"] in props["city"]["enum"] and args["unit"] in props["unit"]["enum"]
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7


def assert_named_call_is_parsed(client, model: str) -> None:
    """A named tool_choice through the official client: one call, arguments valid for the schema."""
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0,
    )
    (call,) = answer.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    check_against_schema(json.loads(call.function.arguments))


def test_named_tool_choice_returns_a_parsed_call(openai_client):
    assert_named_call_is_parsed(openai_client, "lmi-demo")


def test_named_tool_choice_streams(openai_client):
    stream = openai_client.chat.completions.create(
        model="lmi-demo",
        messages=[{"role": "user", "content": "Weather in Tokyo?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0,
        stream=True,
    )
    names, arguments = set(), ""
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if call.function.name:
                names.add(call.function.name)
            arguments += call.function.arguments or ""
    assert names == {"get_weather"}
    check_against_schema(json.loads(arguments))


def test_response_format_json_schema(openai_client):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    }
    answer = openai_client.chat.completions.create(
        model="lmi-demo",
        messages=[{"role": "user", "content": "Is Python a programming language?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
        max_tokens=60,
        temperature=0,
    )
    data = json.loads(answer.choices[0].message.content)
    assert set(data) == {"answer", "confidence"} and data["answer"] in ("yes", "no")
    assert 0 <= data["confidence"] <= 100


def test_unknown_tool_parser_is_a_startup_error(tmp_path):
    import subprocess
    import sys

    (tmp_path / "serving.properties").write_text("option.model_id=lmi-demo\noption.tool_call_parser=hermez\n")
    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2 and "option.tool_call_parser='hermez'" in out.stderr and "hermes" in out.stderr
