"""Who a request belongs to, its priority and its token estimate (api/tenants.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lmi_server.admission import BadPriority, Tenants, estimate_tokens, parse_priority
from lmi_server.api.auth import KeyEntry  # the API keys a tenant is named by (HTTP layer)
from lmi_server.config.schema import ConfigError, build_serving_config

pytestmark = pytest.mark.unit


def test_tenant_is_the_key_else_the_adapter_else_the_header_else_default():
    t = Tenants(header="x-tenant-id")
    assert t.identify("alice", {"x-tenant-id": "mallory"}, "pirate") == "alice"  # the header cannot override a key
    assert t.identify(None, {"x-tenant-id": "mallory"}, "pirate") == "pirate"
    assert t.identify(None, {"x-tenant-id": "team a/\n" + "x" * 100}, None) == "team_a__" + "x" * 56
    assert t.identify(None, {}, None) == "default"
    assert Tenants().identify(None, {"x-tenant-id": "mallory"}, None) == "default"  # no header configured


def test_priority_from_header_or_body():
    assert parse_priority({"x-priority": " -3 "}, SimpleNamespace(priority=5)) == -3
    assert parse_priority({}, SimpleNamespace(priority=5)) == 5
    assert parse_priority({}, None) == 0
    for bad in ("high", "1.5", "", str(2**40)):
        with pytest.raises(BadPriority):
            parse_priority({"x-priority": bad}, None)


def test_token_estimate():
    assert estimate_tokens(SimpleNamespace(prompt="x" * 40, max_tokens=10)) == 20
    chat = SimpleNamespace(messages=[{"role": "user", "content": "y" * 8}], max_completion_tokens=None, max_tokens=None)
    assert estimate_tokens(chat) == 2 + 16
    assert estimate_tokens(SimpleNamespace(prompt=[1, 2, 3], max_tokens=1, n=2)) == 3 + 2
    assert estimate_tokens(None) == 16


def test_config_and_key_entries_make_weights_and_limits(tmp_path):
    cfg = build_serving_config(
        {"option.model_id": "lmi-demo", "option.tenant_weights": "pirate:3,shouter:1",
         "option.tenant_requests_per_second": "2", "option.scheduling_policy": "priority"},
        tmp_path,
    )
    t = Tenants.from_config(cfg, [KeyEntry(key="k" * 10, name="alice", weight=5, tokens_per_minute=100)])
    assert t.weights == {"pirate": 3.0, "shouter": 1.0, "alice": 5}
    assert t.limits("alice").tokens_per_minute == 100 and t.limits("alice").requests_per_second == 2
    assert t.limits("bob").requests_per_second == 2 and t.vllm_priority
    for bad in ({"option.tenant_weights": "pirate:0"}, {"option.admission_policy": "lottery"},
                {"option.tenant_queue_share": "0"}, {"option.tenant_header": "x tenant"}):
        with pytest.raises(ConfigError):
            build_serving_config({"option.model_id": "lmi-demo", **bad}, tmp_path)


def test_token_estimate_reads_the_responses_and_messages_bodies():
    """Per-tenant token limits count the new front doors' prompts and budgets, typed or not."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    messages = AnthropicMessagesRequest.model_validate({
        "model": "m", "max_tokens": 10, "system": "s" * 40,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}],
    })
    assert estimate_tokens(messages) == 10 + 10 + 10
    responses = ResponsesRequest.model_validate({
        "model": "m", "max_output_tokens": 7, "instructions": "i" * 40,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "y" * 80}]}],
    })
    assert estimate_tokens(responses) == 10 + 20 + 7
    assert estimate_tokens(ResponsesRequest.model_validate({"model": "m", "input": "z" * 40})) >= 10
