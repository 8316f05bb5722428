"""Security end to end, on one real server: API keys (also through the official openai client),
KV reuse isolated between adapters and the base model (LMCache CPU tier, fp32, greedy), the
Redis tier's password kept off every command line and out of the log, and output formatters
that fail mid-stream (error event, engine request aborted, adapter lease released)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
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
from tests.e2e.conftest import _adapters_for
from tests.support.server import DEMO_PROPS, ServerProcess, free_port, server_env, write_properties

KEYS = ["sk-first-" + secrets.token_hex(12), "sk-second-" + secrets.token_hex(12)]
REDIS_PASSWORD = "redis-pw-" + secrets.token_hex(12)
BASE = "lmi-demo"
# Raises from its 6th streamed piece on (per request): the stream has begun when it fails.
RAISE_LATE = """
import json

from djl_python.output_formatter import output_formatter

_seen = {}


@output_formatter
def raise_late(response):
    if not isinstance(response, str):  # a whole response: not streamed
        return response
    data = response[len("data:"):].strip()
    if data == "[DONE]":
        return response
    key = json.loads(data).get("id")  # the request's id: pieces counted per stream
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] > 5:
        raise RuntimeError("formatter gave up at piece %d" % _seen[key])
    return response
"""

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    from lmi_server.demo.builder import ensure_demo_model

    model_dir = tmp_path_factory.mktemp("security-model-dir")
    root = model_dir / "adapters"
    root.mkdir()
    _adapters_for(ensure_demo_model(), root)
    shutil.copytree(root / "hello-printer", root / "hello-copy")
    shutil.copytree(root / "hello-printer", root / "raising-late")
    (root / "raising-late" / "model.py").write_text(RAISE_LATE)
    # Redis with a password, from a 0600 config file (never on a command line).
    redis_port = free_port()
    conf = model_dir / "redis.conf"
    conf.write_text(f"port {redis_port}\nbind 127.0.0.1\nrequirepass {REDIS_PASSWORD}\nsave \"\"\nappendonly no\ndir {model_dir}\n")
    conf.chmod(0o600)
    redis = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (model_dir / "lmcache.yaml").write_text(
        "chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n"
        f"remote_url: \"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_port}\"\n"
    )
    (model_dir / "api_keys").write_text("# rotation: both keys work\n" + "\n".join(KEYS) + "\n")
    props = {
        **DEMO_PROPS,
        "option.enable_prefix_caching": "false",  # cached_tokens then counts LMCache hits only
        "option.lmcache_config_file": "lmcache.yaml",
        "option.enable_lora": "true",
        "option.max_loras": "2",
        "option.max_lora_rank": "8",
        "option.adapters_path": str(root),
        "option.api_key_file": "api_keys",
    }
    write_properties(model_dir, props)
    proc = ServerProcess(model_dir, model_dir / "server.log", env=server_env()).start()
    try:
        proc.wait_ready()
        proc.redis_port = redis_port
        proc.model_dir = model_dir
        proc.adapters_root = root
        yield proc
    finally:
        proc.stop()
        redis.terminate()
        redis.wait(10)


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
    time.sleep(3)  # L2 writes complete after the responses
    assert redis_dbsize_auth(secure.redis_port) > 0, "nothing reached the password-protected Redis tier"
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
