"""The README's first command, exactly as a newcomer runs it: `make serve` with no option at all.

No serving.properties, no OPTION_* variable, no model directory: the server must choose the
engine's memory itself (vLLM's own CPU default refuses to start on hosts whose NUMA node is
smaller or busier than it expects) and serve the embedded assistant, which must say real things.
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests.support.prestart import prestartable
from tests.support.server import REPO, ServerProcess

pytestmark = pytest.mark.e2e

# Anything that would configure the server from the environment is removed.
CONFIG_ENV_PREFIXES = ("OPTION_", "SM_", "VLLM_")
CONFIG_ENV_NAMES = {"HF_MODEL_ID", "LMI_MODEL_DIR", "MAKEFLAGS", "MFLAGS"}


def newcomer_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items()
        if not k.startswith(CONFIG_ENV_PREFIXES) and k not in CONFIG_ENV_NAMES
    }


@pytest.fixture(scope="module")
@prestartable
def make_serve(tmp_path_factory):
    log = tmp_path_factory.mktemp("make-serve") / "server.log"
    proc = ServerProcess(None, log, argv=["make", "-C", str(REPO), "serve", "PORT={port}"])
    proc.env = newcomer_env()
    proc.start()
    try:
        proc.wait_ready(timeout=900)
        yield proc
    finally:
        proc.stop()


def test_make_serve_answers_with_no_option(make_serve):
    from openai import OpenAI

    client = OpenAI(base_url=make_serve.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    (model,) = [m.id for m in client.models.list().data]
    assert model == "smollm2-135m-instruct"
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
    )
    assert "Paris" in answer.choices[0].message.content


def test_make_serve_tools_work_with_no_option(make_serve):
    from openai import OpenAI

    from tests.e2e.test_tools import assert_named_call_is_parsed

    client = OpenAI(base_url=make_serve.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert_named_call_is_parsed(client, "smollm2-135m-instruct")


def test_make_serve_runs_the_assistant_in_float32_whatever_the_cpu(make_serve):
    # bf16 kernels on AVX-512 BF16 / AMX hosts flip the near-tie first token of the answer above.
    log = make_serve.log_path.read_text(errors="replace")
    assert "dtype=float32" in log  # the server's start-up note
    assert "dtype=torch.float32" in log and "dtype=torch.bfloat16" not in log  # what vLLM built


def test_make_serve_chose_the_engine_memory_itself(make_serve):
    log = make_serve.log_path.read_text(errors="replace")
    # The server passed an explicit KV size, so vLLM did not apply its node-utilization rule.
    assert "Explicitly set" in log and "for KV cache" in log
    assert "less than desired CPU memory utilization" not in log


def test_make_serve_sagemaker_route(make_serve):
    r = httpx.post(
        make_serve.base_url + "/invocations",
        json={"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8, "temperature": 0}},
        timeout=120,
    )
    assert r.status_code == 200 and "Paris" in r.json()["generated_text"]
