"""SageMaker sessions shared through a real Redis (option.sessions_redis_url): two apps stand for
two replicas (no engine: session requests are answered before one is needed)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import time

import httpx
import pytest

from deploy.cluster import redis_server_binary
from lmi_server.api.app import create_app
from lmi_server.api.errors import APIError
from lmi_server.api.sessions import SessionExpired, SessionStore
from lmi_server.api.sessions_redis import LIVE_KEY, PREFIX, RedisSessionStore, build_session_store
from lmi_server.config.schema import ConfigError, build_serving_config

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")

PASSWORD = "sessions-pw-5d41402abc4b2a76"
SESSION = "X-Amzn-SageMaker-Session-Id"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    port = _free_port()
    conf = tmp_path_factory.mktemp("redis") / "redis.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nrequirepass {PASSWORD}\nsave \"\"\nappendonly no\ndir {conf.parent}\n")
    proc = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(10)


_DBS = itertools.count(1)


@pytest.fixture
def url(redis_port):
    """Another database number per test, so tests do not see each other's sessions."""
    return f"redis://:{PASSWORD}@127.0.0.1:{redis_port}/{next(_DBS) % 15}"


def _store(url: str, expiration_s: int = 60, **kw) -> RedisSessionStore:
    return RedisSessionStore.from_url(url, expiration_s, **kw)


def _flush(store: RedisSessionStore):
    return store.client.flushdb()


def test_a_session_opened_on_one_replica_is_checked_and_closed_on_another(url):
    async def go():
        a, b = _store(url), _store(url)
        await _flush(a)
        s = await a.create()
        assert (await b.check(s.id)).id == s.id
        assert await a.live_count() == 1 and await b.live_count() == 1
        await b.close(s.id)
        with pytest.raises(APIError, match="was closed") as closed:
            await a.check(s.id)
        assert closed.value.status == 424
        assert await a.live_count() == 0
        with pytest.raises(APIError, match="was closed"):  # closing twice says so too
            await a.close(s.id)
        # the closed record stays, with its expiry, until Redis forgets it
        assert 60_000 < await a.client.pttl(f"{PREFIX}:s:{s.id}") <= 120_000
        for bad in ("Q" * 43, "../../etc/passwd", "x"):
            with pytest.raises(APIError, match="unknown") as unknown:
                await b.check(bad)
            assert unknown.value.status == 424
        await a.aclose()
        await b.aclose()

    asyncio.run(go())


def test_redis_expires_sessions_itself_after_they_read_expired(url):
    async def go():
        store = _store(url, expiration_s=1, grace_s=1)
        await _flush(store)
        s = await store.create()
        key = f"{PREFIX}:s:{s.id}"
        assert 1000 < await store.client.pttl(key) <= 2000  # PXAT = expiry + grace
        await asyncio.sleep(1.1)
        with pytest.raises(SessionExpired, match="expired at"):  # LMI: served without its session
            await store.check(s.id)
        assert await store.live_count() == 0
        await asyncio.sleep(1.2)
        assert await store.client.exists(key) == 0  # Redis forgot it, no sweeper involved
        with pytest.raises(APIError, match="unknown"):
            await store.check(s.id)
        assert await store.sweep() == 1  # the live count's entry is pruned
        assert await store.client.zcard(LIVE_KEY) == 0
        await store.aclose()

    asyncio.run(go())


def test_max_sessions_counts_every_replica(url):
    async def go():
        a, b = _store(url, max_sessions=2), _store(url, max_sessions=2)
        await _flush(a)
        first = await a.create()
        await b.create()
        with pytest.raises(APIError) as full:
            await a.create()
        assert full.value.status == 429 and "every replica" in full.value.message
        await b.close(first.id)
        await b.create()
        results = await asyncio.gather(a.create(), b.create(), return_exceptions=True)
        assert all(isinstance(r, APIError) and r.status == 429 for r in results)
        assert await a.live_count() == 2
        await a.aclose()
        await b.aclose()

    asyncio.run(go())


def test_credentials_come_from_the_url_or_the_shared_tier_environment(redis_port, monkeypatch):
    bare = f"redis://127.0.0.1:{redis_port}/15"

    async def go():
        monkeypatch.delenv("LMCACHE_RESP_PASSWORD", raising=False)
        without = _store(bare)
        with pytest.raises(APIError) as denied:
            await without.create()
        assert denied.value.status == 503 and "no session was opened" in denied.value.message
        assert PASSWORD not in denied.value.message
        monkeypatch.setenv("LMCACHE_RESP_PASSWORD", PASSWORD)
        shared_env = _store(bare.replace("redis://", "valkey://"))
        assert (await shared_env.check((await shared_env.create()).id)).closed is False
        await without.aclose()
        await shared_env.aclose()

    asyncio.run(go())


def test_a_redis_that_is_down_is_a_503_on_session_requests_only(tmp_path):
    down = f"redis://127.0.0.1:{_free_port()}/0"
    cfg = build_serving_config({"option.sessions_redis_url": down}, tmp_path)
    app = create_app(cfg, {"model": "x"}, start_engine=False)
    assert isinstance(app.state.ctx.sessions.store, RedisSessionStore)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
            t0 = time.monotonic()
            answers = [
                await c.post("/invocations", json={"requestType": "NEW_SESSION"}),
                await c.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION: "Q" * 43}),
                await c.post("/invocations", json={"inputs": "hi"}, headers={SESSION: "Q" * 43}),
            ]
            elapsed = time.monotonic() - t0
            sessionless = await c.post("/invocations", json={"inputs": "hi"})
        return answers, elapsed, sessionless

    answers, elapsed, sessionless = asyncio.run(go())
    for r in answers:
        assert r.status_code == 503, r.text
        assert "session store (redis://127.0.0.1" in r.json()["error"]
    assert elapsed < 15
    assert "session store" not in sessionless.text  # no session named: Redis is not asked (no engine here)


def test_two_apps_share_sessions_over_http(url, tmp_path):
    apps = [
        create_app(build_serving_config({"option.sessions_redis_url": url}, tmp_path / name), {"model": "x"}, start_engine=False)
        for name in ("a", "b")
    ]

    async def go():
        transports = [httpx.ASGITransport(app=app) for app in apps]
        async with httpx.AsyncClient(transport=transports[0], base_url="http://a") as a, httpx.AsyncClient(
            transport=transports[1], base_url="http://b"
        ) as b:
            await apps[0].state.ctx.sessions.store.client.flushdb()
            opened = await a.post("/invocations", json={"requestType": "NEW_SESSION"})
            session_id = opened.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0]
            closed = await b.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION: session_id})
            again = await a.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION: session_id})
        return opened, closed, again, session_id

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    opened, closed, again, session_id = asyncio.run(go())
    assert opened.status_code == 200 and opened.headers[SESSION].startswith(session_id)
    assert closed.status_code == 200 and closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == session_id
    assert again.status_code == 424 and "was closed" in again.json()["error"]


# ---------------------------------------------------------------------------------------------
# The option
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, message",
    [
        ("http://cache:6379", "scheme 'http' is not supported"),
        ("cache:6379", "is not supported"),
        ("redis://:6379", "names no host"),
        ("redis://cache:port", "port is not a number"),
        ("redis://cache:6379/sessions", "database number"),
    ],
)
def test_a_bad_url_is_a_config_error_with_an_example(value, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_serving_config({"option.sessions_redis_url": value}, tmp_path)
    assert "option.sessions_redis_url" in str(err.value) and message in str(err.value)
    assert "redis://sessions.internal:6379/0" in str(err.value)


def test_one_place_for_sessions(tmp_path):
    with pytest.raises(ConfigError, match="choose one place for sessions"):
        build_serving_config(
            {"option.sessions_path": str(tmp_path / "s"), "option.sessions_redis_url": "redis://cache:6379"}, tmp_path
        )
    default = build_serving_config({}, tmp_path).sessions
    assert isinstance(build_session_store(default), SessionStore)
    shared = build_serving_config({"option.sessions_redis_url": "rediss://cache:6380/2"}, tmp_path).sessions
    store = build_session_store(shared)
    assert isinstance(store, RedisSessionStore) and store.where == "rediss://cache:6380/2"
    assert store.grace_s == shared.sessions_sweep_interval and store.max_sessions == shared.max_sessions


def test_a_refused_url_does_not_echo_its_password(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_serving_config({"option.sessions_redis_url": "http://:hunter2-sessions@cache:6379"}, tmp_path)
    assert "hunter2-sessions" not in str(err.value) and "http://:***@cache:6379" in str(err.value)
