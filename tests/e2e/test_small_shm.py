"""The server on Docker's default /dev/shm (64 MiB), as SageMaker hosting and a plain `docker run`
give it: vLLM's message rings are shrunk to fit and every kind of request still comes back,
including the largest answer an engine step makes here (prompt log-probabilities of a long prompt).
That a message larger than a chunk still arrives (over vLLM's socket) is
tests/integration/test_vllm_message_rings.py.

The small /dev/shm is a tmpfs mounted in a mount namespace of the server's own (`unshare -m`, root),
so the host's /dev/shm is untouched.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import sys

import httpx
import openai
import pytest

from tests.support.server import ServerProcess, server_env, write_properties

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a private /dev/shm"
)


@pytest.fixture(scope="module")
def small_shm_server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("small-shm")
    write_properties(model_dir, {"option.max_model_len": "4096"})
    serve = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -m lmi_server.cli serve "
             f"--model-dir {model_dir} --host 127.0.0.1 --port {{port}}")
    server = ServerProcess(model_dir, model_dir / "server.log", env=server_env(),
                           argv=["unshare", "-m", "sh", "-c", serve]).start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_rings_are_shrunk_and_said_so(small_shm_server):
    log = small_shm_server.log_path.read_text()
    assert "/dev/shm has 64 MiB free" in log and "rings shrunk to broadcast 2 MiB" in log, small_shm_server.log_tail()


def test_chat_answers_with_the_openai_client(small_shm_server):
    client = openai.OpenAI(base_url=f"{small_shm_server.base_url}/v1", api_key="none")
    answer = client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in answer.choices[0].message.content
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=16, stream=True,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_long_prompt_logprobs_come_back(small_shm_server):
    """Prompt log-probabilities (20 per token) of a ~1,500-token prompt: the largest answer one engine
    step of this model makes (hundreds of KiB through the worker's response ring)."""
    prompt = " ".join(f"word{i % 97}" for i in range(700))  # ~1,500 tokens
    r = httpx.post(f"{small_shm_server.base_url}/v1/completions", timeout=600, json={
        "prompt": prompt, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 20,
    })
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert len(body["choices"][0]["prompt_logprobs"]) > 1000


def test_concurrent_requests_and_the_lmi_schema(small_shm_server):
    def one(i: int) -> int:
        r = httpx.post(f"{small_shm_server.base_url}/invocations", timeout=600, json={
            "inputs": f"Count to {i}:", "parameters": {"max_new_tokens": 8, "do_sample": False}})
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(8)))
    assert codes == [200] * 8
    assert httpx.get(f"{small_shm_server.base_url}/ping", timeout=10).status_code == 200
