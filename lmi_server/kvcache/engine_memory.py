"""The engine's own KV-cache size on CPU hosts when the user gives none.

Why: with no size given, vLLM's CPU worker asks for `gpu_memory_utilization` (0.92) x the *total*
memory of the NUMA node it binds to and refuses to start unless that much is free, which fails on
any host where something else uses more than 8 % of that node (and on some hosts the node is far
smaller than the machine, and its size moves). So the server computes the size from what the
engine will really get and passes it as `kv_cache_memory_bytes`, which skips that check.

The rule, every step stated in `reasons`:
  usable   = min(free memory of the node vLLM binds to, MemAvailable, cgroup limit - usage)
  headroom = usable - model weights - LMCache CPU tier (when configured) - reserve
             (reserve = max(1 GiB, 10 % of usable): activations, Python, tokenizer, HTTP)
  KV       = min(half the headroom, the working set max_num_seqs x max_model_len, 4 GiB)
It must hold one full `max_model_len` sequence, otherwise start-up fails naming the options.
Half, not all, of the headroom: a node's free memory moves while the server runs. The 4 GiB
ceiling is vLLM's former CPU default: every GiB is allocated and zeroed at start-up (about 4 s per
GiB on the development machine), and a CPU decodes few sequences at once; set
option.cpu_kv_cache_space for more.

Pure functions over `MemoryFacts`, so unit tests describe any host; `probe_memory()` reads
this machine (/sys/devices/system/node, /proc/meminfo, cgroup v2 or v1) without importing torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
RESERVE_MIN_BYTES = 1 * GIB
RESERVE_FRACTION = 0.10
HEADROOM_SHARE = 0.5
MAX_DEFAULT_BYTES = 4 * GIB
ROUND_BYTES = 64 * MIB
SIZE_OPTIONS = "option.cpu_kv_cache_space (GiB) or option.kv_cache_memory_bytes"


class EngineMemoryError(ValueError):
    """Too little memory for the engine's KV cache; the message names the options to set."""


@dataclass(frozen=True)
class MemoryFacts:
    """Memory the engine worker can use (bytes). None where the host does not tell."""

    mem_available: int
    mem_total: int
    node_id: int | None = None
    node_total: int | None = None
    node_available: int | None = None
    cgroup_limit: int | None = None
    cgroup_usage: int | None = None


@dataclass(frozen=True)
class EngineMemoryPlan:
    kv_cache_bytes: int
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kv_cache_memory_bytes": self.kv_cache_bytes, "kv_cache_gib": round(self.kv_cache_bytes / GIB, 2), "reasons": self.reasons}


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def usable_memory(facts: MemoryFacts) -> tuple[int, list[str]]:
    """The smallest of the limits that apply to the engine worker, with one reason per limit."""
    candidates: list[tuple[int, str]] = [(facts.mem_available, f"MemAvailable {_gib(facts.mem_available)}")]
    if facts.node_available is not None:
        total = f" of {_gib(facts.node_total)}" if facts.node_total else ""
        candidates.append(
            (facts.node_available, f"free on NUMA node {facts.node_id} (the engine worker's) {_gib(facts.node_available)}{total}")
        )
    if facts.cgroup_limit is not None:
        left = max(0, facts.cgroup_limit - (facts.cgroup_usage or 0))
        candidates.append((left, f"cgroup limit {_gib(facts.cgroup_limit)} - usage {_gib(facts.cgroup_usage or 0)} = {_gib(left)}"))
    usable, _ = min(candidates)
    reasons = ["usable memory = min(" + ", ".join(text for _, text in candidates) + f") = {_gib(usable)}"]
    return usable, reasons


def plan_cpu_kv_cache(
    facts: MemoryFacts,
    *,
    weight_bytes: int | None,
    lmcache_cpu_bytes: int = 0,
    bytes_per_token: int | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
) -> EngineMemoryPlan:
    """The default KV size (see the module docstring); raises EngineMemoryError when too small."""
    usable, reasons = usable_memory(facts)
    weights = weight_bytes or 0
    reserve = max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * usable))
    headroom = usable - weights - lmcache_cpu_bytes - reserve
    parts = [f"{_gib(usable)} usable", f"weights {_gib(weights)}" + ("" if weight_bytes else " (unknown, taken as 0)")]
    if lmcache_cpu_bytes:
        parts.append(f"LMCache CPU tier {_gib(lmcache_cpu_bytes)}")
    parts.append(f"reserve {_gib(reserve)} (max of 1 GiB and 10 %)")
    reasons.append("headroom = " + " - ".join(parts) + f" = {_gib(headroom)}")
    limits: list[tuple[int, str]] = [(int(HEADROOM_SHARE * max(0, headroom)), "half the headroom (free memory moves)")]
    if bytes_per_token and max_model_len and max_num_seqs:
        working_set = bytes_per_token * max_model_len * max_num_seqs
        limits.append((working_set, f"working set {max_num_seqs} x {max_model_len:,} tokens x {bytes_per_token:,} B"))
    limits.append((MAX_DEFAULT_BYTES, "default ceiling on CPU hosts"))
    kv, why = min(limits)
    kv = max(0, kv // ROUND_BYTES * ROUND_BYTES) or kv
    reasons.append(
        "engine KV cache = min(" + ", ".join(f"{_gib(b)} {t}" for b, t in limits) + f") = {_gib(kv)} ({why})"
    )
    floor = bytes_per_token * max_model_len if bytes_per_token and max_model_len else 256 * MIB
    floor_text = (
        f"one {max_model_len:,}-token sequence ({_gib(floor)})" if bytes_per_token and max_model_len else f"{_gib(floor)}"
    )
    if kv < floor:
        raise EngineMemoryError(
            f"too little memory for the engine's KV cache: {_gib(kv)} left, at least {floor_text} needed "
            f"({'; '.join(reasons)}). Free memory, lower option.max_model_len, or set {SIZE_OPTIONS}"
        )
    reasons.append(f"holds {kv // bytes_per_token:,} tokens" if bytes_per_token else "bytes per token unknown")
    return EngineMemoryPlan(kv_cache_bytes=int(kv), reasons=reasons)


# ---------------------------------------------------------------------------------------------
# Probing this machine
# ---------------------------------------------------------------------------------------------

NODE_ROOT = Path("/sys/devices/system/node")


def _parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def read_node_meminfo(path: Path) -> tuple[int, int]:
    """(total, available) of one NUMA node, available counted as vLLM's CPU worker counts it."""
    values: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            values[parts[2].rstrip(":")] = int(parts[3]) * 1024
    available = sum(values.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
    return values.get("MemTotal", 0), available


def worker_node(node_root: Path = NODE_ROOT, allowed_cpus: set[int] | None = None) -> int | None:
    """The NUMA node of the first CPU this process may run on (the node vLLM's worker binds to)."""
    if not node_root.is_dir():
        return None
    cpus = allowed_cpus if allowed_cpus is not None else set(os.sched_getaffinity(0))
    if not cpus:
        return None
    first = min(cpus)
    for node_dir in sorted(node_root.glob("node[0-9]*")):
        try:
            if first in _parse_cpulist((node_dir / "cpulist").read_text()):
                return int(node_dir.name[4:])
        except (OSError, ValueError):
            continue
    return None


def read_cgroup(root: Path = Path("/sys/fs/cgroup")) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup; (None, None) when unlimited or unknown."""
    for limit_name, usage_name in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            raw = (root / limit_name).read_text().strip()
        except OSError:
            continue
        if raw == "max":
            return None, None
        limit = int(raw)
        if limit >= 1 << 60:  # cgroup v1 spells "unlimited" as a huge number
            return None, None
        try:
            usage = int((root / usage_name).read_text().strip())
        except (OSError, ValueError):
            usage = None
        return limit, usage
    return None, None


def probe_memory(meminfo: str = "/proc/meminfo", node_root: Path = NODE_ROOT, cgroup_root: Path = Path("/sys/fs/cgroup")) -> MemoryFacts:
    from lmi_server.kvcache.host import read_meminfo

    available, total = read_meminfo(meminfo)
    node = worker_node(node_root)
    node_total = node_available = None
    if node is not None:
        try:
            node_total, node_available = read_node_meminfo(node_root / f"node{node}" / "meminfo")
        except OSError:
            node = None
    limit, usage = read_cgroup(cgroup_root)
    return MemoryFacts(
        mem_available=available, mem_total=total, node_id=node, node_total=node_total,
        node_available=node_available, cgroup_limit=limit, cgroup_usage=usage,
    )
