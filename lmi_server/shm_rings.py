"""vLLM's shared-memory message rings, sized to the /dev/shm the host gives.

Why: vLLM 0.32's multiprocess executor (every CPU engine, and GPU engines beyond one worker) makes a
broadcast ring (VLLM_MQ_MAX_CHUNK_BYTES_MB x 10 chunks) and one response ring per worker (24 MiB x
10, a constant in vLLM), and refuses to start unless /dev/shm has room for each in full: 400 MiB
for one worker. Docker's default /dev/shm is 64 MiB and SageMaker hosting offers no setting for it,
so the engine never came up there. The rings are sparse (a running server touches well under 1 MiB
of them) and a message larger than a chunk goes over vLLM's socket instead, so smaller chunks are
correct, only slower for large messages. Here the chunks shrink until the rings fit beside a margin,
the server says so, and only a host where even 1 MiB chunks cannot fit is refused, naming a fix that
exists on the platform it runs on.

The broadcast ring's chunk is vLLM's own setting (VLLM_MQ_MAX_CHUNK_BYTES_MB); the response ring's
is not a setting, so `vllm_plugin` (a `vllm.general_plugins` entry point, loaded in every engine
process before its rings are made) gives vLLM's MessageQueue our chunk size where its caller names
none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmi_server.compat import vllm as compat_vllm

MIB = 1 << 20
CHUNKS = 10
"""Chunks per ring, a constant in vLLM 0.32 (MessageQueue's max_chunks)."""
DEFAULT_BROADCAST_CHUNK_MB = 16
"""VLLM_MQ_MAX_CHUNK_BYTES_MB's default."""
DEFAULT_RESPONSE_CHUNK_MB = 24
"""MessageQueue's default max_chunk_bytes, used for each worker's response ring."""
MIN_CHUNK_MB = 1
MARGIN_BYTES = 8 * MIB
"""Room beside the rings: their metadata, OpenMP's and the loky pool's small files (under 1 MiB seen)."""
RESPONSE_CHUNK_ENV = "LMI_VLLM_RESPONSE_CHUNK_BYTES"
"""Set by the server for its engine processes; read by `vllm_plugin` there."""


@dataclass(frozen=True)
class RingPlan:
    """Chunk sizes for vLLM's rings on this host, and why."""

    workers: int
    broadcast_chunk_mb: int
    response_chunk_mb: int
    free_bytes: int | None
    shrunk: bool

    @property
    def ring_bytes(self) -> int:
        return CHUNKS * MIB * (self.broadcast_chunk_mb + self.workers * self.response_chunk_mb)

    @property
    def need_bytes(self) -> int:
        return self.ring_bytes + MARGIN_BYTES

    def environment(self) -> dict[str, str]:
        """What the engine processes need in their environment for this plan (nothing at vLLM's defaults)."""
        if not self.shrunk:
            return {}
        return {
            "VLLM_MQ_MAX_CHUNK_BYTES_MB": str(self.broadcast_chunk_mb),
            RESPONSE_CHUNK_ENV: str(self.response_chunk_mb * MIB),
        }

    def describe(self) -> str:
        free = "unknown" if self.free_bytes is None else f"{self.free_bytes / MIB:.0f} MiB"
        rings = (f"broadcast {self.broadcast_chunk_mb} MiB x {CHUNKS}, {self.workers} response ring"
                 f"{'s' if self.workers > 1 else ''} {self.response_chunk_mb} MiB x {CHUNKS}")
        if not self.shrunk:
            return f"vLLM's message rings at their defaults ({rings}; /dev/shm {free} free)"
        return (f"/dev/shm has {free} free, less than vLLM's default message rings need: rings shrunk to "
                f"{rings} ({self.need_bytes / MIB:.0f} MiB with margin); a message larger than a chunk "
                "goes over vLLM's socket instead")


class RingsDoNotFit(RuntimeError):
    """Even the smallest rings do not fit in /dev/shm."""


def multiprocess_workers(engine_args: Mapping[str, Any], build: str | None) -> int:
    """Workers of vLLM's multiprocess executor for these engine arguments; 0 when it is not used."""
    tp = max(1, int(engine_args.get("tensor_parallel_size") or 1))
    pp = max(1, int(engine_args.get("pipeline_parallel_size") or 1))
    nodes = max(1, int(engine_args.get("nnodes") or 1))  # a multi-node group: this node's share of the ranks
    workers = max(1, tp * pp // nodes)
    backend = engine_args.get("distributed_executor_backend")
    if backend in ("ray", "external_launcher"):
        return 0
    if build == "cpu" or backend == "mp" or (workers > 1 and backend is None):
        return workers
    return 0


def _env_chunk_mb(env: Mapping[str, str]) -> int | None:
    raw = env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise RingsDoNotFit(f"VLLM_MQ_MAX_CHUNK_BYTES_MB={raw!r} is not a whole number of MiB") from None
    if value < MIN_CHUNK_MB:
        raise RingsDoNotFit(f"VLLM_MQ_MAX_CHUNK_BYTES_MB={raw!r} must be at least {MIN_CHUNK_MB}")
    return value


def plan_rings(engine_args: Mapping[str, Any], build: str | None, free_bytes: int | None,
               env: Mapping[str, str] | None = None, platform: str = "docker") -> RingPlan | None:
    """The rings' chunk sizes for this host (None when the engine makes no rings).

    vLLM's defaults where they fit; otherwise the largest whole MiB chunk, the same for every ring,
    that fits with the margin. A chunk size the user set (VLLM_MQ_MAX_CHUNK_BYTES_MB) is kept."""
    env = os.environ if env is None else env
    workers = multiprocess_workers(engine_args, build)
    if workers == 0:
        return None
    user_chunk = _env_chunk_mb(env)
    default = RingPlan(workers, user_chunk or DEFAULT_BROADCAST_CHUNK_MB, DEFAULT_RESPONSE_CHUNK_MB,
                       free_bytes, shrunk=False)
    if free_bytes is None or default.need_bytes <= free_bytes:
        return default
    room = free_bytes - MARGIN_BYTES
    if user_chunk is not None:
        chunk = (room // (CHUNKS * MIB) - user_chunk) // workers
        broadcast = user_chunk
    else:
        chunk = room // (CHUNKS * MIB * (1 + workers))
        broadcast = min(chunk, DEFAULT_BROADCAST_CHUNK_MB)
    chunk = min(chunk, DEFAULT_RESPONSE_CHUNK_MB)
    if chunk < MIN_CHUNK_MB or broadcast < MIN_CHUNK_MB:
        smallest = RingPlan(workers, user_chunk or MIN_CHUNK_MB, MIN_CHUNK_MB, free_bytes, shrunk=True)
        raise RingsDoNotFit(
            f"/dev/shm has {free_bytes / MIB:.0f} MiB free; vLLM's engine needs at least "
            f"{smallest.need_bytes / MIB:.0f} MiB for its message rings with {workers} worker"
            f"{'s' if workers > 1 else ''} at 1 MiB chunks: {shm_fix(platform, workers)}"
        )
    return RingPlan(workers, broadcast, chunk, free_bytes, shrunk=True)


def platform_of(env: Mapping[str, str] | None = None, *, dockerenv: str = "/.dockerenv") -> str:
    """Where this server runs, for naming a fix that exists there: SageMaker (its variables,
    lmi_server/sagemaker_env.py), Kubernetes, Docker, or a plain host."""
    from lmi_server.sagemaker_env import on_sagemaker

    env = os.environ if env is None else env
    if on_sagemaker(env):
        return "sagemaker"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "kubernetes"
    if os.path.exists(dockerenv):
        return "docker"
    return "host"


def shm_fix(platform: str, workers: int) -> str:
    """The fix for too small a /dev/shm that exists on this platform."""
    fewer = ("lower option.tensor_parallel_degree / option.pipeline_parallel_degree (each worker needs "
             f"a {CHUNKS} MiB ring at least)")
    if platform == "sagemaker":
        return f"SageMaker has no /dev/shm setting: {fewer}" if workers > 1 else (
            "SageMaker has no /dev/shm setting: choose an instance type whose container gets more shared memory")
    if platform == "kubernetes":
        return f"mount an emptyDir with medium: Memory at /dev/shm (the Helm chart's shm.sizeLimit), or {fewer}"
    if platform == "docker":
        return f"run the container with --shm-size=1g (or --ipc=host), or {fewer}"
    return f"remount /dev/shm larger (mount -o remount,size=1g /dev/shm), or {fewer}"


def vllm_plugin() -> None:
    """vLLM general plugin: each MessageQueue made without a chunk size gets the server's (if set)."""
    raw = os.environ.get(RESPONSE_CHUNK_ENV)
    if not raw:
        return
    default_message_queue_chunk(int(raw))


def default_message_queue_chunk(chunk_bytes: int) -> None:
    """vLLM's MessageQueue, made without a max_chunk_bytes, gets `chunk_bytes` (vLLM: 24 MiB)."""
    compat_vllm.default_message_queue_chunk(chunk_bytes)
