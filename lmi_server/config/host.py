"""Small, dependency-free host probes used while resolving configuration."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


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
