"""SageMaker's adapter components through the adapter API: a `src` in SageMaker's adapter root
(on SageMaker only), names as SageMaker and LMI send them, the `X-Amzn-SageMaker-Adapter-Alias`
header in the answers, the errors and as a second name, and deregistration."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_server.adapters.registry import AdapterRegistry
from lmi_server.adapters.src_paths import SAGEMAKER_ROOT, sagemaker_roots
from lmi_server.adapters.validation import AdapterInvalid
from tests.unit.adapters.conftest import FakeBackend, make_adapter
from tests.unit.adapters.test_management import app_for, calls

ALIAS = "X-Amzn-SageMaker-Adapter-Alias"
IDENTIFIER = "X-Amzn-SageMaker-Adapter-Identifier"
ON = {"SAGEMAKER_SAFE_PORT_RANGE": "10000-10999"}


def test_sagemaker_adapter_root_only_on_sagemaker(tmp_path):
    assert sagemaker_roots({}) == []
    assert sagemaker_roots(ON) == [SAGEMAKER_ROOT] == [Path("/opt/ml")]
    assert sagemaker_roots({"LMI_ON_SAGEMAKER": "true"}) == [Path("/opt/ml")]
    assert sagemaker_roots({**ON, "LMI_ON_SAGEMAKER": "false"}) == []
    listed = f"{tmp_path}/a:{tmp_path}/b:relative/ignored"
    assert sagemaker_roots({**ON, "LMI_SAGEMAKER_ADAPTER_ROOTS": listed}) == [tmp_path / "a", tmp_path / "b"]


async def test_src_in_sagemakers_root_is_accepted_there_and_refused_elsewhere(tmp_path, base_info):
    own = tmp_path / "model" / "adapters"
    own.mkdir(parents=True)
    placed = tmp_path / "opt-ml" / "ic-artifacts" / "abc123"  # where SageMaker unpacked the ArtifactUrl
    make_adapter(placed.parent, placed.name)
    env = {**ON, "LMI_SAGEMAKER_ADAPTER_ROOTS": str(tmp_path / "opt-ml")}

    elsewhere = AdapterRegistry(FakeBackend(), root=own, allowed_roots=[own, *sagemaker_roots({})], base=base_info, max_rank=8)
    with pytest.raises(AdapterInvalid, match="outside the allowed adapter root"):
        await elsewhere.add("ic-1", str(placed))

    backend = FakeBackend()
    on_sm = AdapterRegistry(backend, root=own, allowed_roots=[own, *sagemaker_roots(env)], base=base_info, max_rank=8)
    entry = await on_sm.add("ic-1", str(placed))
    assert entry.spec.path == placed.resolve() and backend.loads == ["ic-1"]
    with pytest.raises(AdapterInvalid, match="outside the allowed adapter root"):  # still confined
        await on_sm.add("other", str(tmp_path / "model"))


def _sm_app(tmp_path, base_info):
    root = tmp_path / "ad"
    make_adapter(root, "payload")
    backend = FakeBackend()
    reg = AdapterRegistry(backend, root=root, base=base_info, max_rank=8, capacity=4)
    return app_for(reg), reg, backend


def test_register_use_alias_and_remove_as_sagemaker_calls_it(tmp_path, base_info):
    """SageMaker's calls: POST /adapters with name and src as query parameters (no body), the
    alias header; then DELETE /adapters/{name}. Every answer names the alias and carries it back."""
    app, reg, backend = _sm_app(tmp_path, base_info)
    name = "7f3c2a9e-11b2-4c1e-9d3a-0a1b2c3d4e5f"  # an identifier SageMaker might choose
    headers = {ALIAS: "adapter-chinese-1"}
    r = calls(app, [
        ("POST", "/adapters", {"params": {"name": name, "src": "payload"}, "headers": headers}),
        ("GET", f"/adapters/{name}", {"headers": headers}),
        ("GET", "/adapters/adapter-chinese-1", {}),  # the alias names it too
        ("POST", f"/adapters/{name}/update", {"params": {"pin": "true"}, "headers": headers}),
        ("DELETE", f"/adapters/{name}", {"headers": headers}),
        ("DELETE", f"/adapters/{name}", {"headers": headers}),
        ("GET", f"/adapters/{name}", {"headers": headers}),
    ])
    assert [x.status_code for x in r] == [200, 200, 200, 200, 200, 404, 404], [x.text for x in r]
    assert r[0].json()["status"] == "Adapter adapter-chinese-1 registered"
    assert r[0].headers[ALIAS] == "adapter-chinese-1"
    assert r[1].json()["name"] == name and r[1].json()["alias"] == "adapter-chinese-1"
    assert r[2].json()["name"] == name
    assert r[3].json()["status"] == "Adapter adapter-chinese-1 updated"
    assert r[4].json()["status"] == "Adapter adapter-chinese-1 unregistered"
    assert r[5].json()["error"]["message"].startswith("The adapter adapter-chinese-1 was not found")
    assert r[5].headers[ALIAS] == "adapter-chinese-1"
    assert name not in reg.adapters and backend.unloads == [name]


def test_without_alias_answers_name_the_adapter(tmp_path, base_info):
    app, _, _ = _sm_app(tmp_path, base_info)
    r = calls(app, [
        ("POST", "/adapters", {"json": {"name": "plain", "src": "payload"}}),
        ("DELETE", "/adapters/plain", {}),
        ("DELETE", "/adapters/plain", {}),
    ])
    assert r[0].json()["status"] == "Adapter plain registered" and ALIAS not in r[0].headers
    assert r[1].json()["status"] == "Adapter plain unregistered"
    assert r[2].status_code == 404 and r[2].json()["error"]["message"].startswith("The adapter plain was not found")


def test_errors_name_the_alias(tmp_path, base_info):
    app, _, _ = _sm_app(tmp_path, base_info)
    headers = {ALIAS: "my-component"}
    r = calls(app, [
        ("POST", "/adapters", {"params": {"name": "x1", "src": "/etc"}, "headers": headers}),
        ("POST", "/adapters", {"params": {"name": "x1", "src": "payload"}, "headers": headers}),
        ("POST", "/adapters", {"params": {"name": "x2", "src": "payload"}, "headers": headers}),  # alias taken
        ("POST", "/adapters", {"params": {"name": "bad/name", "src": "payload"}}),
        ("POST", "/adapters", {"params": {"name": "x3", "src": "payload"}, "headers": {ALIAS: " padded "}}),
        ("POST", "/adapters", {"params": {"name": "x4", "src": "payload"}, "headers": {ALIAS: "a/b"}}),
    ])
    assert r[0].status_code == 400 and r[0].json()["error"]["message"].startswith("adapter my-component: ")
    assert r[1].status_code == 200
    assert r[2].status_code == 409 and "alias 'my-component' already names" in r[2].json()["error"]["message"]
    assert r[3].status_code == 400 and "invalid adapter name" in r[3].json()["error"]["message"]
    assert r[4].status_code == 200 and r[4].json()["adapter"]["alias"] == "padded"  # header values are trimmed
    assert r[5].status_code == 400 and "alias: invalid adapter name 'a/b'" in r[5].json()["error"]["message"]


async def test_alias_is_a_second_name_for_requests(tmp_path, base_info):
    root = tmp_path / "ad"
    make_adapter(root, "payload")
    backend = FakeBackend()
    reg = AdapterRegistry(backend, root=root, base=base_info, max_rank=8, capacity=4)
    await reg.add("opaque-id", "payload", alias="adapter-chinese-1")
    lease = await reg.acquire("adapter-chinese-1")
    assert lease.entry.name == "opaque-id"
    await reg.release(lease)
    with pytest.raises(Exception, match="already registered"):
        reg.register("adapter-chinese-1", root / "payload")  # an alias is not a free name
    await reg.remove("adapter-chinese-1")
    assert reg.adapters == {}
