"""The disk tier's size limit across restarts: files of earlier runs count, oldest out first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lmi_server.kvcache.disk_budget import DiskBudgetKeeper, sweep
from lmi_server.kvcache.mp_server import MPServerSupervisor, supervisor_for_plan
from lmi_server.kvcache.plan import CacheTiers, DiskTier, KVCachePlan


def chunk(directory: Path, name: str, size: int, age_s: int) -> Path:
    path = directory / f"{name}.data"
    path.write_bytes(b"k" * size)
    t = 1_700_000_000 - age_s
    os.utime(path, (t, t))
    return path


def test_sweep_removes_oldest_chunks_until_within_limit(tmp_path):
    old = chunk(tmp_path, "m-1@0x0@0@aa", 400, age_s=300)
    middle = chunk(tmp_path, "m-1@0x0@0@bb", 400, age_s=200)
    new = chunk(tmp_path, "m-2@0x0@0@cc", 400, age_s=100)
    (tmp_path / "notes.txt").write_bytes(b"x" * 5000)  # not a chunk: neither counted nor removed
    result = sweep(tmp_path, limit_bytes=900)
    assert (result.removed_files, result.removed_bytes, result.files, result.bytes) == (1, 400, 2, 800)
    assert not old.exists() and middle.exists() and new.exists()
    assert (tmp_path / "notes.txt").exists()


def test_sweep_within_limit_removes_nothing_and_counts_subdirectories(tmp_path):
    sub = tmp_path / "ns"
    sub.mkdir()
    chunk(sub, "a", 100, age_s=10)
    chunk(tmp_path, "b", 100, age_s=5)
    result = sweep(tmp_path, limit_bytes=200)
    assert (result.files, result.bytes, result.removed_files) == (2, 200, 0)


def test_keeper_trims_what_an_earlier_run_left_at_start_and_later(tmp_path):
    for i in range(10):
        chunk(tmp_path, f"run1-{i}", 100, age_s=1000 - i)
    keeper = DiskBudgetKeeper(tmp_path, limit_bytes=500, interval_s=0.05)
    first = keeper.start()
    try:
        assert (first.removed_files, first.files, first.bytes) == (5, 5, 500)
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"run1-{i}.data" for i in range(5, 10)]
        for i in range(3):  # this run stores more: the periodic sweep trims the oldest again
            chunk(tmp_path, f"run2-{i}", 100, age_s=10 - i)
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(list(tmp_path.iterdir())) > 5:
            time.sleep(0.05)
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["run1-8.data", "run1-9.data", "run2-0.data", "run2-1.data", "run2-2.data"]
    finally:
        keeper.stop()


def plan_with_disk(tmp_path, size):
    tiers = CacheTiers(
        chunk_size=256, l1_bytes=2**30, eviction_policy="LRU", disk=DiskTier(tmp_path, size, False),
        remote=None, host="localhost", port=1, metrics_port=2, transfer_mode="engine_driven",
    )
    return KVCachePlan(mode="mp", kv_transfer_config={}, server_argv=[sys.executable, "-c", "pass"],
                       env={}, reasons=[], source="auto", tiers=tiers)


def test_supervisor_for_a_disk_tier_keeps_its_limit(tmp_path):
    sup = supervisor_for_plan(plan_with_disk(tmp_path, 1234))
    assert isinstance(sup, MPServerSupervisor)
    assert sup.disk_budget is not None and sup.disk_budget.limit_bytes == 1234
    assert sup.disk_budget.directory == tmp_path
    assert supervisor_for_plan(plan_with_disk(tmp_path, None)).disk_budget is None


def test_supervisor_start_sweeps_before_the_server_runs(tmp_path):
    for i in range(4):
        chunk(tmp_path, f"c{i}", 100, age_s=100 - i)
    sup = MPServerSupervisor(
        [sys.executable, "-c", "import time; time.sleep(30)"], {}, port=1, probe=lambda h, p: True,
        disk_budget=DiskBudgetKeeper(tmp_path, 200), watchdog=False,
    )
    sup.start()
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c2.data", "c3.data"]
    finally:
        sup.stop()
