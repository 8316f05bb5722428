"""One shared server on the demo model for the whole session (engine start-up is the cost)."""

from __future__ import annotations

import pytest

from tests.support.server import ServerProcess, server_env, write_properties

BASE_PROPS = {
    "engine": "Python",
    "option.cpu_kv_cache_space": "1",
    "option.enforce_eager": "true",
    "option.dtype": "fp32",
    "option.max_model_len": "4096",
    "option.max_request_bytes": "200000",
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
