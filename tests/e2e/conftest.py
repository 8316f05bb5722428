"""One shared server on the demo model for the whole session (engine start-up is the cost)."""

from __future__ import annotations

import pytest

from tests.support.server import ServerProcess, server_env, write_properties

BASE_PROPS = {
    "option.model_id": "lmi-demo",  # the tiny trained demo model: fast starts for tests
    "engine": "Python",
    "option.cpu_kv_cache_space": "1",
    "option.enforce_eager": "true",
    "option.dtype": "fp32",
    "option.max_model_len": "4096",
    "option.max_request_bytes": "200000",
    # vLLM's tool-calling front-end options as option.* keys (tests/e2e/test_tools.py). The pythonic
    # parser lets vLLM force a named/required call's JSON with structured output (vLLM 0.32's hermes
    # parser leaves that to the model); compact JSON keeps a tiny model from looping on whitespace.
    "option.enable_auto_tool_choice": "true",
    "option.tool_call_parser": "pythonic",
    "option.structured_outputs_config": '{"backend": "xgrammar", "disable_any_whitespace": true}',
}


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("model-dir")
    write_properties(model_dir, BASE_PROPS)
    proc = ServerProcess(model_dir, model_dir / "server.log", env=server_env()).start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
