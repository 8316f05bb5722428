"""Facts about the machine that the KV-cache plan depends on, and the checks of a cache directory.

`HostFacts` is a plain dataclass so tests can describe any machine (an 8-GPU server, a laptop)
without having one; `probe_host()` fills it from this machine without importing torch
(`/proc/meminfo`, `statvfs`, `nvidia-smi` when present). `check_cache_dir()` turns the faults
a disk tier can meet (missing, read-only, full, O_DIRECT refused) into an error or a warning
before the cache server starts, instead of a stream of failed writes afterwards.
"""

from __future__ import annotations

import errno
import mmap
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lmi_server.config.host import nvidia_smi_gpus
from lmi_server.config.weights import safetensors_bytes

GIB = 1 << 30


class CacheDirError(RuntimeError):
    """The disk tier's directory cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class GPUInfo:
    count: int
    memory_bytes_each: int
    name: str = "GPU"


@dataclass(frozen=True)
class DiskInfo:
    path: Path
    free_bytes: int
    block_size: int
    fs_type: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What the planner needs to know about the machine (all sizes in bytes)."""

    available_ram_bytes: int
    total_ram_bytes: int
    gpu: GPUInfo | None = None
    disk: DiskInfo | None = None
    model_weight_bytes: int | None = None
    """Sum of the model's safetensors files; None when unknown (e.g. a hub id not yet downloaded)."""
    model_weight_source: str = "unknown"
    tensor_parallel: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)
    shm_free_bytes: int | None = None
    """Free space in /dev/shm (where the CPU tier can live, `mp_shm`); None when there is none."""

    @property
    def platform(self) -> str:
        """'cuda' when a GPU was seen, else 'cpu' (decides LMCache's transfer mode)."""
        return "cuda" if self.gpu is not None and self.gpu.count > 0 else "cpu"


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes."""
    values: dict[str, int] = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * 1024
    return values.get("MemAvailable", values.get("MemFree", 0)), values.get("MemTotal", 0)


def probe_gpus(timeout_s: float = 5.0) -> GPUInfo | None:
    """GPU count and memory from `nvidia-smi`; None without one (no torch import)."""
    rows = nvidia_smi_gpus(timeout_s)
    if not rows:
        return None
    return GPUInfo(count=len(rows), memory_bytes_each=min(mib for _, mib in rows) * (1 << 20), name=rows[0][0])


def _fs_type(path: Path) -> str | None:
    """Filesystem type of the mount holding `path` (longest matching mount point in /proc/mounts)."""
    try:
        resolved = str(path.resolve())
        best, best_type = "", None
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (resolved == parts[1] or resolved.startswith(parts[1].rstrip("/") + "/")):
                    if len(parts[1]) > len(best):
                        best, best_type = parts[1], parts[2]
        return best_type
    except OSError:
        return None


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def probe_disk(path: Path) -> DiskInfo:
    """Free space and block size of the filesystem that holds (or would hold) `path`."""
    anchor = _nearest_existing(path)
    st = os.statvfs(anchor)
    return DiskInfo(path=path, free_bytes=st.f_bavail * st.f_frsize, block_size=st.f_bsize, fs_type=_fs_type(anchor))


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Bytes an unprivileged process can still write to /dev/shm, or None without one."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def probe_host(
    *,
    model_dir: Path | None = None,
    cache_dir: Path | None = None,
    tensor_parallel: int = 1,
) -> HostFacts:
    """HostFacts for this machine. `model_dir` that is not a local directory leaves the size unknown."""
    available, total = read_meminfo()
    weights = safetensors_bytes(model_dir)
    if weights is not None:
        source = f"sum of safetensors files in {model_dir}"
    elif model_dir is not None and not Path(model_dir).is_dir():
        source = f"unknown: {model_dir} is not a local directory (hub id?)"
    else:
        source = "unknown: no safetensors files found"
    return HostFacts(
        available_ram_bytes=available,
        total_ram_bytes=total,
        gpu=probe_gpus(),
        disk=probe_disk(cache_dir) if cache_dir is not None else None,
        model_weight_bytes=weights,
        model_weight_source=source,
        tensor_parallel=tensor_parallel,
        shm_free_bytes=shm_free_bytes(),
    )


MOUNTED_CACHE_DIR = Path("/mnt/kvcache")
"""Where the auto plan looks for a cache directory when option.lmcache_cache_dir is not set: the
Helm chart mounts its `kvCache` volume here, and `docker run -v VOLUME:/mnt/kvcache` does the same."""


def mounted_cache_dir(path: Path | None = None) -> Path | None:
    """`path` (default `MOUNTED_CACHE_DIR`) when it is an existing directory this process can write
    (a mounted volume), else None. Never created: an image without the volume has no disk tier."""
    path = MOUNTED_CACHE_DIR if path is None else path
    return path if path.is_dir() and os.access(path, os.W_OK | os.X_OK) else None


# ---------------------------------------------------------------------------------------------
# Cache directory checks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheDirCheck:
    path: Path
    free_bytes: int
    block_size: int
    odirect: bool
    """O_DIRECT both asked for and accepted by the filesystem."""
    warnings: tuple[str, ...]


def odirect_supported(directory: Path, block_size: int = 4096) -> bool:
    """Whether the filesystem under `directory` accepts an O_DIRECT write (tmpfs refuses: EINVAL)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = directory / f".lmi-odirect-probe-{uuid.uuid4().hex}"
    buf = mmap.mmap(-1, block_size)  # page-aligned buffer, as O_DIRECT requires
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | flag, 0o600)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    try:
        os.write(fd, buf)
        return True
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        os.close(fd)
        buf.close()
        probe.unlink(missing_ok=True)


def check_cache_dir(path: Path, *, want_odirect: bool, wanted_bytes: int = 0) -> CacheDirCheck:
    """Make sure the disk tier can work in `path`.

    Missing: created (parents too). Cannot be created or is read-only: `CacheDirError`.
    Less free space than `wanted_bytes`: a warning (the tier will fill the disk sooner).
    O_DIRECT refused by the filesystem (tmpfs, some network filesystems): falls back to
    buffered I/O with a warning, because LMCache's fs adapter would otherwise fail every write.
    """
    warnings: list[str] = []
    if path.exists() and not path.is_dir():
        raise CacheDirError(f"LMCache disk path {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheDirError(f"cannot create LMCache disk directory {path}: {e.strerror}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheDirError(f"LMCache disk directory {path} is not writable by uid {os.getuid()}")
    probe = path / f".lmi-write-probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"x")
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise CacheDirError(f"LMCache disk directory {path} is full (no space left on device)") from e
        raise CacheDirError(f"cannot write to LMCache disk directory {path}: {e.strerror}") from e
    finally:
        probe.unlink(missing_ok=True)
    info = probe_disk(path)
    if wanted_bytes and info.free_bytes < wanted_bytes:
        warnings.append(
            f"disk tier asks for {wanted_bytes / GIB:.1f} GiB but {path} has only "
            f"{info.free_bytes / GIB:.1f} GiB free; the cache will fill the disk"
        )
    odirect = False
    if want_odirect:
        odirect = odirect_supported(path, max(info.block_size, 512))
        if not odirect:
            warnings.append(
                f"O_DIRECT refused by the filesystem of {path} ({info.fs_type or 'unknown'}); "
                "falling back to buffered I/O (use_odirect=false)"
            )
    return CacheDirCheck(path=path, free_bytes=info.free_bytes, block_size=info.block_size, odirect=odirect, warnings=tuple(warnings))
