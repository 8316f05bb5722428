"""The `option.lmcache_*` keys. Field names are the option keys without the `option.` prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LMCacheOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lmcache_config_file: Path | None = Field(
        None,
        description="LMCache YAML file (LMCache's own keys). Relative paths resolve against the model directory.",
    )
    lmcache_auto_config: bool = Field(
        False, description="Plan LMCache tiers from the host and the model (see `lmi-server config`)."
    )
    lmcache_mode: Literal["mp", "inprocess", "auto"] = Field(
        "auto",
        description="mp: LMCache's multiprocess cache server (works on CPU and GPU); inprocess: "
        "LMCacheConnectorV1 inside the engine (GPU only); auto: mp.",
    )
    lmcache_expected_context_tokens: int | None = Field(
        None, gt=0, description="Working set in tokens for the auto plan (default max_num_seqs x max_model_len)."
    )
    lmcache_port: int | None = Field(
        None, ge=1, le=65535,
        description="TCP port of the LMCache MP server's request socket (ZMQ). Default: a free local port.",
    )
    lmcache_metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="Port of the MP server's own Prometheus /metrics (LMCache hits, bytes per tier). "
        "Default: a free local port (LMCache's own default, 9090, often clashes with Prometheus).",
    )
    lmcache_cache_dir: Path | None = Field(
        None,
        description="Directory for the auto plan's disk tier (local NVMe, e.g. /mnt/nvme/lmcache). "
        "Unset: the auto plan has no disk tier.",
    )
    lmcache_cpu_size_gb: float | None = Field(
        None, gt=0, description="Auto plan: CPU (L1) tier size in GiB instead of the computed one."
    )
    lmcache_disk_size_gb: float | None = Field(
        None, gt=0, description="Auto plan: disk tier size in GiB instead of the computed one."
    )
    lmcache_odirect: bool = Field(
        True, description="Auto plan: O_DIRECT for the disk tier (falls back with a warning where refused)."
    )
    lmcache_telemetry: bool = Field(
        False,
        description="Allow LMCache's anonymous usage telemetry. Off by default: the container sets "
        "LMCACHE_TRACK_USAGE=false and DO_NOT_TRACK=1 for the cache server and the engine.",
    )
    lmcache_hash_seed: str = Field(
        "0", pattern=r"^\d{1,10}$",
        description="PYTHONHASHSEED shared by the cache server and the engine (must be equal in every "
        "process that shares a cache; `random` is not allowed for that reason).",
    )
    lmcache_max_restarts: int = Field(
        5, ge=0,
        description="Restarts of a dead LMCache MP server allowed within option.lmcache_restart_window "
        "(sliding window); past that the supervisor waits until the oldest restart leaves the window, "
        "and /ping reports the degraded state meanwhile.",
    )
    lmcache_restart_window: int = Field(
        600, gt=0, description="Seconds of the sliding window that option.lmcache_max_restarts counts in."
    )
