"""The single entry point the serving config calls: `option.lmcache_*` → `KVCachePlan`.

It picks the way in (config file, auto plan, or nothing), resolves the file path against the
model directory as LMI does, and chooses free local ports when none are configured (inside
SAGEMAKER_SAFE_PORT_RANGE when it is set).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmi_server import safe_ports
from lmi_server.kvcache.host import HostFacts
from lmi_server.kvcache.lmcache import plan_from_config_file, process_env
from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.plan import KVCacheConfigError, KVCachePlan
from lmi_server.kvcache.planner import EngineFacts, plan_auto


def free_local_port() -> int:
    """A TCP port free right now (from SAGEMAKER_SAFE_PORT_RANGE when set, `safe_ports`)."""
    return free_local_ports(1)[0]


def free_local_ports(count: int, *, taken: tuple[int, ...] = ()) -> list[int]:
    """`count` distinct free TCP ports, none of them in `taken` (`safe_ports.free_local_ports`:
    inside SAGEMAKER_SAFE_PORT_RANGE when it is set)."""
    return safe_ports.free_local_ports(count, taken=taken)


def resolve_config_path(path: Path, model_dir: Path | None) -> Path:
    if path.is_absolute() or model_dir is None:
        return path
    return model_dir / path


def build_kvcache_plan(
    options: LMCacheOptions,
    *,
    host: HostFacts,
    engine: EngineFacts | None = None,
    model_config: Mapping[str, Any] | None = None,
    model_dir: Path | None = None,
    python: str | None = None,
    check_disk: bool = True,
    max_transfer_bytes: int | None = None,
) -> KVCachePlan:
    """Resolve the LMCache options into a plan (no process is started, no env is changed).

    `engine` and `model_config` are needed only for `lmcache_auto_config`; `max_transfer_bytes`
    (the longest sequence's KV, when the model is known) sizes the connector's RPC timeout for a
    config file's plan (the auto plan computes it)."""
    if options.lmcache_config_file is not None and options.lmcache_auto_config:
        raise KVCacheConfigError(
            "option.lmcache_config_file and option.lmcache_auto_config=true exclude each other; keep one"
        )
    given = tuple(p for p in (options.lmcache_port, options.lmcache_metrics_port) if p)
    try:
        picked = iter(free_local_ports(2 - len(given), taken=given))
    except safe_ports.PortRangeError as exc:
        raise KVCacheConfigError(f"LMCache server ports: {exc}") from None
    port = options.lmcache_port or next(picked)
    metrics_port = options.lmcache_metrics_port or next(picked)
    if metrics_port == port:
        raise KVCacheConfigError("option.lmcache_port and option.lmcache_metrics_port must differ")
    if options.lmcache_config_file is not None:
        return plan_from_config_file(
            resolve_config_path(options.lmcache_config_file, model_dir),
            mode=options.lmcache_mode,
            platform=host.platform,  # type: ignore[arg-type]
            port=port,
            metrics_port=metrics_port,
            hash_seed=options.lmcache_hash_seed,
            telemetry=options.lmcache_telemetry,
            python=python,
            check_disk=check_disk,
            available_ram_bytes=host.available_ram_bytes,
            max_transfer_bytes=max_transfer_bytes,
            shm_free_bytes=host.shm_free_bytes,
        )
    if options.lmcache_auto_config:
        if engine is None or model_config is None:
            raise KVCacheConfigError("option.lmcache_auto_config needs the model's config.json and the engine settings")
        return plan_auto(
            model_config, engine, host, options,
            port=port, metrics_port=metrics_port, python=python, check_disk=check_disk,
        )
    return KVCachePlan(
        mode=None, kv_transfer_config=None, server_argv=None,
        env=process_env(options.lmcache_hash_seed, options.lmcache_telemetry),
        reasons=["LMCache off: neither option.lmcache_config_file nor option.lmcache_auto_config is set"],
        source="none",
    )
