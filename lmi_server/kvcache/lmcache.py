"""LMCache's own YAML config → the MP server's command line and vLLM's KVTransferConfig.

Users bring an LMCache config file in LMCache's key names (`chunk_size`, `max_local_cpu_size`,
`local_disk`, `remote_url`, `extra_config.use_odirect`, ...; see `lmcache/v1/config.py`).
LMCache itself silently ignores keys it does not know; we parse strictly so a typo stops
start-up with the key and the nearest valid one. The keys are translated for LMCache's
multiprocess server (`python -m lmcache.v1.multiprocess.server`, flags from its argparse in
`lmcache/v1/multiprocess/config.py` and `lmcache/v1/distributed/config.py`):

    max_local_cpu_size (GiB)      → --l1-size-gb  (+ --eviction-policy, required with it)
    cache_policy                  → --eviction-policy
    chunk_size                    → --chunk-size
    local_disk + extra_config     → --l2-adapter {"type": "fs", "base_path": ..., "use_odirect": ...}
    remote_url redis://h:p        → --l2-adapter {"type": "resp", "host": h, "port": p}
      (user:password@ of the URL  → LMCACHE_RESP_USERNAME / _PASSWORD in the server's environment only)
    mp_host / mp_port             → --host / --port
    mp_shm: true (engine_driven)  → --shm-name lmcache_mp_<port>_<pid>  (CPU tier in /dev/shm: hits are not pickled)

The transfer mode follows the platform: `engine_driven` on CPU (the only mode the CPU engine
can register; without it the worker hangs 300 s in register_kv_caches), `lmcache_driven`
(zero-copy CUDA IPC) on CUDA.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Literal

from lmi_server.kvcache.host import GIB, CacheDirError, check_cache_dir
from lmi_server.kvcache.lmcache_file import LMCacheFileConfig, load_lmcache_config, parse_remote_url
from lmi_server.kvcache.plan import (
    CacheTiers,
    DiskTier,
    KVCacheConfigError,
    KVCachePlan,
    Platform,
    TransferMode,
)

MP_SERVER_MODULE = "lmcache.v1.multiprocess.server"
# CUDA hosts: LMCache's connector with the KV namespace in its keys (namespaced_connector.py).
MP_CONNECTOR = "NamespacedLMCacheMPConnector"
MP_CONNECTOR_MODULE = "lmi_server.kvcache.namespaced_connector"
# CPU hosts: the same connector with a guard for unanswered stores (lmi_server/kvcache/connector.py).
GUARDED_MP_CONNECTOR = "GuardedLMCacheMPConnector"
GUARDED_MP_CONNECTOR_MODULE = "lmi_server.kvcache.connector"
# A KV load that fails (a cache server that died after the lookup, a timed-out retrieve) costs a
# recompute of those tokens, not the request: vLLM's default policy fails the request.
LOAD_FAILURE_POLICY = "recompute"
INPROCESS_CONNECTOR = "LMCacheConnectorV1"

# ---------------------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------------------


def transfer_mode_for(platform: Platform) -> TransferMode:
    return "lmcache_driven" if platform == "cuda" else "engine_driven"


def tiers_from_config(
    cfg: LMCacheFileConfig,
    *,
    port: int,
    metrics_port: int,
    platform: Platform,
    check_disk: bool = True,
    shm_free_bytes: int | None = None,
) -> tuple[CacheTiers, list[str], list[str]]:
    """Turn a validated file config into `CacheTiers`. Returns (tiers, reasons, warnings).

    `check_disk` runs the cache-directory checks (create, writable, free space, O_DIRECT probe);
    unit tests of pure translation pass False."""
    reasons: list[str] = []
    warnings: list[str] = []
    if not cfg.local_cpu:
        warnings.append(
            "local_cpu: false has no MP-server equivalent (its CPU tier always exists); "
            f"max_local_cpu_size={cfg.max_local_cpu_size} GiB is used as the CPU staging tier"
        )
    reasons.append(f"CPU tier (L1) {cfg.max_local_cpu_size:g} GiB from max_local_cpu_size, eviction {cfg.cache_policy}")

    disk = None
    disk_path = cfg.disk_path()
    if disk_path is not None:
        want = int(cfg.max_local_disk_size * GIB)
        odirect = cfg.extra_config.use_odirect
        if check_disk:
            try:
                check = check_cache_dir(disk_path, want_odirect=odirect, wanted_bytes=want)
            except CacheDirError as e:
                raise KVCacheConfigError(f"local_disk: {e}") from None
            warnings.extend(check.warnings)
            odirect = check.odirect if odirect else False
        disk = DiskTier(path=disk_path, size_bytes=want or None, odirect=odirect)
        reasons.append(
            f"disk tier at {disk_path} ({cfg.max_local_disk_size:g} GiB intended, O_DIRECT "
            f"{'on' if odirect else 'off'}) via LMCache's fs L2 adapter"
        )
    remote = parse_remote_url(cfg.remote_url) if cfg.remote_url else None
    if remote is not None:
        reasons.append(f"remote tier {remote.redacted_url()} via LMCache's resp (Redis protocol) L2 adapter")
    mode = transfer_mode_for(platform)
    l1_bytes = int(cfg.max_local_cpu_size * GIB)
    shm = choose_shm(cfg.mp_shm, mode, l1_bytes, shm_free_bytes, reasons, warnings)
    reasons.append(
        f"transfer mode {mode}: "
        + ("CUDA host, zero-copy IPC" if platform == "cuda" else "CPU host, the only mode the CPU engine can register")
    )
    tiers = CacheTiers(
        chunk_size=cfg.chunk_size,
        l1_bytes=l1_bytes,
        eviction_policy=cfg.cache_policy,
        disk=disk,
        remote=remote,
        host=cfg.mp_host or "localhost",
        port=cfg.mp_port or port,
        metrics_port=metrics_port,
        transfer_mode=mode,
        shm=shm,
    )
    return tiers, reasons, warnings


def choose_shm(
    requested: bool | None,
    transfer_mode: TransferMode,
    l1_bytes: int,
    shm_free_bytes: int | None,
    reasons: list[str],
    warnings: list[str],
) -> bool:
    """Whether the CPU tier goes into /dev/shm (`mp_shm`; None = decide from the free space).

    Shared memory makes a hit a memory copy in the worker instead of clone, pickle, ZMQ, unpickle
    (about 0.3 -> 4-6 GB/s in benchmarks/kv_hit_path.py), so it is the default on CPU hosts wherever
    /dev/shm can hold the whole tier; a container's default /dev/shm (64 MiB in Docker) cannot."""
    if transfer_mode != "engine_driven":
        if requested:
            warnings.append("mp_shm applies to engine_driven transfer (CPU hosts) only; ignored on CUDA")
        return False
    if requested is False:
        reasons.append("mp_shm: false: hits are pickled over ZMQ (about 0.3 GB/s)")
        return False
    fits = shm_free_bytes is not None and shm_free_bytes >= l1_bytes
    free = "unknown" if shm_free_bytes is None else f"{shm_free_bytes / GIB:.1f} GiB"
    if fits:
        reasons.append(
            f"CPU tier in /dev/shm ({free} free{'' if requested else ', mp_shm default'}): "
            "engine workers copy hits from it directly, no pickling"
        )
        return True
    if requested:
        warnings.append(
            f"mp_shm: true but /dev/shm has {free} free for a {l1_bytes / GIB:g} GiB CPU tier: hits are "
            "pickled over ZMQ instead; give /dev/shm more room (docker run --shm-size=...)"
        )
        return False
    warnings.append(
        f"/dev/shm has {free} free, less than the {l1_bytes / GIB:g} GiB CPU tier: hits are pickled over ZMQ "
        "(about 0.3 GB/s instead of 4-6 GB/s); give /dev/shm the tier's size (docker run --shm-size=...) "
        "or set mp_shm: false to silence this"
    )
    return False


L2_PREFETCH_POLICY = "retain"


def _gib_arg(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.4g}"


def l2_adapter_specs(tiers: CacheTiers) -> list[dict[str, Any]]:
    """The `--l2-adapter` JSON objects, disk before remote (the prefetch policy tries them in order)."""
    specs: list[dict[str, Any]] = []
    if tiers.disk is not None:
        specs.append({"type": "fs", "base_path": str(tiers.disk.path), "use_odirect": tiers.disk.odirect})
    if tiers.remote is not None:
        # No credentials here: this JSON goes on the server's command line (visible in `ps`);
        # they travel in the child's environment instead (`remote_secret_env`).
        specs.append({"type": "resp", "host": tiers.remote.host, "port": tiers.remote.port})
    return specs


def remote_secret_env(tiers: CacheTiers) -> dict[str, str]:
    """The remote tier's credentials as LMCache's resp adapter reads them from its environment
    (`LMCACHE_RESP_USERNAME` / `LMCACHE_RESP_PASSWORD`, lmcache/v1/distributed/l2_adapters/resp_l2_adapter.py)."""
    env: dict[str, str] = {}
    if tiers.remote is not None:
        if tiers.remote.username:
            env["LMCACHE_RESP_USERNAME"] = tiers.remote.username
        if tiers.remote.password:
            env["LMCACHE_RESP_PASSWORD"] = tiers.remote.password
    return env


def mp_server_argv(tiers: CacheTiers, python: str | None = None) -> list[str]:
    """The full command line of the LMCache MP server for these tiers."""
    argv = [
        python or sys.executable, "-m", MP_SERVER_MODULE,
        "--host", tiers.host,
        "--port", str(tiers.port),
        "--chunk-size", str(tiers.chunk_size),
        "--l1-size-gb", _gib_arg(tiers.l1_bytes),
        "--eviction-policy", tiers.eviction_policy,
        "--supported-transfer-mode", tiers.transfer_mode,
        "--prometheus-port", str(tiers.metrics_port),
    ]
    if tiers.shm:  # engine_driven only (choose_shm)
        # Put the CPU tier in a POSIX shared-memory segment: the engine's workers then copy KV
        # straight between the segment and their paged KV cache. Without it LMCache pickles every
        # hit over ZMQ (clone, pickle, send, unpickle, copy). One name per port and serving
        # process: a restarted server reclaims it; the supervisor unlinks it at stop.
        argv += ["--shm-name", shm_segment_name(tiers.port)]
    specs = l2_adapter_specs(tiers)
    for spec in specs:
        argv += ["--l2-adapter", json.dumps(spec, separators=(",", ":"))]
    if specs:
        # LMCache's default prefetch policy drops a chunk from the CPU tier as soon as the engine
        # has read it from disk or Redis, so every later hit on a document that came back from
        # L2 (after a restart, or after eviction) reads L2 again. "retain" keeps it in the CPU tier,
        # where the LRU policy ages it like any other chunk.
        argv += ["--l2-prefetch-policy", L2_PREFETCH_POLICY]
    return argv


def shm_segment_name(port: int, instance: int | None = None) -> str:
    """The /dev/shm segment holding the MP server's CPU tier (engine_driven transfer). Unique per
    serving process (its pid), so that the supervisor's clean-up never takes another server's
    segment; a restarted cache server of the same instance reclaims it."""
    return f"lmcache_mp_{port}_{os.getpid() if instance is None else instance}"


# How fast the vLLM connector gives up on a dead cache server (engine_driven transfer). Its
# worker moves KV inside the engine step with blocking RPCs that each wait up to `mq_timeout`
# (LMCache's default: 300 s), and it stops sending them only once its health ping (default every
# 10 s, with a 10 s timeout) has failed; the cache server drops an RPC it cannot serve (one sent
# before the connector re-registered with a restarted server) without an answer. With the
# defaults a SIGKILLed cache server stalled every request for 10-20 s, or hung the worker for
# 300 s. The ping runs every second and an RPC waits as long as the largest transfer can take
# at a pessimistic pickle rate (a whole max_model_len sequence of KV at 50 MB/s; measured here:
# 100 MB/s under load, more when quiet), at least 2 s; 30 s when the model's KV size is unknown.
HEARTBEAT_INTERVAL_S = 1.0
MQ_TIMEOUT_FLOOR_S = 2.0
MQ_TIMEOUT_UNKNOWN_S = 30.0
PICKLE_RATE_FLOOR_BPS = 50e6


def connector_timeouts(tiers: CacheTiers, max_transfer_bytes: int | None) -> tuple[dict[str, float], str | None]:
    """The connector's `lmcache.mp.*` timing keys for these tiers, and the reason for them.

    `max_transfer_bytes`: the KV of the longest sequence (max_model_len x bytes per token), when
    the model's config is known; with the CPU tier in /dev/shm the RPCs carry slot numbers, not KV.
    CUDA hosts (lmcache_driven: transfers do not go through these RPCs) keep LMCache's defaults."""
    if tiers.transfer_mode != "engine_driven":
        return {}, None
    if tiers.shm:
        mq, why = MQ_TIMEOUT_FLOOR_S, "the KV moves through /dev/shm, the RPCs carry only slot numbers"
    elif max_transfer_bytes is None:
        mq, why = MQ_TIMEOUT_UNKNOWN_S, "the model's KV size is unknown"
    else:
        mq = max(MQ_TIMEOUT_FLOOR_S, float(math.ceil(max_transfer_bytes / PICKLE_RATE_FLOOR_BPS)))
        why = f"the longest sequence's KV is {max_transfer_bytes / 1e6:,.0f} MB, at >= {PICKLE_RATE_FLOOR_BPS / 1e6:g} MB/s"
    keys = {"lmcache.mp.heartbeat_interval": HEARTBEAT_INTERVAL_S, "lmcache.mp.mq_timeout": mq}
    reason = (
        f"connector health ping every {HEARTBEAT_INTERVAL_S:g} s and RPC timeout {mq:g} s ({why}): "
        "a dead cache server costs requests seconds, not LMCache's 10-20 s (or 300 s)"
    )
    return keys, reason


def mp_kv_transfer_config(
    tiers: CacheTiers, max_transfer_bytes: int | None = None, reasons: list[str] | None = None
) -> dict[str, Any]:
    """kwargs for `vllm.config.KVTransferConfig` that point vLLM at the MP server (with the
    connector's timing from `connector_timeouts`, whose reason is appended to `reasons`)."""
    timing, timing_reason = connector_timeouts(tiers, max_transfer_bytes)
    if timing_reason and reasons is not None:
        reasons.append(timing_reason)
    guarded = tiers.transfer_mode == "engine_driven"
    return {
        "kv_connector": GUARDED_MP_CONNECTOR if guarded else MP_CONNECTOR,
        "kv_role": "kv_both",
        "kv_load_failure_policy": LOAD_FAILURE_POLICY,
        "kv_connector_module_path": GUARDED_MP_CONNECTOR_MODULE if guarded else MP_CONNECTOR_MODULE,
        "kv_connector_extra_config": {
            "lmcache.mp.host": f"tcp://{tiers.host}",
            "lmcache.mp.port": tiers.port,
            **timing,
        },
    }


def inprocess_kv_transfer_config() -> dict[str, Any]:
    """kwargs for `KVTransferConfig` with LMCache inside the engine (LMI's GPU default)."""
    return {"kv_connector": INPROCESS_CONNECTOR, "kv_role": "kv_both", "kv_load_failure_policy": LOAD_FAILURE_POLICY}


def process_env(hash_seed: str, telemetry: bool) -> dict[str, str]:
    """Environment for the cache server AND the engine: same hash seed; no phoning home.

    LMCache checks `LMCACHE_TRACK_USAGE=false` / `DO_NOT_TRACK=1`
    (lmcache/usage_telemetry/identity.py); vLLM checks `VLLM_NO_USAGE_STATS` / `DO_NOT_TRACK`."""
    env = {"PYTHONHASHSEED": hash_seed}
    if not telemetry:
        env.update({"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"})
    return env


def check_l1_fits_ram(l1_bytes: int, available_ram_bytes: int, platform: Platform, warnings: list[str]) -> None:
    """The CPU tier must fit in RAM. On CPU hosts LMCache allocates it all at start-up (its lazy
    allocator needs pinned memory), so an oversized tier fails at once or starves the engine."""
    if l1_bytes > available_ram_bytes:
        raise KVCacheConfigError(
            f"max_local_cpu_size ({l1_bytes / GIB:g} GiB) exceeds the available RAM "
            f"({available_ram_bytes / GIB:.1f} GiB); lower it"
        )
    if l1_bytes > 0.8 * available_ram_bytes:
        warnings.append(
            f"max_local_cpu_size ({l1_bytes / GIB:g} GiB) leaves less than 20 % of the available RAM "
            f"({available_ram_bytes / GIB:.1f} GiB) for the engine{' (allocated up front on CPU hosts)' if platform == 'cpu' else ''}"
        )


def require_gpu_for_inprocess(platform: Platform) -> None:
    if platform != "cuda":
        raise KVCacheConfigError(
            "option.lmcache_mode=inprocess needs a GPU: LMCache 0.5.6 has no CPU connector for "
            "in-process mode ('No supported cpu connector found'); use option.lmcache_mode=mp (or auto)"
        )


def plan_from_config_file(
    path: Path,
    *,
    mode: Literal["mp", "inprocess", "auto"],
    platform: Platform,
    port: int,
    metrics_port: int,
    hash_seed: str = "0",
    telemetry: bool = False,
    python: str | None = None,
    check_disk: bool = True,
    available_ram_bytes: int | None = None,
    max_transfer_bytes: int | None = None,
    shm_free_bytes: int | None = None,
) -> KVCachePlan:
    """`option.lmcache_config_file` → KVCachePlan (MP server argv + KVTransferConfig, or in-process)."""
    cfg = load_lmcache_config(path)
    env = process_env(hash_seed, telemetry)
    if mode == "inprocess":
        require_gpu_for_inprocess(platform)
        env["LMCACHE_CONFIG_FILE"] = str(Path(path).resolve())
        return KVCachePlan(
            mode="inprocess",
            kv_transfer_config=inprocess_kv_transfer_config(),
            server_argv=None,
            env=env,
            reasons=[f"in-process LMCache inside each engine worker, configured by {path} (LMCACHE_CONFIG_FILE)"],
            source="config_file",
        )
    tiers, reasons, warnings = tiers_from_config(
        cfg, port=port, metrics_port=metrics_port, platform=platform, check_disk=check_disk,
        shm_free_bytes=shm_free_bytes,
    )
    if available_ram_bytes is not None:
        check_l1_fits_ram(tiers.l1_bytes, available_ram_bytes, platform, warnings)
    reasons.insert(0, f"LMCache MP server configured from {path}" + (" (mode auto = mp)" if mode == "auto" else ""))
    return KVCachePlan(
        mode="mp",
        kv_transfer_config=mp_kv_transfer_config(tiers, max_transfer_bytes, reasons),
        server_argv=mp_server_argv(tiers, python),
        env=env,
        secret_env=remote_secret_env(tiers),
        reasons=reasons,
        source="config_file",
        tiers=tiers,
        warnings=warnings,
    )
