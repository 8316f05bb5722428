"""Registry: discovery, lazy loading under one lock per name, LRU eviction, leases, deletion."""

from __future__ import annotations

import asyncio
import time

import pytest

from lmi_server.adapters.formatters import FormatterError

OUTPUT_FORMATTER = "from djl_python.output_formatter import output_formatter\n@output_formatter\ndef f(r):\n    return r\n"
from lmi_server.adapters.registry import AdapterConflict, AdapterNotFound, AdapterRegistry, AdapterUnavailable
from lmi_server.adapters.validation import AdapterInvalid
from tests.unit.adapters.conftest import FakeBackend, make_adapter


def registry(root, backend, base_info, capacity=2):
    return AdapterRegistry(backend, root=root, max_rank=8, capacity=capacity, base=base_info)


def test_discovers_100_adapters_in_well_under_a_second(tmp_path, base_info, fake_backend):
    root = tmp_path / "adapters"
    for i in range(100):
        make_adapter(root, f"a{i:03d}", model_py=OUTPUT_FORMATTER if i % 10 == 0 else None)
    (root / "not-an-adapter").mkdir()
    reg = registry(root, fake_backend, base_info)
    start = time.perf_counter()
    ok, failed = reg.discover()
    elapsed = time.perf_counter() - start
    assert len(ok) == 100 and not failed
    assert elapsed < 0.5, elapsed
    assert fake_backend.loads == []  # nothing loaded at registration
    assert reg.get("a010").formatters.response_output is not None


def test_broken_adapter_fails_alone(tmp_path, base_info, fake_backend):
    root = tmp_path / "adapters"
    make_adapter(root, "good")
    make_adapter(root, "bad-script", model_py="raise RuntimeError('boom')\n")
    make_adapter(root, "too-big", r=16)
    make_adapter(root, "bad\tname")  # not printable
    reg = registry(root, fake_backend, base_info)
    ok, failed = reg.discover()
    assert ok == ["good"]
    assert set(failed) == {"bad-script", "too-big", "bad\tname"}
    assert "boom" in failed["bad-script"]
    assert "bad-script" not in reg.adapters  # no half-registered state
    with pytest.raises(AdapterUnavailable, match="failed to register.*boom"):
        reg.get("bad-script")
    with pytest.raises(AdapterNotFound, match="'nope' not found"):
        reg.get("nope")


async def test_concurrent_first_calls_load_once(tmp_path, base_info):
    backend = FakeBackend(delay=0.05)
    make_adapter(tmp_path / "ad", "x")
    reg = registry(tmp_path / "ad", backend, base_info)
    reg.discover()
    leases = await asyncio.gather(*(reg.acquire("x") for _ in range(8)))
    assert backend.loads == ["x"]
    assert reg.get("x").in_flight == 8
    for lease in leases:
        await lease.release()
    await (await reg.acquire("x")).release()
    assert backend.loads == ["x"] and reg.get("x").loads == 1


async def test_lru_eviction_and_transparent_reload(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    for n in "abc":
        make_adapter(root, n)
    reg = registry(root, fake_backend, base_info, capacity=2)
    reg.discover()
    for n in ["a", "b", "a", "c"]:  # c evicts b (a was used more recently)
        await (await reg.acquire(n)).release()
    assert fake_backend.unloads == ["b"]
    assert set(fake_backend.loaded) == {"a", "c"}
    await (await reg.acquire("b")).release()  # b reloads, evicting a
    assert fake_backend.loads == ["a", "b", "c", "b"] and fake_backend.unloads == ["b", "a"]
    assert reg.get("b").loads == 2


async def test_busy_and_pinned_adapters_are_not_evicted(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    for n in "abc":
        make_adapter(root, n)
    reg = registry(root, fake_backend, base_info, capacity=1)
    reg.discover()
    lease_a = await reg.acquire("a")  # in flight
    await (await reg.acquire("b")).release()
    assert "a" in fake_backend.loaded and fake_backend.unloads == []
    await lease_a.release()
    await (await reg.acquire("c")).release()
    assert fake_backend.unloads and "c" in fake_backend.loaded

    reg2 = registry(root, FakeBackend(), base_info, capacity=1)
    reg2.register("p", make_adapter(tmp_path / "other", "p"), pin=True)
    reg2.allowed_roots = []
    await (await reg2.acquire("p")).release()
    reg2.register("q", make_adapter(tmp_path / "other", "q"))
    await (await reg2.acquire("q")).release()
    assert "p" in reg2.backend.loaded and reg2.backend.pins == ["p"]


async def test_delete_waits_for_requests_in_flight(tmp_path, base_info, fake_backend):
    make_adapter(tmp_path / "ad", "x")
    reg = registry(tmp_path / "ad", fake_backend, base_info)
    reg.discover()
    lease = await reg.acquire("x")
    await reg.remove("x")
    with pytest.raises(AdapterNotFound):
        reg.get("x")
    assert fake_backend.unloads == []  # still serving the request in flight
    await lease.release()
    assert fake_backend.unloads == ["x"]


async def test_add_validates_src_and_name(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    root.mkdir()
    make_adapter(root, "inside")
    outside = make_adapter(tmp_path / "elsewhere", "outside")
    (root / "link").symlink_to(outside)
    reg = registry(root, fake_backend, base_info)
    with pytest.raises(AdapterInvalid, match="outside the allowed adapter root"):
        await reg.add("o", str(outside))
    with pytest.raises(AdapterInvalid, match="outside the allowed adapter root"):
        await reg.add("o", str(root / "link"))
    with pytest.raises(AdapterInvalid, match="outside the allowed adapter root"):
        await reg.add("o", "../elsewhere/outside")
    with pytest.raises(AdapterInvalid, match="only local directories and s3:// URLs"):
        await reg.add("o", "https://example.com/x")
    with pytest.raises(AdapterInvalid, match="invalid adapter name"):
        await reg.add("../x", "inside")
    with pytest.raises(AdapterInvalid, match="base model's name"):
        await reg.add("tiny-base", "inside")
    entry = await reg.add("mine", "inside", preload=True)
    assert entry.resident and fake_backend.loads == ["mine"]
    with pytest.raises(AdapterConflict):
        await reg.add("mine", "inside")
    make_adapter(root, "script", model_py="import nope_nope\n")
    with pytest.raises(FormatterError):
        await reg.add("script", "script")
    assert "script" not in reg.adapters


async def test_failed_load_is_a_failed_dependency(tmp_path, base_info):
    backend = FakeBackend(fail={"x"})
    make_adapter(tmp_path / "ad", "x")
    reg = registry(tmp_path / "ad", backend, base_info)
    reg.discover()
    with pytest.raises(AdapterUnavailable, match="engine refused x"):
        await reg.acquire("x")
    assert reg.get("x").in_flight == 0 and not reg.get("x").resident


async def test_delete_then_register_same_name_while_old_requests_finish(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "x")
    make_adapter(root, "x2")
    reg = registry(root, fake_backend, base_info)
    reg.discover()
    old = await reg.acquire("x")
    old_handle = old.entry.handle
    await reg.remove("x")
    await reg.add("x", "x2")  # same name, other weights, while the old request still runs
    new = await reg.acquire("x")
    assert new.entry is not old.entry and new.entry.handle is not old_handle
    await old.release()  # the old engine copy goes; the new one stays resident and listed
    assert fake_backend.loaded["x"] is new.entry.handle and new.entry.resident
    assert reg._lru["x"] is new.entry
    await new.release()


async def test_fingerprint_follows_the_weights(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    make_adapter(root, "a")
    make_adapter(root, "b", r=4)
    reg = registry(root, fake_backend, base_info)
    reg.discover()
    a = await reg.acquire("a")
    b = await reg.acquire("b")
    assert a.entry.fingerprint and a.entry.fingerprint != b.entry.fingerprint
    assert a.entry.cache_identity() != b.entry.cache_identity()
    await a.release()
    await b.release()


def test_discover_refuses_symlinks_out_of_the_root(tmp_path, base_info, fake_backend):
    root = tmp_path / "ad"
    root.mkdir()
    outside = make_adapter(tmp_path / "elsewhere", "outside")
    (root / "linked").symlink_to(outside)
    inner = make_adapter(root, "files-out")
    (inner / "adapter_model.safetensors").unlink()
    (inner / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    make_adapter(root, "fine")
    reg = registry(root, fake_backend, base_info)
    ok, failed = reg.discover()
    assert ok == ["fine"]
    assert "outside the allowed adapter root" in failed["linked"]
    assert "links outside" in failed["files-out"]


async def test_a_rebuilt_engine_keeps_every_registration_and_loads_again_on_next_use(tmp_path, base_info, fake_backend):
    """After the engine died and was rebuilt in-process, the registry (and what was registered)
    stays; nothing is resident in the new engine, so the next use loads through the new backend."""
    root = tmp_path / "ad"
    for n in "ab":
        make_adapter(root, n)
    reg = registry(root, fake_backend, base_info, capacity=2)
    reg.discover()
    await (await reg.acquire("a")).release()
    assert reg.get("a").resident
    rebuilt = FakeBackend()
    reg.engine_replaced(rebuilt)
    assert set(reg.adapters) == {"a", "b"}
    assert not reg.get("a").resident and reg.describe()[0]["status"] == "registered"
    await (await reg.acquire("a")).release()
    assert rebuilt.loads == ["a"] and fake_backend.unloads == []  # the dead engine is not asked to unload
    assert reg.get("a").loads == 2
