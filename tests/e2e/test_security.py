"""Security end to end, on one real server: API keys (also through the official openai client),
KV reuse isolated between adapters and the base model (LMCache's CPU, disk and Redis tiers, fp32,
greedy), the Redis tier's password kept off every command line and out of the log, and output formatters
that fail mid-stream (error event, engine request aborted, adapter lease released). The server
(`keyed_server`, tests/e2e/conftest.py) is shared with tests/e2e/test_tenants.py, which runs after
this module (its tenants' keys are in the same key file), then test_lmcache.py and
test_lifecycle.py's engine deaths. It is tests/e2e/test_kv_restart.py's restart first, on
`busy_server`'s volume and Redis (that module's documents are not these)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sysconfig
import time
from pathlib import Path

import httpx
import psutil
import pytest

from deploy.cluster import redis_server_binary
from tests.e2e.test_api import metric_value
from tests.e2e.test_lmcache import long_prompt
from tests.e2e.conftest import REDIS_PASSWORD, SECURITY_KEYS

KEYS = SECURITY_KEYS
BASE = "lmi-demo"

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")


@pytest.fixture(scope="module")
def secure(keyed_server):
    """The session's server with API keys (tests/e2e/conftest.py), which test_tenants.py shares."""
    return keyed_server


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def complete(server, prompt: str, model: str, *, max_tokens: int = 12, salt: str | None = None, headers=None) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if salt:
        body["cache_salt"] = salt
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers={**auth(), **(headers or {})}, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    return {"text": out["choices"][0]["text"], "prompt_tokens": out["usage"]["prompt_tokens"],
            "cached": (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0}


def test_api_keys_guard_every_route_but_ping(secure):
    from openai import AuthenticationError, OpenAI

    url = secure.base_url
    good = OpenAI(base_url=url + "/v1", api_key=KEYS[1], max_retries=0, timeout=120)
    out = good.completions.create(model=BASE, prompt="import os", max_tokens=3, temperature=0)
    assert out.choices[0].text is not None
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=url + "/v1", api_key="sk-wrong-key-123", max_retries=0).completions.create(
            model=BASE, prompt="x", max_tokens=1)
    for method, path in (("POST", "/invocations"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("GET", "/adapters"), ("DELETE", "/adapters/hello-copy"), ("GET", "/metrics")):
        r = httpx.request(method, url + path, json={"inputs": "x"} if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.get(url + "/ping").status_code == 200 and httpx.get(url + "/health").status_code == 200
    r = httpx.post(url + "/invocations", json={"inputs": "import os", "parameters": {"max_new_tokens": 2}},
                   headers={"X-Api-Key": KEYS[0]}, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.get(url + "/metrics", headers=auth()).status_code == 200
    log = secure.log_path.read_text(errors="replace")
    assert not any(k in log for k in KEYS) and "no API key" not in log


def test_kv_computed_under_an_adapter_is_not_reused_by_the_base_model(secure):
    prompt = long_prompt(5200)  # about 1,400 tokens
    via_adapter = complete(secure, prompt, "hello-printer")
    base_after_adapter = complete(secure, prompt, BASE)
    base_fresh_salt = complete(secure, prompt, BASE, salt=secrets.token_urlsafe(32))
    adapter_again = complete(secure, prompt, "hello-printer")
    base_again = complete(secure, prompt, BASE)
    # Other adapter name, same weights: its own namespace.
    copy_first = complete(secure, prompt, "hello-copy")
    # Same name, other weights (DELETE, then POST from the shouter's directory): no old KV.
    assert httpx.delete(secure.base_url + "/adapters/hello-copy", headers=auth()).status_code == 200
    r = httpx.post(secure.base_url + "/adapters", json={"name": "hello-copy", "src": "shouter"}, headers=auth())
    assert r.status_code == 200, r.text
    copy_new_weights = complete(secure, prompt, "hello-copy")
    report = {
        "prompt_tokens": via_adapter["prompt_tokens"],
        "via_adapter": via_adapter, "base_after_adapter": base_after_adapter,
        "base_fresh_salt": base_fresh_salt, "adapter_again": adapter_again, "base_again": base_again,
        "copy_first": copy_first, "copy_new_weights": copy_new_weights,
    }
    print("KV isolation:", json.dumps(report, indent=1))
    assert 1000 <= via_adapter["prompt_tokens"] <= 2500
    assert base_after_adapter["cached"] == 0, "the base request reused KV computed under an adapter"
    assert base_after_adapter["text"] == base_fresh_salt["text"]
    assert base_after_adapter["text"] != via_adapter["text"]  # the adapter changes the output
    assert adapter_again["cached"] > 0 and adapter_again["text"] == via_adapter["text"]  # hits still on
    assert base_again["cached"] > 0 and base_again["text"] == base_after_adapter["text"]
    assert copy_first["cached"] == 0
    assert copy_new_weights["cached"] == 0
    # LMI schema through an adapter, then the same text through the base model: no reuse either.
    lmi_prompt = Path(sysconfig.get_paths()["stdlib"], "typing.py").read_text()[:5000]
    r = httpx.post(secure.base_url + "/invocations", headers=auth(), timeout=300,
                   json={"inputs": lmi_prompt, "adapters": "hello-printer", "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 200, r.text
    assert complete(secure, lmi_prompt, BASE, max_tokens=4)["cached"] == 0


def test_redis_password_is_on_no_command_line_and_not_in_the_log(secure):
    before = redis_dbsize_auth(secure.redis_port)  # the Redis is busy_server's too (tests/e2e/conftest.py)
    complete(secure, Path(sysconfig.get_paths()["stdlib"], "pathlib.py").read_text()[:5000], BASE, max_tokens=2)
    time.sleep(3)  # L2 writes complete after the responses
    assert redis_dbsize_auth(secure.redis_port) > before, "nothing reached the password-protected Redis tier"
    needle = REDIS_PASSWORD.encode()
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                assert needle not in f.read(), f"password on the command line of pid {proc.pid}"
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    assert REDIS_PASSWORD not in secure.log_path.read_text(errors="replace")
    cfg = subprocess.run([os.sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(secure.model_dir)],
                         capture_output=True, text=True, timeout=120)
    assert cfg.returncode == 0, cfg.stderr
    assert REDIS_PASSWORD not in cfg.stdout + cfg.stderr and not any(k in cfg.stdout for k in KEYS)
    assert REDIS_PASSWORD not in httpx.get(secure.base_url + "/metrics", headers=auth()).text


def redis_dbsize_auth(port: int) -> int:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(f"AUTH {REDIS_PASSWORD}\r\nDBSIZE\r\n".encode())
        time.sleep(0.3)
        data = s.recv(4096).decode()
    lines = data.split("\r\n")
    assert lines[0] == "+OK", data
    return int(lines[1].lstrip(":"))


def _generated(server) -> float:
    text = httpx.get(server.base_url + "/metrics", headers=auth()).text
    return metric_value(text, "vllm:generation_tokens_total") or 0.0


def assert_engine_stopped_generating(server) -> None:
    """After the stream ended, the engine generates nothing more (the request was aborted; left
    running it would go on towards its 3,000 tokens for many seconds)."""
    time.sleep(1.0)
    first = _generated(server)
    time.sleep(2.5)
    assert _generated(server) == first, "the engine kept generating after the stream ended"


def test_formatter_failing_mid_stream_ends_the_stream_and_aborts_the_generation(secure):
    from openai import OpenAI

    client = OpenAI(base_url=secure.base_url + "/v1", api_key=KEYS[0], max_retries=0, timeout=120)
    # OpenAI schema: SSE error event, after some text.
    raw = httpx.post(secure.base_url + "/v1/completions", headers=auth(), timeout=120,
                     json={"model": "raising-late", "prompt": "def f():", "max_tokens": 3000, "ignore_eos": True,
                           "temperature": 0, "stream": True})
    assert raw.status_code == 200
    events = [ln[6:] for ln in raw.text.splitlines() if ln.startswith("data: ")]
    last = json.loads(events[-1])
    assert "formatter gave up" in last["error"]["message"] and len(events) >= 5
    assert_engine_stopped_generating(secure)
    # The official client sees the error event too (it raises on an SSE error payload).
    with pytest.raises(Exception, match="formatter gave up"):
        for _ in client.completions.create(model="raising-late", prompt="def g():", max_tokens=3000,
                                           stream=True, extra_body={"ignore_eos": True}):
            pass
    # LMI schema: a jsonlines error line.
    r = httpx.post(secure.base_url + "/invocations", headers=auth(), timeout=120,
                   json={"inputs": "class A:", "adapters": "raising-late", "stream": True,
                         "parameters": {"max_new_tokens": 3000, "ignore_eos": True}})
    lines = [json.loads(ln) for ln in r.text.splitlines() if ln.strip()]
    assert "formatter gave up" in lines[-1]["error"] and any("token" in ln for ln in lines[:-1])
    assert_engine_stopped_generating(secure)
    desc = httpx.get(secure.base_url + "/adapters/raising-late", headers=auth()).json()
    assert desc["in_flight"] == 0  # the lease was released
