"""The route table (api/routes.py) is the one list of routes: the app built for each model kind
has exactly the table's rows (both ways), each counted in /metrics under its own label, the public
ones open without a key, the documented ones in /openapi.json."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from prometheus_client import REGISTRY

from lmi_server.api import kinds
from lmi_server.api import routes as table
from lmi_server.api.app import create_app
from lmi_server.api.auth import OPEN_PATHS
from lmi_server.config.schema import build_serving_config


def _classifier(tmp_path):
    directory = tmp_path / "classifier"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    return {"option.model_id": str(directory)}


KINDS = {
    table.GENERATE: lambda tmp_path: {},
    table.EMBED: lambda tmp_path: {"option.model_id": "all-minilm-l6-v2"},
    table.CLASSIFY: _classifier,
}


def app_of(kind: str, tmp_path):
    app = create_app(build_serving_config(KINDS[kind](tmp_path), tmp_path), {"model": "x"}, start_engine=False)
    assert app.state.ctx.config.kind.name == kind
    return app


def concrete(path: str) -> str:
    return re.sub(r"\{[^/}]+\}", "some-name", path)


def app_routes(app) -> set[tuple[str, str]]:
    return {(r.path, m) for r in app.routes for m in (getattr(r, "methods", None) or ())}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_app_route_is_in_the_table_with_its_own_label(kind, tmp_path):
    app = app_of(kind, tmp_path)
    rows = {(r.path, m) for r in table.ROUTES for m in r.methods}
    for path, method in app_routes(app):
        assert (path, method) in rows, f"{method} {path} is served but not in api/routes.py"
        assert table.label_for(concrete(path)) == path, f"{path} is counted under another label"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_row_of_an_installed_router_exists(kind, tmp_path):
    served = app_routes(app_of(kind, tmp_path))
    installed = set(kinds.ROUTERS) | {"fastapi"}
    for row in table.ROUTES:
        if row.router in installed and kind in row.kinds:
            for method in row.methods:
                assert (row.path, method) in served, f"{method} {row.path} ({row.router}) is in the table but not served"


def test_the_front_doors_being_added_have_rows_already():
    paths = {r.path: r for r in table.ROUTES}
    for path in ("/v1/responses", "/v1/responses/{response_id}", "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize"):
        assert paths[path].kinds == {table.GENERATE} and table.label_for(concrete(path)) == path


def test_labels_are_distinct_and_unknown_paths_are_other():
    labels = {}
    for row in table.ROUTES:
        assert labels.setdefault(row.metric_label, row.path) == row.path
    assert table.label_for("/v1/embeddings") == "/v1/embeddings"  # once counted as "other"
    assert table.label_for("/adapters/a/b/c/d") == table.OTHER
    assert table.label_for("/nope") == table.OTHER


def _counted(route: str, status: int) -> float:
    return REGISTRY.get_sample_value("lmi_requests_total", {"route": route, "status": str(status)}) or 0.0


def test_metrics_count_each_route_under_its_label(tmp_path):
    app = app_of(table.GENERATE, tmp_path)
    calls = [("GET", "/live"), ("GET", "/health"), ("GET", "/adapters/some-name"), ("POST", "/v1/embeddings")]
    counted = []

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            for method, path in calls:
                label = table.label_for(path)
                before = {s: _counted(label, s) for s in (200, 400, 404, 503)}
                status = (await c.request(method, path, json={"input": "x"} if method == "POST" else None)).status_code
                counted.append((path, label, _counted(label, status) - before[status]))

    asyncio.run(go())
    assert counted == [(path, path if "{" not in path else "/adapters/{name}", 1.0) for _, path in calls[:2]] + [
        ("/adapters/some-name", "/adapters/{name}", 1.0), ("/v1/embeddings", "/v1/embeddings", 1.0)]


def test_auth_and_openapi_read_the_table(tmp_path):
    assert OPEN_PATHS == {"/ping", "/health", "/live"} == table.public_paths()
    doc = app_of(table.GENERATE, tmp_path).openapi()
    for row in table.rows(kind=table.GENERATE):
        if row.router in kinds.ROUTERS:
            assert (row.path in doc["paths"]) == row.documented, row.path
