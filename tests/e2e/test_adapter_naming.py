"""A request that names an adapter is served by it or refused with a 404 naming what exists, on
every route and in every way of naming it, with LoRA on and off: never the base model's answer
under another name. Unknown names only, so the shared servers' adapters stay unloaded. LoRA off:
`busy_server`; LoRA on: the shared `server` (tests/e2e/conftest.py)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e

HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
GHOST = "no-such-adapter"
CHAT = {"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 4}
COMPLETION = {"prompt": "def main():", "max_tokens": 4}
LMI = {"inputs": "def main():", "parameters": {"max_new_tokens": 4}}

WAYS = [
    # (route, body, header)
    ("/invocations", {**LMI, "adapters": GHOST}, None),
    ("/invocations", {**LMI, "adapters": [GHOST]}, None),
    ("/invocations", LMI, GHOST),
    ("/invocations", {**LMI, "model": GHOST}, None),
    ("/invocations", {**LMI, "stream": True, "adapters": GHOST}, None),
    ("/invocations", {**CHAT, "adapters": GHOST}, None),
    ("/invocations", {**CHAT, "model": GHOST}, None),
    ("/invocations", CHAT, GHOST),
    ("/invocations", {**COMPLETION, "adapters": GHOST}, None),
    ("/invocations", {**COMPLETION, "model": GHOST}, None),
    ("/invocations", COMPLETION, GHOST),
    ("/v1/chat/completions", {**CHAT, "model": "lmi-demo", "adapters": GHOST}, None),
    ("/v1/chat/completions", {**CHAT, "model": GHOST}, None),
    ("/v1/chat/completions", {**CHAT, "model": "lmi-demo"}, GHOST),
    ("/v1/chat/completions", {**CHAT, "model": "lmi-demo", "stream": True, "adapters": GHOST}, None),
    ("/v1/completions", {**COMPLETION, "model": "lmi-demo", "adapters": GHOST}, None),
    ("/v1/completions", {**COMPLETION, "model": GHOST}, None),
    ("/v1/completions", {**COMPLETION, "model": "lmi-demo"}, GHOST),
    ("/v1/completions", {**COMPLETION, "model": "lmi-demo", "stream": True}, GHOST),
]


def _message(payload) -> str:
    error = payload["error"]
    return error if isinstance(error, str) else error["message"]


def _check_every_way(server, exists: str) -> None:
    failures = []
    for path, body, header in WAYS:
        r = httpx.post(server.base_url + path, json=body, headers={HEADER: header} if header else None, timeout=120)
        if r.status_code != 404 or GHOST not in _message(r.json()) or exists not in _message(r.json()):
            failures.append((path, body, header, r.status_code, r.text[:200]))
    assert not failures, failures
    r = httpx.post(server.base_url + "/invocations", json=LMI, timeout=120)
    assert r.status_code == 200 and r.json()["generated_text"], r.text  # the base model still serves
    r = httpx.post(server.base_url + "/v1/completions", json={**COMPLETION, "model": "lmi-demo"}, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == "lmi-demo", r.text


def test_with_lora_off_every_way_of_naming_an_adapter_is_a_404_naming_the_served_model(busy_server):
    _check_every_way(busy_server, "'lmi-demo'")


def test_with_lora_on_every_way_of_naming_an_unknown_adapter_is_a_404_naming_the_registered_ones(lora):
    _check_every_way(lora, "hello-printer")
