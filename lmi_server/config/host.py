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
