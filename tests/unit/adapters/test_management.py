"""LMI's adapter management API: register (preload defaults to true), update, describe, list pages,
unregister, at both path shapes; `pin` and `pinned` alike; .bin adapters served like safetensors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from lmi_server.adapters.registry import AdapterRegistry
from lmi_server.adapters.validation import AdapterInvalid
from tests.unit.adapters.conftest import FakeBackend, make_adapter


def registry(root, backend, base_info, capacity=4):
    return AdapterRegistry(backend, root=root, max_rank=8, capacity=capacity, base=base_info)


# ---------------------------------------------------------------- registry


async def test_register_preloads_by_default_as_lmi(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    make_adapter(root, "b")
    reg = registry(root, fake_backend, base_info)
    a = await reg.add("a", "a")
    assert a.resident and a.preload and fake_backend.loads == ["a"]
    b = await reg.add("b", "b", preload=False)
    assert not b.resident and not b.preload and fake_backend.loads == ["a"]
    d = a.describe()
    assert d["preload"] is True and d["pin"] is False and d["pinned"] is False and d["src"].endswith("/a")


async def test_pin_without_preload_is_refused(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    reg = registry(root, fake_backend, base_info)
    with pytest.raises(AdapterInvalid, match="Can not set preload to false and pin to true"):
        await reg.add("a", "a", preload=False, pin=True)
    assert "a" not in reg.adapters and fake_backend.loads == []


async def test_update_loads_pins_and_unloads(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    reg = registry(root, fake_backend, base_info)
    await reg.add("a", "a", preload=False)
    e = await reg.update("a", preload=True)  # false -> true: loads now
    assert e.resident and e.preload and fake_backend.loads == ["a"]
    e = await reg.update("a")  # nothing named: nothing changes
    assert e.resident and e.preload and fake_backend.loads == ["a"] and fake_backend.unloads == []
    e = await reg.update("a", preload=False)  # true -> false: unloads (idle, unpinned)
    assert not e.resident and not e.preload and fake_backend.unloads == ["a"]
    with pytest.raises(AdapterInvalid, match="Can not set preload to false"):  # preload stays false
        await reg.update("a", pin=True)
    assert not e.pinned and not e.resident
    e = await reg.update("a", preload=True, pin=True)  # loads, and pins as it loads
    assert e.pinned and e.resident and fake_backend.pins == ["a"] and fake_backend.loads == ["a", "a"]


async def test_update_pins_an_adapter_already_resident(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    reg = registry(root, fake_backend, base_info)
    await reg.add("a", "a")
    assert fake_backend.pins == []
    e = await reg.update("a", pin=True)
    assert e.pinned and fake_backend.pins == ["a"] and fake_backend.loads == ["a"]  # pinned in place, not reloaded
    with pytest.raises(AdapterInvalid, match="Unpinning adapter is not supported"):
        await reg.update("a", pin=False)
    with pytest.raises(AdapterInvalid, match="Can not set preload to false and pin to true"):
        await reg.update("a", preload=False)
    assert e.pinned and e.resident


async def test_update_refuses_another_src_and_unknown_names(tmp_path, base_info, fake_backend):
    from lmi_server.adapters.registry import AdapterNotFound

    root = tmp_path / "ad"
    make_adapter(root, "a")
    make_adapter(root, "other")
    reg = registry(root, fake_backend, base_info)
    await reg.add("a", "a")
    assert (await reg.update("a", src="a")).preload  # the same src (relative or absolute) is fine
    await reg.update("a", src=str(root / "a"))
    with pytest.raises(AdapterInvalid, match="changing src is not supported"):
        await reg.update("a", src="other")
    with pytest.raises(AdapterNotFound):
        await reg.update("nope", preload=True)


def test_list_pages_as_lmi(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    for i in range(5):
        make_adapter(root, f"a{i}")
    reg = registry(root, fake_backend, base_info)
    reg.discover()
    items, token = reg.page(2, 0)
    assert [i["name"] for i in items] == ["a0", "a1"] and token == "2"
    items, token = reg.page(2, 4)
    assert [i["name"] for i in items] == ["a4"] and token is None
    assert len(reg.page(500, -3)[0]) == 5  # out-of-range limit and token: LMI's defaults


async def test_a_bin_adapter_is_discovered_fingerprinted_and_loaded(tmp_path, base_info, fake_backend):
    import torch
    from safetensors.torch import load_file

    root = tmp_path / "ad"
    d = make_adapter(root, "pickled")
    torch.save(load_file(str(d / "adapter_model.safetensors")), str(d / "adapter_model.bin"))
    (d / "adapter_model.safetensors").unlink()
    reg = registry(root, fake_backend, base_info)
    ok, failed = reg.discover()
    assert ok == ["pickled"] and not failed
    lease = await reg.acquire("pickled")
    assert fake_backend.loads == ["pickled"] and lease.entry.fingerprint
    assert lease.entry.describe()["weights_file"] == "adapter_model.bin"
    await lease.release()


# ---------------------------------------------------------------- HTTP routes


def app_for(reg):
    from lmi_server.api.adapters import routes
    from lmi_server.api.errors import install_error_handlers

    app = FastAPI()
    app.state.ctx = SimpleNamespace(
        adapters=SimpleNamespace(registry=lambda: reg),
        config=SimpleNamespace(server=SimpleNamespace(max_request_bytes=1 << 20)),
    )
    install_error_handlers(app)
    app.include_router(routes.router)
    return app


def calls(app, steps):
    """Run (method, path, kwargs) requests in one event loop; returns the responses."""

    async def go():
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            for method, path, kwargs in steps:
                out.append(await c.request(method, path, **kwargs))
        return out

    return asyncio.run(go())


@pytest.fixture
def served(tmp_path, base_info):
    root = tmp_path / "ad"
    for n in ("a1", "a2", "a3"):
        make_adapter(root, n)
    backend = FakeBackend()
    return app_for(registry(root, backend, base_info)), backend


@pytest.mark.parametrize("prefix", ["", "/models/test", "/models/any-name"])
def test_lmi_verbs_at_both_path_shapes(served, prefix):
    app, backend = served
    r = calls(app, [
        ("POST", f"{prefix}/adapters", {"params": {"name": "a1", "src": "a1"}}),  # LMI's query form
        ("POST", f"{prefix}/adapters", {"json": {"name": "a2", "src": "a2", "preload": False}}),
        ("GET", f"{prefix}/adapters/a2", {}),
        ("POST", f"{prefix}/adapters/a2/update", {"params": {"preload": "true", "pin": "true"}}),
        ("GET", f"{prefix}/adapters", {}),
        ("DELETE", f"{prefix}/adapters/a1", {}),
        ("GET", f"{prefix}/adapters/a1", {}),
        ("DELETE", f"{prefix}/adapters/a1", {}),
    ])
    assert [x.status_code for x in r] == [200, 200, 200, 200, 200, 200, 404, 404], [x.text for x in r]
    assert r[0].json()["status"] == "Adapter a1 registered" and r[0].json()["adapter"]["status"] == "loaded"
    assert r[1].json()["adapter"]["status"] == "registered"
    described = r[2].json()
    assert {k: described[k] for k in ("name", "preload", "pin")} == {"name": "a2", "preload": False, "pin": False}
    assert described["src"].endswith("/a2")
    assert r[3].json()["status"] == "Adapter a2 updated" and r[3].json()["adapter"]["pin"] is True
    assert backend.pins == ["a2"]
    listed = r[4].json()
    assert [a["name"] for a in listed["adapters"]] == ["a1", "a2"] and "nextPageToken" not in listed
    assert r[5].json()["status"] == "Adapter a1 unregistered"


def test_pinned_is_accepted_as_lmis_pin(served):
    app, backend = served
    r = calls(app, [("POST", "/adapters", {"json": {"name": "a1", "src": "a1", "pinned": True}})])[0]
    assert r.status_code == 200 and r.json()["adapter"]["pin"] is True and backend.pins == ["a1"]


def test_list_pages_with_lmis_parameters(served):
    app, _ = served
    steps = [("POST", "/adapters", {"json": {"name": n, "src": n, "preload": False}}) for n in ("a1", "a2", "a3")]
    steps += [("GET", "/adapters", {"params": {"limit": "2"}}), ("GET", "/adapters", {"params": {"limit": "2", "next_page_token": "2"}})]
    r = calls(app, steps)
    assert [a["name"] for a in r[3].json()["adapters"]] == ["a1", "a2"] and r[3].json()["nextPageToken"] == "2"
    assert [a["name"] for a in r[4].json()["adapters"]] == ["a3"] and "nextPageToken" not in r[4].json()


@pytest.mark.parametrize(
    "method, path, kwargs, status, message",
    [
        ("POST", "/adapters", {"json": {"name": "a1"}}, 400, "src: Field required"),
        ("POST", "/adapters", {"json": {"name": "a1", "src": "a1", "preload": "maybe"}}, 400, "preload"),
        ("POST", "/adapters", {"json": {"name": "a1", "src": "a1", "colour": "red"}}, 400, "colour"),
        ("POST", "/adapters", {"json": {"name": "a1", "src": "a1", "preload": False, "pin": True}}, 400, "Can not set preload to false and pin to true"),
        ("POST", "/adapters", {"json": ["a1"]}, 400, "must be a JSON object"),
        ("POST", "/adapters/nope/update", {"json": {"pin": True}}, 404, "The adapter nope was not found"),
        ("POST", "/adapters/a1/update", {"json": {"name": "a2"}}, 400, "renaming is not supported"),
        ("GET", "/adapters", {"params": {"limit": "many"}}, 400, "limit"),
        ("PUT", "/adapters/a1", {}, 405, ""),
    ],
)
def test_bad_requests_are_named(served, method, path, kwargs, status, message):
    app, _ = served
    r = calls(app, [("POST", "/adapters", {"json": {"name": "a1", "src": "a1"}}), (method, path, kwargs)])[1]
    assert r.status_code == status, r.text
    assert message in r.text


def test_lora_off_answers_like_lmi():
    from lmi_server.api.adapters import routes

    app = app_for(None)
    r = calls(app, [("GET", "/adapters", {}), ("POST", "/adapters", {"json": {"name": "a", "src": "a"}}),
                    ("POST", "/models/test/adapters/a/update", {}), ("DELETE", "/models/test/adapters/a", {})])
    assert r[0].status_code == 200 and r[0].json()["adapters"] == []
    assert [x.status_code for x in r[1:]] == [400, 400, 400]
    assert all(routes.LORA_OFF in x.text for x in r[1:])


async def test_a_src_that_is_no_path_is_invalid_not_a_crash(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    reg = registry(root, fake_backend, base_info)
    with pytest.raises(AdapterInvalid, match="not a usable path"):
        await reg.add("x", "a\x00b")
    await reg.add("a", "a")
    with pytest.raises(AdapterInvalid, match="changing src is not supported"):
        await reg.update("a", src="a\x00b")
