"""The CPU engine's OpenMP threads, fitted to the container's CPU quota (cgroup `cpu.max`).

Why: vLLM's CPU worker binds one OpenMP thread to each core of its affinity mask (less the cores it
reserves for the scheduler). A container limited by a quota (`docker run --cpus=2`, Kubernetes
`resources.limits.cpu`, one copy of a SageMaker Inference Component with its share of the
instance's CPUs) still sees every core of the host in its mask, so vLLM started a thread per host
core; the kernel then throttles the group to its quota, and OpenMP threads that wait on each other
in spin loops stall whole engine steps. Here, where the quota is smaller than the mask, the threads
are bound to as many cores of the mask as the quota pays for (VLLM_CPU_OMP_THREADS_BIND, vLLM's own
setting), and the start-up notes say so. A binding the user set wins (`Runtime.apply_environment`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup may use (cpu.max quota / period; cgroup v1's
    cfs_quota_us / cfs_period_us); None when unlimited or unknown."""
    try:
        quota, _, period = (root / "cpu.max").read_text().split()[:2] + [""]
        if quota == "max":
            return None
        return int(quota) / int(period or 100000)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def quota_binding(allowed: Sequence[int], quota: float | None, world_size: int = 1) -> tuple[str, str] | None:
    """(VLLM_CPU_OMP_THREADS_BIND value, note) when the quota is smaller than the affinity mask;
    None when vLLM's own binding already fits. Cores: floor(quota) (a thread on a fraction of a core
    is throttled mid-step), at least one per worker, taken from the top of the mask (vLLM reserves
    the lowest cores of a node for its scheduler process), split evenly between workers."""
    cpus = sorted(allowed)
    if quota is None or quota >= len(cpus):
        return None
    cores = max(world_size, int(quota))
    if cores >= len(cpus):
        return None
    chosen = cpus[-cores:]
    per = len(chosen) // world_size
    groups = [chosen[i * per:(i + 1) * per] for i in range(world_size)]
    value = "|".join(",".join(str(c) for c in group) for group in groups)
    note = (f"CPU quota {quota:g} CPUs (cgroup cpu.max) under {len(cpus)} CPUs in the affinity mask: the engine's "
            f"OpenMP threads bound to {len(chosen)} of them ({BIND_ENV}={value}; set it to choose)")
    return value, note


def omp_environment(world_size: int = 1, notes: list[str] | None = None, *,
                    root: Path = Path("/sys/fs/cgroup"), allowed: Sequence[int] | None = None) -> dict[str, str]:
    """{VLLM_CPU_OMP_THREADS_BIND: ...} for a CPU engine under a quota smaller than its mask, else {}."""
    if os.environ.get(BIND_ENV):
        return {}
    mask = sorted(os.sched_getaffinity(0)) if allowed is None else list(allowed)
    found = quota_binding(mask, cgroup_cpu_quota(root), world_size)
    if found is None:
        return {}
    value, note = found
    if notes is not None:
        notes.append(note)
    return {BIND_ENV: value}
