"""Small, dependency-free host probes used while resolving configuration."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30


def gpu_count() -> int:
    """Visible NVIDIA GPUs, without importing torch (config must not need an engine)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    devices = [d for d in glob.glob("/dev/nvidia[0-9]*")]
    if devices:
        return len(devices)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs this server may use. A plan must fit the smallest of them, so that is the size kept."""

    count: int
    memory_bytes_each: int | None = None
    name: str | None = None

    def describe(self) -> str:
        """`8 x NVIDIA H100 80GB HBM3 (79.6 GiB each)`, or as much of it as is known."""
        what = f"{self.count} x {self.name or 'GPU'}"
        return what + (f" ({self.memory_bytes_each / GIB:.1f} GiB each)" if self.memory_bytes_each else "")


def nvidia_smi_gpus(timeout_s: float = 5.0) -> list[tuple[str, int]]:
    """(name, memory in MiB) of every GPU `nvidia-smi` lists, in index order; [] without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows: list[tuple[str, int]] = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        try:
            rows.append((name.strip(), int(mib.strip())))
        except ValueError:
            continue
    return rows


def gpu_inventory() -> GpuInventory:
    """Visible GPUs (as `gpu_count`) with the memory of the smallest one from `nvidia-smi`, which
    lists every GPU of the machine: CUDA_VISIBLE_DEVICES given as indices picks the visible ones."""
    count = gpu_count()
    if count == 0:
        return GpuInventory(0)
    rows = nvidia_smi_gpus()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and all(d.isdigit() and int(d) < len(rows) for d in visible):
        rows = [rows[int(d)] for d in visible]
    if not rows:
        return GpuInventory(count)
    name, mib = min(rows, key=lambda r: r[1])
    return GpuInventory(count, mib * MIB, name)


BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 AVX-512 BF16 / AMX; Arm's "bf16" feature


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU computes bfloat16 natively; None when /proc/cpuinfo cannot be read.

    Without it (an AVX2-only x86 host, for instance) PyTorch converts bf16 to fp32 around every
    matrix product, which costs more than it saves."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return bool(BF16_CPU_FLAGS & set(value.split()))
    except OSError:
        return None
    return None
