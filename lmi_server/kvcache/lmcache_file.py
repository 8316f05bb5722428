"""LMCache's own YAML config file, parsed strictly: every key LMCache defines is known (read from
the installed LMCache), a key that is not is an error naming the nearest valid one, and the
values this server translates are validated (`lmcache.py` turns them into the MP server's flags).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmi_server.compat import lmcache as compat_lmcache
from lmi_server.kvcache.plan import KVCacheConfigError, RemoteTier


class ExtraConfig(BaseModel):
    """`extra_config:` keys this translation understands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    use_odirect: bool = Field(False, description="O_DIRECT reads/writes for the local disk tier.")


class LMCacheFileConfig(BaseModel):
    """The LMCache YAML keys that have a meaning for LMCache's MP server (LMCache names and units:
    sizes are GiB as float, like LMCache's `max_local_cpu_size`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_size: int = Field(256, gt=0, description="Tokens per KV chunk (hash and storage unit).")
    local_cpu: bool = Field(True, description="Keep chunks in CPU RAM (the MP server's L1 always exists).")
    max_local_cpu_size: float = Field(5.0, gt=0, description="CPU RAM tier (L1) in GiB.")
    local_disk: str | None = Field(None, description="Local disk tier: 'file:///mnt/nvme/lmcache/' or a path.")
    max_local_disk_size: float = Field(0.0, ge=0, description="Disk tier size in GiB (checked against free space).")
    remote_url: str | None = Field(None, description="Remote tier, Redis protocol: 'redis://host:port'.")
    remote_serde: Literal["naive"] | None = Field(
        "naive", description="Remote (de)serializer; the MP server stores raw KV ('naive')."
    )
    cache_policy: Literal["LRU", "ARC"] = Field("LRU", description="Eviction policy of the CPU tier.")
    mp_host: str | None = Field(None, description="Host the MP server binds (default localhost).")
    mp_port: int | None = Field(None, ge=1, le=65535, description="Port of the MP server.")
    mp_shm: bool | None = Field(
        None,
        description="CPU hosts (engine_driven transfer): keep the CPU tier in a /dev/shm segment that the "
        "engine's workers copy from directly, instead of pickling every hit over ZMQ. Unset: on when "
        "/dev/shm has max_local_cpu_size free, else off with a warning; true/false force it.",
    )
    extra_config: ExtraConfig = Field(default_factory=ExtraConfig)
    enable_blending: bool = Field(
        False, description="CacheBlend: reuse segments' KV beyond the prefix (option.lmcache_blend)."
    )
    blend_special_str: str | None = Field(
        None, min_length=1, description="Separator of the prompt's segments (option.lmcache_blend_separator)."
    )
    blend_recompute_ratios: list[float] | None = Field(
        None,
        description="Share of reused tokens recomputed at the check layer, one value "
        "(option.lmcache_blend_recompute_ratio).",
    )

    @field_validator("local_disk")
    @classmethod
    def _one_disk_path(cls, v: str | None) -> str | None:
        if v is not None and "," in v:
            raise ValueError("one local disk path is supported, e.g. 'file:///mnt/nvme/lmcache/'")
        return v

    @field_validator("blend_recompute_ratios")
    @classmethod
    def _one_ratio(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            if len(v) != 1:
                raise ValueError("one ratio is supported (blending checks one layer), e.g. [0.15]")
            if not 0.0 <= v[0] <= 1.0:
                raise ValueError(f"the ratio must be in [0, 1], got {v[0]}")
        return v

    @field_validator("remote_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None:
            parse_remote_url(v)
        return v

    def disk_path(self) -> Path | None:
        if not self.local_disk:
            return None
        raw = self.local_disk.strip()
        path = raw.removeprefix("file://") if raw.startswith("file://") else raw
        if not path.startswith("/"):
            raise KVCacheConfigError(f"local_disk must be an absolute path or file:// URL, got {raw!r}")
        return Path(path)


def parse_remote_url(url: str) -> RemoteTier:
    """`redis://[user:password@]host:port` (or valkey://) → the RESP adapter's fields."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "valkey"):
        raise ValueError(
            f"remote_url scheme {parts.scheme!r} is not supported; use 'redis://host:6379' "
            "(RESP protocol; TLS 'rediss://' needs LMCache's valkey adapter and valkey-glide)"
        )
    if not parts.hostname or not parts.port:
        raise ValueError(f"remote_url needs host and port, e.g. 'redis://cache.internal:6379', got {url!r}")
    return RemoteTier(
        url=url,
        host=parts.hostname,
        port=parts.port,
        username=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
    )


# ---------------------------------------------------------------------------------------------
# Loading with errors that name the key
# ---------------------------------------------------------------------------------------------


def lmcache_known_keys() -> frozenset[str]:
    """Every key LMCache's in-process config defines (`compat.lmcache.config_keys`)."""
    return compat_lmcache.config_keys()


def _describe_error(err: dict[str, Any], model: type[BaseModel]) -> str:
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        fields = list(ExtraConfig.model_fields) if loc[0] == "extra_config" else list(model.model_fields)
        hint = difflib.get_close_matches(loc[-1], fields, n=1)
        if loc[0] != "extra_config" and loc[-1] in lmcache_known_keys():
            return (
                f"`{key}` is an LMCache key that the MP server translation does not support "
                f"(supported: {', '.join(fields)}); remove it or use option.lmcache_mode=inprocess on a GPU host"
            )
        return f"unknown key `{key}`" + (f"; did you mean `{hint[0]}`?" if hint else f"; valid keys: {', '.join(fields)}")
    return f"`{key}`: {err['msg']} (got {err.get('input')!r})"


def parse_lmcache_config(data: Any, *, source: str = "<dict>") -> LMCacheFileConfig:
    """Validate an already-loaded LMCache config mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise KVCacheConfigError(f"LMCache config {source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return LMCacheFileConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(_describe_error(err, LMCacheFileConfig) for err in e.errors())
        raise KVCacheConfigError(f"LMCache config {source}: {problems}") from None


def load_lmcache_config(path: Path) -> LMCacheFileConfig:
    """Read and strictly validate an LMCache YAML file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise KVCacheConfigError(f"option.lmcache_config_file: cannot read {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KVCacheConfigError(f"LMCache config {path}: not valid YAML: {e}") from None
    return parse_lmcache_config(data, source=str(path))
