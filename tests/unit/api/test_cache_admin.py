"""POST /reset_prefix_cache: vLLM's prefix cache emptied through its engine client, retried while
blocks are held for a moment, a 409 (not a 500) when they stay held, a 503 while the engine loads,
and behind the API key."""

from __future__ import annotations

import asyncio

import httpx

from lmi_server.api import cache_admin
from lmi_server.api.app import create_app
from lmi_server.config.schema import build_serving_config

KEY = "admin-key-0123456789"


class FakeEngine:
    """vLLM's EngineClient.reset_prefix_cache: False while blocks are held (`held` more calls)."""

    errored = False

    def __init__(self, held: int):
        self.held, self.calls = held, []

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.calls.append((reset_running_requests, reset_connector))
        self.held -= 1
        return self.held < 0


def app_with(tmp_path, engine, props=None):
    app = create_app(build_serving_config(props or {}, tmp_path), {"model": "x"}, start_engine=False)
    if engine is not None:
        app.state.ctx.owner.state.status, app.state.ctx.owner.state.engine = "ready", engine
    return app


def post(app, headers=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t") as c:
            return await c.post(cache_admin.PATH, headers=headers or {})
    return asyncio.run(go())


def test_reset_calls_vllms_engine_client_for_its_own_cache_only(tmp_path):
    engine = FakeEngine(held=0)
    r = post(app_with(tmp_path, engine))
    assert r.status_code == 200 and r.json() == {"success": True}
    assert engine.calls == [(False, False)]  # running requests kept, LMCache's tiers left alone


def test_blocks_held_for_a_moment_are_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_admin, "PAUSE_S", 0.001)
    engine = FakeEngine(held=3)
    assert post(app_with(tmp_path, engine)).status_code == 200
    assert len(engine.calls) == 4


def test_blocks_that_stay_held_are_a_409_saying_why(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_admin, "PAUSE_S", 0.001)
    engine = FakeEngine(held=10**6)
    r = post(app_with(tmp_path, engine))
    assert r.status_code == 409 and "running requests hold KV blocks" in r.json()["error"]["message"]
    assert len(engine.calls) == cache_admin.TRIES


def test_while_the_engine_loads_it_is_a_503_with_retry_after(tmp_path):
    r = post(app_with(tmp_path, None))
    assert r.status_code == 503 and r.headers.get("retry-after")


def test_it_is_behind_the_api_key(tmp_path):
    engine = FakeEngine(held=0)
    app = app_with(tmp_path, engine, {"option.api_key": KEY})
    assert post(app).status_code == 401
    assert engine.calls == []
    assert post(app, {"Authorization": f"Bearer {KEY}"}).status_code == 200
