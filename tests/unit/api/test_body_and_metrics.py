"""Request bodies that nest too deep, and /metrics that must not block the event loop."""

import asyncio
import http.server
import threading
import time
from types import SimpleNamespace

import httpx

from lmi_server.api.app import create_app
from lmi_server.config.schema import build_serving_config


def _post(app, path, content):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post(path, content=content, headers={"content-type": "application/json"})
    return asyncio.run(go())


def test_deeply_nested_json_is_a_400_not_a_500(tmp_path):
    app = create_app(build_serving_config({}, tmp_path), {"model": "x"}, start_engine=False)
    for depth in (100_000, 65):
        body = '{"inputs": ' + "[" * depth + "]" * depth + "}"
        for path in ("/invocations", "/v1/completions", "/v1/chat/completions"):
            r = _post(app, path, body)
            assert r.status_code == 400, (depth, path, r.text)
            error = r.json()["error"]  # LMI's flat body on /invocations, OpenAI's envelope on /v1
            assert "deeper than 64" in (error if path == "/invocations" else error["message"])
    r = _post(app, "/invocations", '{"inputs": ' + "[" * 10 + "]" * 10 + "}")
    assert r.status_code != 400 or "deeper" not in r.text  # shallow JSON passes the depth check


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        time.sleep(0.8)
        body = b"lmcache_mp_lookup_hit_tokens_total 7.0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_metrics_scrape_of_the_cache_server_does_not_block_the_event_loop():
    from fastapi import FastAPI

    from lmi_server.metrics import register_lmcache_collector, router, unregister_collector

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    plan = SimpleNamespace(mode="mp", metrics_url=f"http://127.0.0.1:{server.server_port}/metrics")
    collector = register_lmcache_collector(plan, SimpleNamespace(restarts=0, alive=True))
    app = FastAPI()
    app.include_router(router)
    app.add_api_route("/ping", lambda: {"ok": True})

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=10) as c:
            scrape = asyncio.create_task(c.get("/metrics"))
            await asyncio.sleep(0.1)
            t = time.monotonic()
            assert (await c.get("/ping")).status_code == 200
            ping_s = time.monotonic() - t
            text = (await scrape).text
            return ping_s, text

    try:
        ping_s, text = asyncio.run(go())
    finally:
        unregister_collector(collector)
        server.shutdown()
    assert ping_s < 0.4, f"/ping waited {ping_s:.2f} s behind /metrics"
    assert "lmi_lmcache_lookup_hit_tokens_total 7.0" in text


def test_ping_reports_a_degraded_cache_tier_but_stays_healthy(tmp_path):
    app = create_app(build_serving_config({}, tmp_path), {"model": "x"}, start_engine=False)
    owner = app.state.ctx.owner
    owner.state.status, owner.state.engine = "ready", SimpleNamespace(errored=False)
    owner.cache_server = SimpleNamespace(degraded="LMCache cache server down (5 restarts so far)")

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.get("/ping")

    r = asyncio.run(go())
    assert r.status_code == 200 and r.json() == {"status": "healthy", "degraded": "LMCache cache server down (5 restarts so far)"}
    owner.cache_server = SimpleNamespace(degraded=None)
    assert asyncio.run(go()).json() == {"status": "healthy"}
