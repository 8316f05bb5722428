"""One shared server on the demo model for the whole session (engine start-up is the cost)."""

from __future__ import annotations

import pytest

from tests.support.server import DEMO_PROPS, running_server

BASE_PROPS = {
    **DEMO_PROPS,  # the tiny trained demo model: fast starts for tests
    # vLLM's tool-calling front-end options as option.* keys (tests/e2e/test_tools.py). The pythonic
    # parser lets vLLM force a named/required call's JSON with structured output (vLLM 0.32's hermes
    # parser leaves that to the model); compact JSON keeps a tiny model from looping on whitespace.
    "option.enable_auto_tool_choice": "true",
    "option.tool_call_parser": "pythonic",
    "option.structured_outputs_config": '{"backend": "xgrammar", "disable_any_whitespace": true}',
}


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("model-dir"), BASE_PROPS) as proc:
        yield proc


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
