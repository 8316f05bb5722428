"""The one result of KV-cache configuration: what to start and what to give vLLM, with reasons.

Both ways in (an LMCache YAML file, or the auto planner) end in `CacheTiers` (the cache layout
in plain numbers) and then in a `KVCachePlan`: the MP server's argv, the vLLM
`KVTransferConfig` kwargs, the environment both processes need, and the human-readable
reasons that `lmi-server config` prints. Nothing here starts a process or touches os.environ.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

TransferMode = Literal["engine_driven", "lmcache_driven"]
Platform = Literal["cpu", "cuda"]


class KVCacheConfigError(ValueError):
    """The KV-cache configuration cannot work; the message names the key or fact at fault."""


@dataclass(frozen=True)
class DiskTier:
    path: Path
    size_bytes: int | None
    """The tier's size limit. LMCache 0.5.6's `fs` L2 adapter has no capacity cap: the supervisor's
    `DiskBudgetKeeper` enforces it (files of earlier runs included), oldest chunks out first."""
    odirect: bool


@dataclass(frozen=True)
class RemoteTier:
    url: str = field(repr=False)  # may hold user:password@
    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)

    def redacted_url(self) -> str:
        return f"redis://{'***@' if self.password else ''}{self.host}:{self.port}"


@dataclass(frozen=True)
class CacheTiers:
    """The cache layout in numbers, independent of how it is launched."""

    chunk_size: int
    l1_bytes: int
    eviction_policy: str
    disk: DiskTier | None
    remote: RemoteTier | None
    host: str
    port: int
    metrics_port: int
    transfer_mode: TransferMode
    shm: bool = False
    """The CPU tier lives in a /dev/shm segment that engine workers copy from (engine_driven only)."""


@dataclass
class KVCachePlan:
    """What the serving process must do for LMCache. `mode` None means no KV offloading."""

    mode: Literal["mp", "inprocess"] | None
    kv_transfer_config: dict[str, Any] | None
    server_argv: list[str] | None
    env: dict[str, str]
    reasons: list[str]
    source: Literal["config_file", "auto", "none"]
    tiers: CacheTiers | None = None
    warnings: list[str] = field(default_factory=list)
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    """Credentials for the cache server only (e.g. LMCACHE_RESP_PASSWORD): handed to that child
    through its environment, never on its command line, never to the engine, never printed."""

    @property
    def port(self) -> int | None:
        return self.tiers.port if self.tiers and self.mode == "mp" else None

    @property
    def metrics_url(self) -> str | None:
        """The MP server's own Prometheus endpoint (LMCache hit/stored counters)."""
        if self.tiers is None or self.mode != "mp":
            return None
        return f"http://127.0.0.1:{self.tiers.metrics_port}/metrics"

    def to_dict(self) -> dict[str, Any]:
        tiers = None
        if self.tiers is not None:
            tiers = asdict(self.tiers)
            if self.tiers.disk is not None:
                tiers["disk"]["path"] = str(self.tiers.disk.path)
            if self.tiers.remote is not None:
                tiers["remote"] = {"url": self.tiers.remote.redacted_url()}
        return {
            "mode": self.mode,
            "source": self.source,
            "kv_transfer_config": self.kv_transfer_config,
            "server_argv": _redact_argv(self.server_argv),
            "env": self.env,
            "secret_env": {k: "***" for k in self.secret_env},
            "tiers": tiers,
            "metrics_url": self.metrics_url,
            "reasons": self.reasons,
            "warnings": self.warnings,
        }

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _redact_argv(argv: list[str] | None) -> list[str] | None:
    if argv is None:
        return None
    out = []
    for arg in argv:
        if arg.startswith("{") and '"password"' in arg:
            data = json.loads(arg)
            if data.get("password"):
                data["password"] = "***"
            arg = json.dumps(data)
        out.append(arg)
    return out
