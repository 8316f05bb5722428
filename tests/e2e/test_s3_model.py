"""option.model_id=s3://bucket/prefix end to end: the demo model, uploaded to a real S3-protocol
server on loopback, is downloaded by the server at start-up (credentials and endpoint from the
standard AWS environment variables) and served."""

from __future__ import annotations

import json

import httpx
import pytest

from lmi_server import model_source as ms
from tests.support.s3 import moto_s3, s3_environment, upload_dir  # noqa: F401 - fixture
from tests.support.server import DEMO_PROPS, running_server

pytestmark = pytest.mark.e2e


def test_a_model_in_s3_is_downloaded_at_start_up_and_served(moto_s3, tmp_path, monkeypatch):
    from lmi_server.demo.builder import ensure_demo_model

    demo = ensure_demo_model(tmp_path / "demo-src")  # the project's own tiny model, as lmi-demo resolves it
    keys = upload_dir(moto_s3, "models", "demo", demo, multipart_bytes=8 * 2**20)
    assert "demo/config.json" in keys
    env = s3_environment(moto_s3, tmp_path / "cache")
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the server process inherits them, as from a container's environment
    url = "s3://models/demo"
    props = {**DEMO_PROPS, "option.model_id": url, "option.tgi_compat": "true"}  # a TGI client's deployment
    with running_server(tmp_path / "model-dir", props) as server:
        local = ms.local_dir(url)
        manifest = json.loads((local / ms.MANIFEST).read_text())
        assert manifest["url"] == url and len(manifest["objects"]) == len(keys)
        assert (local / "model.safetensors").read_bytes() == (demo / "model.safetensors").read_bytes()
        assert not local.with_name(local.name + ms.PARTIAL_SUFFIX).exists()
        models = httpx.get(server.base_url + "/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["demo"]
        r = httpx.post(
            server.base_url + "/v1/completions",
            json={"model": "demo", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0},
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
