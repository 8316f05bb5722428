"""option.model_id=s3://bucket/prefix end to end: the demo model, uploaded to a real S3-protocol
server on loopback, is downloaded by the server at start-up (credentials and endpoint from the
standard AWS environment variables) and served, as a TGI client's deployment (option.tgi_compat).

The server is the session's `blend_server` (tests/e2e/conftest.py), started from S3 with those
settings; this module runs right after tests/e2e/test_blend.py, its other user."""

from __future__ import annotations

import json

import httpx
import pytest

from lmi_server import model_source as ms

pytestmark = pytest.mark.e2e


def test_a_model_in_s3_is_downloaded_at_start_up_and_served(blend_server, monkeypatch):
    server, url, keys = blend_server, blend_server.s3_url, blend_server.s3_keys
    assert "lmi-demo/config.json" in keys
    for name, value in server.s3_env.items():
        monkeypatch.setenv(name, value)  # where the server downloads to: its cache directory
    local = ms.local_dir(url)
    manifest = json.loads((local / ms.MANIFEST).read_text())
    assert manifest["url"] == url and len(manifest["objects"]) == len(keys)
    assert (local / "model.safetensors").read_bytes() == (server.s3_source / "model.safetensors").read_bytes()
    assert not local.with_name(local.name + ms.PARTIAL_SUFFIX).exists()
    models = httpx.get(server.base_url + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["lmi-demo"]  # the prefix's last component
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": "lmi-demo", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]
    r = httpx.post(server.base_url + "/invocations", json={"inputs": "import os", "parameters": {"max_new_tokens": 4}}, timeout=120)
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list) and r.json()[0]["generated_text"]  # option.tgi_compat: TGI's list
    with httpx.stream("POST", server.base_url + "/invocations", timeout=120,
                      json={"inputs": "import os", "parameters": {"max_new_tokens": 4}, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in s.iter_lines() if line.startswith("data: ")]
    assert 1 <= len(events) <= 4 and events[-1]["generated_text"] and all(e["token"]["text"] is not None for e in events)
    log = server.log_path.read_text(errors="replace")
    assert f"{url}: downloaded to {local}" in log
