"""A CPU engine under a CPU quota binds as many OpenMP threads as the quota pays for."""

from __future__ import annotations

from lmi_server import cpu_quota as q


def test_cgroup_v2_quota_is_read(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert q.cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert q.cgroup_cpu_quota(tmp_path) is None


def test_cgroup_v1_quota_is_read(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert q.cgroup_cpu_quota(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert q.cgroup_cpu_quota(tmp_path) is None
    assert q.cgroup_cpu_quota(tmp_path / "absent") is None


def test_a_quota_below_the_mask_binds_that_many_cores_from_the_top():
    value, note = q.quota_binding(list(range(16)), 4.0)
    assert value == "12,13,14,15" and "4 CPUs" in note and "16 CPUs" in note
    assert q.quota_binding(list(range(16)), 4.9)[0] == "12,13,14,15"  # whole cores only
    assert q.quota_binding([0, 1], 0.5)[0] == "1"  # at least one core


def test_workers_get_their_own_cores():
    assert q.quota_binding(list(range(16)), 4.0, world_size=2)[0] == "12,13|14,15"


def test_no_binding_where_the_quota_covers_the_mask():
    assert q.quota_binding([0, 1], None) is None
    assert q.quota_binding([0, 1], 2.0) is None
    assert q.quota_binding([0, 1], 8.0) is None


def test_the_environment_and_its_note(tmp_path, monkeypatch):
    monkeypatch.delenv(q.BIND_ENV, raising=False)
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    notes: list[str] = []
    assert q.omp_environment(1, notes, root=tmp_path, allowed=[0, 1, 2, 3]) == {q.BIND_ENV: "3"}
    assert notes and "cpu.max" in notes[0]
    monkeypatch.setenv(q.BIND_ENV, "0-1")
    assert q.omp_environment(1, [], root=tmp_path, allowed=[0, 1, 2, 3]) == {}  # the user's binding wins
