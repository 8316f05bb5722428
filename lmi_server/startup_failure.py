"""Why the engine could not start and what to do about it, as one line.

Why: a start-up failure reaches this process as an exception, often only vLLM's "Engine core
initialization failed. See root cause above." while the root cause (a truncated weight file, too
little /dev/shm) was logged by one of vLLM's engine processes (`engine_errors` hands those errors
over). An operator, or the platform that shows the container's last log line, needs the cause and
the fix in one line: known causes map to a fix here; anything else is named by its error's last
line and points at the log above it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lmi_server.host_requirements import MIN_NVIDIA_DRIVER, SHM_FIX

MAX_DETAIL_CHARS = 300


@dataclass(frozen=True)
class Context:
    """What a fix may need to say: the vLLM build ("cuda", "cpu" or None), the model and the
    start-up timeout in force."""

    build: str | None = None
    model: str | None = None
    loading_timeout_s: float | None = None


@dataclass(frozen=True)
class StartupFailure:
    name: str  # the known cause's name, "unknown" otherwise
    cause: str
    fix: str | None  # None: unknown cause, the log above tells more
    detail: str  # the error line the cause was recognised from

    @property
    def known(self) -> bool:
        return self.fix is not None

    def line(self) -> str:
        if self.fix is None:
            return f"engine start-up failed: {self.detail}; see the log above"
        return f"engine start-up failed: {self.cause} ({self.detail}); fix: {self.fix}"


@dataclass(frozen=True)
class KnownCause:
    name: str
    patterns: tuple[str, ...]
    cause: Callable[[Context], str]
    fix: Callable[[Context], str]

    def matches(self, text: str) -> bool:
        return any(re.search(p, text, re.IGNORECASE) for p in self.patterns)


def _memory_fix(ctx: Context) -> str:
    knob = "option.cpu_kv_cache_space" if ctx.build == "cpu" else "option.gpu_memory_utilization"
    return (
        f"give the server more memory (the container's memory limit), or ask for less: a smaller "
        f"option.max_model_len or KV cache ({knob}), a smaller model or dtype"
    )


def _no_device_cause(ctx: Context) -> str:
    if ctx.build == "cpu":
        return "vLLM found no device it can run on"
    return "no NVIDIA GPU is usable by this process, and this is vLLM's GPU build (CUDA 13.0 wheels)"


def _no_device_fix(ctx: Context) -> str:
    if ctx.build == "cpu":
        return "run the CPU image on an x86-64 or Arm host (vLLM's CPU build)"
    return (
        f"run on a host with an NVIDIA GPU and NVIDIA driver R{MIN_NVIDIA_DRIVER} or newer, give the container "
        "its GPUs (docker run --gpus all with the NVIDIA container toolkit; on Kubernetes an nvidia.com/gpu "
        "limit), or use the CPU image"
    )


def _model(ctx: Context) -> str:
    return f" ({ctx.model})" if ctx.model else ""


# Checked in order; the first cause one of the error lines matches wins.
CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        "nvidia_driver_too_old",
        (r"CUDA driver version is insufficient", r"NVIDIA driver on your system is too old", r"cudaErrorInsufficientDriver"),
        lambda ctx: "the NVIDIA driver is too old for vLLM's CUDA 13.0 wheels",
        lambda ctx: f"install NVIDIA driver R{MIN_NVIDIA_DRIVER} or newer on the host",
    ),
    KnownCause(
        "no_accelerator",
        (r"Failed to infer device type", r"No CUDA GPUs are available", r"Found no NVIDIA driver",
         r"no CUDA-capable device", r"cudaErrorNoDevice"),
        _no_device_cause,
        _no_device_fix,
    ),
    KnownCause(
        "shared_memory",
        (r"Insufficient space in /dev/shm", r"/dev/shm.*No space left on device", r"No space left on device.*/dev/shm"),
        lambda ctx: "too little shared memory (/dev/shm) for vLLM's engine processes",
        lambda ctx: SHM_FIX,
    ),
    KnownCause(
        "kv_cache_too_small",
        (r"To serve at least one request with the model's max seq len",
         r"larger than the maximum number of tokens that can be stored in KV cache"),
        lambda ctx: "the KV cache cannot hold one request of option.max_model_len tokens",
        lambda ctx: "lower option.max_model_len, or give the KV cache more memory ("
        + ("option.cpu_kv_cache_space" if ctx.build == "cpu" else "option.gpu_memory_utilization") + ")",
    ),
    KnownCause(
        "killed",
        (r"Failed core proc\(s\): \{[^}]*:\s*-9\b", r"died with exit code -9"),
        lambda ctx: "an engine process was killed (SIGKILL) while it started, most likely by the kernel's "
        "out-of-memory killer",
        _memory_fix,
    ),
    KnownCause(
        "out_of_memory",
        (r"OutOfMemoryError", r"out of memory", r"\bMemoryError\b", r"Cannot allocate memory", r"std::bad_alloc",
         r"No available memory for the cache blocks", r"less than desired CPU memory utilization"),
        lambda ctx: "out of memory while the engine started",
        _memory_fix,
    ),
    KnownCause(
        "weights_unreadable",
        (r"PermissionError", r"Permission denied"),
        lambda ctx: "a file the engine needs cannot be read by this process" + _model(ctx),
        lambda ctx: "make the model directory readable by the server's user (chmod -R a+rX on it, or run as its "
        "owner), and the cache directories (HF_HOME, VLLM_CACHE_ROOT) writable",
    ),
    KnownCause(
        "weights_missing",
        (r"Cannot find any model weights",),
        lambda ctx: "the model directory holds no weights vLLM can load" + _model(ctx),
        lambda ctx: "put the model's *.safetensors files into the model directory, or point option.model_id "
        "at a complete model",
    ),
    KnownCause(
        "weights_corrupt",
        (r"SafetensorError", r"Error while deserializing header", r"HeaderTooLarge", r"MetadataIncompleteBuffer",
         r"InvalidHeader", r"file not fully covered", r"PytorchStreamReader failed", r"invalid load key",
         r"UnpicklingError"),
        lambda ctx: "the model's weights are corrupt or truncated" + _model(ctx),
        lambda ctx: "copy or download the model again and check that every weight file is complete (its size "
        "or checksum against the source)",
    ),
)


def one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def exception_lines(exc: BaseException) -> list[str]:
    """`Type: message` of the exception and of the ones it was raised from (outermost first)."""
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current)
        lines.append(one_line(f"{type(current).__name__}: {message}" if message else type(current).__name__))
        current = current.__cause__ or current.__context__
    return lines


def _timed_out(exc: BaseException | None) -> bool:
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc)


def diagnose(exc: BaseException | None, engine_errors: Iterable[str] = (), ctx: Context = Context()) -> StartupFailure:
    """The cause of a failed start, from this process's exception and the errors vLLM's engine
    processes reported (in the order they were reported: the first is usually the root cause)."""
    reported = [one_line(e) for e in engine_errors if e and str(e).strip()]
    own = exception_lines(exc) if exc is not None else []
    if _timed_out(exc):
        limit = f"{ctx.loading_timeout_s:.0f} s" if ctx.loading_timeout_s else "its limit"
        return StartupFailure(
            "loading_timeout",
            f"the engine did not start within option.model_loading_timeout ({limit})",
            "raise option.model_loading_timeout (SAGEMAKER_STARTUP_TIMEOUT on SageMaker), or see in the log "
            "above which step was still running",
            reported[0] if reported else "TimeoutError",
        )
    for text in [*reported, *own]:
        for known in CAUSES:
            if known.matches(text):
                return StartupFailure(known.name, known.cause(ctx), known.fix(ctx), text)
    detail = reported[0] if reported else (own[0] if own else "unknown error")
    return StartupFailure("unknown", "the engine failed to start", None, detail)

