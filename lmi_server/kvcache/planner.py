"""Auto-config (`option.lmcache_auto_config=true`): size LMCache's tiers from the model and host.

Pure functions: every input is an argument (model `config.json` dict, `EngineFacts`,
`HostFacts`), every number in the result comes with a sentence in `reasons`.

The logic, in order:
1. KV bytes per token from the model (`footprint.kv_footprint`).
2. The engine's own KV capacity: GPU memory x gpu_memory_utilization minus the weights' share
   per GPU, divided by the per-GPU KV bytes per token (GQA heads split over TP ranks up to the
   KV head count; an MLA latent is replicated on every rank). On a CPU host it is the engine's
   KV space (VLLM_CPU_KVCACHE_SPACE). Activation and CUDA-graph memory are ignored, as LMI's
   published figures do; the capacity is therefore a slight over-estimate.
3. Offloading pays only when the expected working set (`max_num_seqs x max_model_len`, or
   `option.lmcache_expected_context_tokens`) exceeds that capacity: below it, vLLM's own prefix
   cache already holds every reusable prefix and LMCache would add copies for nothing.
4. Tier sizes keep at least LMI's reserve: CPU tier = (available RAM - max(2 x model size,
   20 % of RAM)) / TP degree per rank; disk tier likewise from free disk, all of it (the disk tier
   persists, see 5.). LMI runs one
   in-process cache per TP rank; the MP server is one process for all ranks, so its L1 is the
   per-rank share x TP (the same total RAM as LMI). The CPU tier is never made larger than
   the working set needs.
5. A cache directory (option.lmcache_cache_dir, or a volume mounted at /mnt/kvcache) always gets a
   disk tier, even when nothing else would be offloaded: its KV survives restarts and is shared by
   servers of the same KV namespace (`namespace.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmi_server.kvcache.footprint import KVFootprint, kv_footprint
from lmi_server.kvcache.host import GIB, CacheDirError, HostFacts, check_cache_dir
from lmi_server.kvcache.lmcache import (
    choose_shm,
    inprocess_kv_transfer_config,
    mp_kv_transfer_config,
    mp_server_argv,
    process_env,
    require_gpu_for_inprocess,
    transfer_mode_for,
)
from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.plan import CacheTiers, DiskTier, KVCacheConfigError, KVCachePlan, Platform

DEFAULT_CHUNK_SIZE = 256
CPU_CHUNK_TOKENS = 128
"""Chunk size of the auto plan on CPU hosts (rounded to whole engine blocks). A hit loads whole
chunks; the prompt's tail beyond the last whole chunk (up to a chunk) is prefilled, attending to the
whole context, and on a CPU that tail is most of a hit's time (measured, benchmarks/kv_restart.py:
a 3,819-token document's 235-token tail took 0.72 s of its 0.73 s warm hit, 91 tokens 0.30 s).
vLLM's CPU block is 128 tokens, so 128 halves the mean tail; GPU hosts keep LMCache's 256."""
CPU_ENGINE_KV_DEFAULT_BYTES = 4 * GIB
RESERVE_RAM_FRACTION = 0.20
RESERVE_MODEL_MULTIPLE = 2


@dataclass(frozen=True)
class EngineFacts:
    """The engine settings the plan depends on (from the resolved serving config)."""

    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float = 0.9
    engine_kv_cache_bytes: int | None = None
    """Engine KV space when known directly (CPU: VLLM_CPU_KVCACHE_SPACE GiB; GPU: kv_cache_memory_bytes)."""
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    """The engine's KV block size (option.block_size or vLLM's default for the platform)."""
    blend: bool = False
    """option.lmcache_blend: segments are matched in chunks of DEFAULT_CHUNK_SIZE (its measured setting)."""


@dataclass(frozen=True)
class EngineCapacity:
    tokens: int
    budget_bytes: int
    reason: str


@dataclass(frozen=True)
class TierBudget:
    per_rank_bytes: int
    total_bytes: int
    reserve_bytes: int
    reason: str


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n:,} tokens"


def engine_kv_capacity(
    fp: KVFootprint, host: HostFacts, engine: EngineFacts, sequence_tokens: int
) -> EngineCapacity:
    """How many tokens of working set the engine's own KV cache holds."""
    tp = host.tensor_parallel
    weights = host.model_weight_bytes or 0
    # Sliding-window layers cost the engine less per token on long sequences.
    seq = max(1, sequence_tokens)
    engine_bpt = fp.engine_bytes_for_sequence(seq) / seq
    window_note = (
        f" (sliding-window layers make it {engine_bpt:,.0f} B/token for {seq:,}-token sequences)"
        if fp.sliding_window_layers
        else ""
    )
    if engine.engine_kv_cache_bytes is not None:
        budget = engine.engine_kv_cache_bytes
        tokens = int(budget / engine_bpt)
        return EngineCapacity(tokens, budget, f"engine KV cache {_gib(budget)} given / {engine_bpt:,.0f} B per token{window_note} = {_tokens(tokens)}")
    if host.gpu is None:
        budget = CPU_ENGINE_KV_DEFAULT_BYTES
        tokens = int(budget / engine_bpt)
        return EngineCapacity(
            tokens, budget,
            f"CPU host and no engine KV size given: assumed {_gib(budget)} (set VLLM_CPU_KVCACHE_SPACE) / "
            f"{engine_bpt:,.0f} B per token = {_tokens(tokens)}",
        )
    if tp > host.gpu.count:
        raise KVCacheConfigError(f"tensor_parallel_degree {tp} exceeds the {host.gpu.count} GPUs seen")
    usable = int(host.gpu.memory_bytes_each * engine.gpu_memory_utilization)
    per_gpu = usable - weights // tp
    if per_gpu <= 0:
        raise KVCacheConfigError(
            f"model weights ({_gib(weights)}) do not fit {tp} x {_gib(usable)} of GPU memory; raise tensor_parallel_degree"
        )
    shards = fp.tp_shards(tp)
    tokens = int(per_gpu * shards / engine_bpt)
    weights_note = "weights" if host.model_weight_bytes else "weights unknown, taken as 0 (capacity over-estimated)"
    return EngineCapacity(
        tokens, per_gpu * tp,
        f"engine KV capacity: per GPU {_gib(host.gpu.memory_bytes_each)} x {engine.gpu_memory_utilization} - "
        f"{_gib(weights)}/{tp} {weights_note} = {_gib(per_gpu)}; one token costs {engine_bpt / shards:,.0f} B per GPU "
        f"({engine_bpt:,.0f} B split over {shards} of {tp} ranks){window_note} -> {_tokens(tokens)}",
    )


def lmi_tier_budget(free_bytes: int, model_bytes: int | None, tp: int, what: str) -> TierBudget:
    """LMI's rule: free - max(2 x model size, 20 % of free), divided by the TP degree per rank."""
    by_model = RESERVE_MODEL_MULTIPLE * (model_bytes or 0)
    by_fraction = int(RESERVE_RAM_FRACTION * free_bytes)
    reserve = max(by_model, by_fraction)
    per_rank = max(0, (free_bytes - reserve) // tp)
    model_note = f"2 x model {_gib(model_bytes)}" if model_bytes else "model size unknown, so only 20 %"
    return TierBudget(
        per_rank_bytes=per_rank,
        total_bytes=per_rank * tp,
        reserve_bytes=reserve,
        reason=(
            f"{what} budget (LMI rule): {_gib(free_bytes)} - reserve max({model_note}, 20 % = {_gib(by_fraction)}) "
            f"= {_gib(per_rank * tp)}, / TP {tp} = {_gib(per_rank)} per rank"
        ),
    )


def _quantize_gib(n_bytes: int) -> int:
    """Round down to 0.01 GiB so the `--l1-size-gb` value never exceeds the budget."""
    return math.floor(n_bytes / GIB * 100) * GIB // 100


def working_set_tokens(engine: EngineFacts, options: LMCacheOptions) -> tuple[int, str]:
    if options.lmcache_expected_context_tokens:
        n = options.lmcache_expected_context_tokens
        return n, f"working set {_tokens(n)} (option.lmcache_expected_context_tokens)"
    n = engine.max_num_seqs * engine.max_model_len
    return n, f"working set {_tokens(n)} = max_num_seqs {engine.max_num_seqs} x max_model_len {engine.max_model_len:,}"


def _cpu_tier(
    options: LMCacheOptions, host: HostFacts, cap: Any, mode: str, need: int, reasons: list[str], warnings: list[str],
) -> int:
    """The CPU tier's bytes: the option, else as much of the need as the reserve-keeping budget allows."""
    platform = host.platform
    tp = host.tensor_parallel
    ram = host.available_ram_bytes
    if platform == "cpu":
        ram -= cap.budget_bytes
        reasons.append(f"CPU host: the engine's own KV cache ({_gib(cap.budget_bytes)}) also lives in RAM and is taken off first")
    cpu_budget = lmi_tier_budget(ram, host.model_weight_bytes, tp, "CPU tier")
    reasons.append(cpu_budget.reason)
    # The MP server is one process for all ranks; in-process LMCache runs one cache per rank.
    budget = cpu_budget.total_bytes if mode == "mp" else cpu_budget.per_rank_bytes
    if options.lmcache_cpu_size_gb is not None:
        l1 = int(options.lmcache_cpu_size_gb * GIB)
        reasons.append(f"CPU tier {_gib(l1)} from option.lmcache_cpu_size_gb")
        if l1 > budget:
            warnings.append(f"option.lmcache_cpu_size_gb ({_gib(l1)}) exceeds the reserve-keeping budget ({_gib(budget)})")
    else:
        l1 = _quantize_gib(min(budget, need))
        scope = "for the one MP server (all TP ranks)" if mode == "mp" else "per TP rank"
        reasons.append(f"CPU tier {_gib(l1)} {scope} = min(budget {_gib(budget)}, need {_gib(need)})")
    return l1


def _disk_tier(
    options: LMCacheOptions, host: HostFacts, mode: str, need: int, *, check_disk: bool,
    reasons: list[str], warnings: list[str],
) -> DiskTier | None:
    """The disk tier, when the CPU tier cannot hold the working set (or its size is given)."""
    tp = host.tensor_parallel
    disk: DiskTier | None = None
    if options.lmcache_cache_dir is None:
        reasons.append("no disk tier: the working set exceeds the CPU tier, but option.lmcache_cache_dir is not set")
    elif host.disk is None:
        reasons.append(f"no disk tier: no facts about {options.lmcache_cache_dir}")
    else:
        disk_budget = lmi_tier_budget(host.disk.free_bytes, host.model_weight_bytes, tp, "disk tier")
        reasons.append(disk_budget.reason)
        dbudget = disk_budget.total_bytes if mode == "mp" else disk_budget.per_rank_bytes
        if options.lmcache_disk_size_gb is not None:
            dsize = int(options.lmcache_disk_size_gb * GIB)
            reasons.append(f"disk tier {_gib(dsize)} from option.lmcache_disk_size_gb")
        else:
            # The disk tier persists: it holds documents of past requests and restarts, not only
            # today's working set, so it takes the budget (LMI's rule); the keeper enforces it.
            dsize = _quantize_gib(dbudget)
            reasons.append(
                f"disk tier {_gib(dsize)} = the budget (it keeps KV of past requests across restarts, more than the "
                f"working set's {_gib(need)}); option.lmcache_disk_size_gb for less"
            )
        if dsize > 0:
            odirect = options.lmcache_odirect
            if check_disk:
                try:
                    check = check_cache_dir(options.lmcache_cache_dir, want_odirect=odirect, wanted_bytes=dsize)
                except CacheDirError as e:
                    raise KVCacheConfigError(f"option.lmcache_cache_dir: {e}") from None
                warnings.extend(check.warnings)
                odirect = check.odirect
            disk = DiskTier(path=options.lmcache_cache_dir, size_bytes=dsize, odirect=odirect)
            reasons.append(
                f"disk tier at {options.lmcache_cache_dir}, block size {host.disk.block_size} B, "
                f"O_DIRECT {'on' if odirect else 'off'}"
            )
        else:
            reasons.append("no disk tier: no free disk left after the reserve")
    return disk


def auto_chunk_size(platform: Platform, engine: EngineFacts, reasons: list[str]) -> int:
    """LMCache's 256 tokens, or CPU_CHUNK_TOKENS in whole engine blocks on a CPU host without
    blending (see CPU_CHUNK_TOKENS)."""
    if platform != "cpu" or engine.blend:
        return DEFAULT_CHUNK_SIZE
    block = engine.block_size or CPU_CHUNK_TOKENS
    chunk = max(block, CPU_CHUNK_TOKENS // block * block)
    reasons.append(
        f"chunk size {chunk} tokens on a CPU host: a hit prefills the prompt's tail beyond its last whole chunk, "
        f"and on a CPU that tail is most of the hit's time (LMCache's default is {DEFAULT_CHUNK_SIZE})"
    )
    return chunk


def _offload_plan(
    mode: str, platform: Platform, l1: int, disk: DiskTier | None, host: HostFacts, *, port: int, metrics_port: int,
    python: str | None, max_transfer: int, env: dict[str, str], reasons: list[str], warnings: list[str],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> KVCachePlan:
    """The plan with its tiers: the MP server's argv and connector, or in-process LMCache's env."""
    transfer_mode = transfer_mode_for(platform)
    shm = mode == "mp" and choose_shm(None, transfer_mode, l1, host.shm_free_bytes, reasons, warnings)
    tiers = CacheTiers(
        chunk_size=chunk_size,
        l1_bytes=l1,
        eviction_policy="LRU",
        disk=disk,
        remote=None,
        host="localhost",
        port=port,
        metrics_port=metrics_port,
        transfer_mode=transfer_mode,
        shm=shm,
    )
    reasons.append(f"transfer mode {tiers.transfer_mode} ({platform} host), chunk size {chunk_size} tokens")
    if mode == "inprocess":
        env.update(inprocess_env(tiers))
        return KVCachePlan(
            mode="inprocess", kv_transfer_config=inprocess_kv_transfer_config(), server_argv=None,
            env=env, reasons=reasons, source="auto", tiers=tiers, warnings=warnings,
        )
    return KVCachePlan(
        mode="mp", kv_transfer_config=mp_kv_transfer_config(tiers, max_transfer, reasons), server_argv=mp_server_argv(tiers, python),
        env=env, reasons=reasons, source="auto", tiers=tiers, warnings=warnings,
    )

def plan_auto(
    model_config: Mapping[str, Any],
    engine: EngineFacts,
    host: HostFacts,
    options: LMCacheOptions,
    *,
    port: int,
    metrics_port: int,
    python: str | None = None,
    check_disk: bool = True,
) -> KVCachePlan:
    """The auto plan. Returns a plan with `mode=None` when offloading would not pay."""
    platform: Platform = host.platform  # type: ignore[assignment]
    mode = "inprocess" if options.lmcache_mode == "inprocess" else "mp"
    if mode == "inprocess":
        require_gpu_for_inprocess(platform)
    fp = kv_footprint(model_config, engine.kv_cache_dtype)
    reasons = [f"KV per token: {fp.explanation}"]
    warnings: list[str] = []
    reasons.append(
        f"model weights: {_gib(host.model_weight_bytes)} ({host.model_weight_source})"
        if host.model_weight_bytes else f"model weights: {host.model_weight_source}"
    )
    ws_tokens, ws_reason = working_set_tokens(engine, options)
    reasons.append(ws_reason)
    cap = engine_kv_capacity(fp, host, engine, engine.max_model_len)
    reasons.append(cap.reason)
    env = process_env(options.lmcache_hash_seed, options.lmcache_telemetry)
    forced = options.lmcache_cpu_size_gb is not None or options.lmcache_disk_size_gb is not None
    persist = options.lmcache_cache_dir is not None
    if ws_tokens <= cap.tokens and not forced and not persist:
        reasons.append(
            f"no offloading: the working set ({_tokens(ws_tokens)}) fits the engine's own KV cache "
            f"({_tokens(cap.tokens)}); offloading pays from about {_tokens(cap.tokens)} of working set"
        )
        return KVCachePlan(mode=None, kv_transfer_config=None, server_argv=None, env=env, reasons=reasons, source="auto")
    if ws_tokens > cap.tokens:
        reasons.append(f"offloading pays: working set {_tokens(ws_tokens)} exceeds the engine's KV capacity {_tokens(cap.tokens)}")
    elif forced:
        reasons.append("offloading forced by option.lmcache_cpu_size_gb / lmcache_disk_size_gb")
    else:
        reasons.append(
            f"offloading for persistence: the working set fits the engine's KV cache, but a cache directory "
            f"({options.lmcache_cache_dir}) keeps KV across restarts"
        )

    tp = host.tensor_parallel
    wanted = ws_tokens * fp.bytes_per_token
    reasons.append(f"cache needs {_gib(wanted)} to hold the whole working set ({fp.bytes_per_token:,} B per token, all layers)")

    need = wanted if mode == "mp" else math.ceil(wanted / tp)  # the MP server caches for all ranks at once
    l1 = _cpu_tier(options, host, cap, mode, need, reasons, warnings)
    if l1 <= 0:
        reasons.append("no offloading: no RAM is left for a CPU tier after the reserve")
        return KVCachePlan(mode=None, kv_transfer_config=None, server_argv=None, env=env, reasons=reasons, source="auto", warnings=warnings)
    l1_tokens = l1 // fp.bytes_per_token * (tp if mode == "inprocess" else 1)
    reasons.append(f"CPU tier holds about {_tokens(l1_tokens)}")

    # Disk tier: when the CPU tier cannot hold the working set, or a cache directory is there to
    # keep KV across restarts (the auto plan's only persistent tier).
    disk = None
    if persist:
        reasons.append(
            f"disk tier: {options.lmcache_cache_dir} is a cache directory; KV stored there survives restarts "
            "and is read by any server with the same KV namespace"
        )
    if options.lmcache_disk_size_gb is not None or l1_tokens < ws_tokens or persist:
        disk = _disk_tier(options, host, mode, need, check_disk=check_disk, reasons=reasons, warnings=warnings)

    return _offload_plan(
        mode, platform, l1, disk, host, port=port, metrics_port=metrics_port, python=python,
        max_transfer=engine.max_model_len * fp.bytes_per_token, env=env, reasons=reasons, warnings=warnings,
        chunk_size=auto_chunk_size(platform, engine, reasons),
    )


def inprocess_env(tiers: CacheTiers) -> dict[str, str]:
    """LMCACHE_* variables that configure in-process LMCache (per engine worker) like the tiers."""
    env = {
        "LMCACHE_CHUNK_SIZE": str(tiers.chunk_size),
        "LMCACHE_LOCAL_CPU": "True",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{tiers.l1_bytes / GIB:g}",
    }
    if tiers.disk is not None:
        env["LMCACHE_LOCAL_DISK"] = f"file://{tiers.disk.path}/"
        env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = f"{(tiers.disk.size_bytes or 0) / GIB:g}"
        env["LMCACHE_EXTRA_CONFIG"] = '{"use_odirect": %s}' % ("true" if tiers.disk.odirect else "false")
    return env
