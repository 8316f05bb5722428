"""API keys: the ASGI middleware, key loading, the start-up warning, secrets kept out of output."""

import asyncio
import json
import logging

import httpx
import pytest
from fastapi import FastAPI

from lmi_server.api.auth import APIKeyMiddleware, load_api_keys, warn_if_unprotected
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.config.options import SecurityOptions

K1, K2 = "key-one-0123456789", "key-two-9876543210"


def app_with(keys, metrics_public=False):
    app = FastAPI()
    for path in ("/ping", "/health", "/metrics", "/invocations", "/v1/models", "/adapters", "/anything"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET"])
    app.add_middleware(APIKeyMiddleware, keys=keys, metrics_public=metrics_public)
    return app


def get(app, path, headers=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.get(path, headers=headers or {})
    return asyncio.run(go())


def test_keys_protect_everything_but_ping_and_health():
    app = app_with([K1, K2])
    for path in ("/invocations", "/v1/models", "/adapters", "/metrics", "/anything", "/nope"):
        r = get(app, path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "AuthenticationError" and "missing API key" in r.json()["error"]["message"]
    assert get(app, "/ping").status_code == 200 and get(app, "/health").status_code == 200
    assert get(app, "/v1/models", {"Authorization": f"Bearer {K1}"}).status_code == 200
    assert get(app, "/v1/models", {"authorization": f"bearer {K2}"}).status_code == 200  # rotation: both keys
    assert get(app, "/v1/models", {"X-Api-Key": K2}).status_code == 200
    wrong = get(app, "/v1/models", {"Authorization": f"Bearer {K1}x"})
    assert wrong.status_code == 401 and "invalid API key" in wrong.json()["error"]["message"]
    assert K1 not in wrong.text
    assert get(app, "/v1/models", {"Authorization": f"Basic {K1}"}).status_code == 401


def test_metrics_public_and_no_keys():
    assert get(app_with([K1], metrics_public=True), "/metrics").status_code == 200
    assert get(app_with([K1], metrics_public=True), "/adapters").status_code == 401
    assert get(app_with([]), "/adapters").status_code == 200  # off by default


def test_keys_from_option_and_file(tmp_path):
    (tmp_path / "keys").write_text(f"# rotation\n{K2}\n\n")
    cfg = build_serving_config({"option.api_key": f"{K1}, other-key-123", "option.api_key_file": "keys"}, tmp_path)
    assert load_api_keys(cfg.security, tmp_path) == [K1, "other-key-123", K2]
    assert K1 not in repr(cfg) and K1 not in cfg.model_dump_json()
    with pytest.raises(ConfigError, match="cannot be read"):
        load_api_keys(SecurityOptions(api_key_file=tmp_path / "missing"), tmp_path)
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key"):
        load_api_keys(SecurityOptions(api_key_file=tmp_path / "empty"), tmp_path)
    with pytest.raises(ConfigError, match="at least 8"):
        load_api_keys(SecurityOptions(api_key="short"), tmp_path)


def test_one_warning_only_when_open_beyond_loopback(caplog):
    caplog.set_level(logging.WARNING)
    assert warn_if_unprotected("0.0.0.0", []) is True
    assert warn_if_unprotected("127.0.0.1", []) is False
    assert warn_if_unprotected("::1", []) is False
    assert warn_if_unprotected("0.0.0.0", [K1]) is False
    assert len([r for r in caplog.records if "no API key" in r.getMessage()]) == 1


def test_config_output_and_logs_never_show_secrets(tmp_path, capsys, caplog):
    from lmi_server.cli import main
    from lmi_server.redact import redact, register_secret

    (tmp_path / "serving.properties").write_text(f"option.api_key={K1}\noption.max_request_bytes=abc\n")
    assert main(["config", "--model-dir", str(tmp_path)]) == 2  # a config error elsewhere
    (tmp_path / "serving.properties").write_text(f"option.api_key={K1}\noption.api_kye={K2}\n")
    assert main(["config", "--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert K2 not in err and "option.api_kye='***'" in err
    (tmp_path / "serving.properties").write_text(f"option.api_key={K1}\n")
    assert main(["config", "--model-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert K1 not in out and '"api_key": "***"' in out
    (tmp_path / "serving.properties").write_text("option.max_request_bytes=1000\n")
    assert main(["config", "--model-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["security"]["api_key"] is None  # still valid JSON
    register_secret("pw-registered-1")
    assert redact("x pw-registered-1 redis://u:pw2@h:1 Bearer abc.def {\"password\": \"p\"}") == (
        'x *** redis://u:***@h:1 Bearer *** {"password": "***"}'
    )


def test_named_keys_carry_their_tenant_settings(tmp_path):
    from lmi_server.api.auth import default_key_name, load_api_key_entries
    from lmi_server.api.context import request_context

    (tmp_path / "keys").write_text(
        f"# tenants\nname=alice key={K1} weight=2 requests_per_second=5 tokens_per_minute=600\n{K2}\n"
    )
    entries = load_api_key_entries(SecurityOptions(api_key_file=tmp_path / "keys"), tmp_path)
    assert [e.name for e in entries] == ["alice", default_key_name(K2)]
    assert entries[0].weight == 2 and entries[0].requests_per_second == 5 and entries[0].tokens_per_minute == 600
    assert K1 not in repr(entries) and K2 not in default_key_name(K2)
    seen = {}

    async def inner(scope, receive, send):
        seen["entry"] = request_context(scope).key_entry
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app = APIKeyMiddleware(inner, keys=entries)
    assert get(app, "/x", {"X-Api-Key": K1}).status_code == 200 and seen["entry"].name == "alice"
    for bad, match in (
        (f"name=bob key={K1} colour=red", "unknown field"),
        (f"name=b@d key={K1}", "letters, digits"),
        (f"name=bob key={K1} weight=0", "positive number"),
        (f"name=bob key={K1}\nname=bob key={K2}", "two different keys"),
    ):
        (tmp_path / "bad").write_text(bad + "\n")
        with pytest.raises(ConfigError, match=match) as info:
            load_api_key_entries(SecurityOptions(api_key_file=tmp_path / "bad"), tmp_path)
        assert K1 not in str(info.value) and K2 not in str(info.value)
