"""The blend settings of one configuration, from `option.lmcache_blend*` and the LMCache file.

Either way in switches blending on: `option.lmcache_blend=true`, or `enable_blending: true` in
the file `option.lmcache_config_file` names. The separator and the recompute ratio come from the
option keys where they are set, else from the file (`blend_special_str`,
`blend_recompute_ratios`), else their defaults. Both set to different values is an error: one
setting, one place. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.blend.modes import DEFAULT_MODE
from lmi_server.kvcache.lmcache_file import LMCacheFileConfig
from lmi_server.kvcache.plan import KVCacheConfigError

EXTRA_CONFIG_KEY = "lmi.blend"
"""The key of `kv_connector_extra_config` that carries `BlendConfig` to the engine's processes."""


STORE_PREFIX = "lmi-blend-"
"""A server keeps its segment KV in `<tmpfs>/lmi-blend-<pid of the server>`."""

RATIO_PARAM = "lmi_blend_recompute_ratio"
"""A request's own recompute ratio, in its `kv_transfer_params` (vLLM's per-request connector field)."""


BOUNDARIES_PARAM = "lmi_blend_boundaries"
"""A request's own document boundaries, in its `kv_transfer_params`: the prompt token offsets where
its documents start (then used instead of the separator)."""
MAX_BOUNDARIES = 1024

MODE_PARAM = "lmi_blend_mode"
"""A request's own blend mode (`cacheblend`, `epic` or `guided`), in its `kv_transfer_params`."""
EPIC_TOKENS_PARAM = "lmi_blend_epic_tokens"
"""A request's own EPIC token count (first tokens recomputed per reused span), in its `kv_transfer_params`."""


def request_boundaries(kv_transfer_params: Any) -> tuple[int, ...] | None:
    """The document boundaries one request gives (`kv_transfer_params.lmi_blend_boundaries`), None
    where it gives none; ValueError naming the field where they are not strictly increasing
    non-negative token offsets. Whether they lie inside the prompt is known only once it is
    tokenized (`prompt_boundaries`)."""
    if not isinstance(kv_transfer_params, dict) or kv_transfer_params.get(BOUNDARIES_PARAM) is None:
        return None
    value = kv_transfer_params[BOUNDARIES_PARAM]
    field_name = f"kv_transfer_params.{BOUNDARIES_PARAM}"
    if not isinstance(value, list) or len(value) > MAX_BOUNDARIES:
        raise ValueError(f"{field_name} must be a list of at most {MAX_BOUNDARIES} token offsets")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise ValueError(f"{field_name}: {str(value)[:60]} holds something that is not a token offset (an integer >= 0)")
    if any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"{field_name}: {str(value)[:60]} is not strictly increasing")
    return tuple(value)


def prompt_boundaries(kv_transfer_params: Any, prompt_len: int) -> tuple[int, ...] | None:
    """`request_boundaries`, also checked against the tokenized prompt (ValueError past its end)."""
    boundaries = request_boundaries(kv_transfer_params)
    if boundaries and boundaries[-1] > prompt_len:
        raise ValueError(
            f"kv_transfer_params.{BOUNDARIES_PARAM}: offset {boundaries[-1]} lies past the prompt's {prompt_len} tokens"
        )
    return boundaries


def request_ratio(kv_transfer_params: Any, default: float) -> float:
    """The recompute ratio one request asks for (`kv_transfer_params.lmi_blend_recompute_ratio`), else
    the server's; ValueError naming the field where it is not a number in [0, 1]."""
    if not isinstance(kv_transfer_params, dict) or kv_transfer_params.get(RATIO_PARAM) is None:
        return default
    value = kv_transfer_params[RATIO_PARAM]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"kv_transfer_params.{RATIO_PARAM}: {str(value)[:40]!r} is not a number in [0, 1]")
    return float(value)


def request_mode(kv_transfer_params: Any, mode: str, epic_tokens: int) -> tuple[str, int]:
    """The blend mode and EPIC token count one request asks for (`kv_transfer_params.lmi_blend_mode`,
    `.lmi_blend_epic_tokens`), else the server's; ValueError naming the field where either is bad."""
    from lmi_server.kvcache.blend.modes import validate_epic_tokens, validate_mode

    if not isinstance(kv_transfer_params, dict):
        return mode, epic_tokens
    for name, value, check in ((MODE_PARAM, mode, validate_mode), (EPIC_TOKENS_PARAM, epic_tokens, validate_epic_tokens)):
        if kv_transfer_params.get(name) is None:
            continue
        try:
            value = check(kv_transfer_params[name])
        except ValueError as exc:
            raise ValueError(f"kv_transfer_params.{name}: {exc}") from None
        mode, epic_tokens = (value, epic_tokens) if name == MODE_PARAM else (mode, value)
    return mode, epic_tokens


def names_own_blend(kv_transfer_params: Any) -> bool:
    """Whether a request names its own ratio, mode or EPIC token count (then it is blended whenever
    its segments are found, and its KV is not stored as an LMCache prefix)."""
    return isinstance(kv_transfer_params, dict) and any(
        kv_transfer_params.get(name) is not None for name in (RATIO_PARAM, MODE_PARAM, EPIC_TOKENS_PARAM))


@dataclass(frozen=True)
class BlendConfig:
    """What the engine's processes need to blend (resolved once by the server, passed in the
    connector's extra config)."""

    separator: str
    recompute_ratio: float
    check_layer: int
    chunk_size: int
    min_reused_tokens: int
    store_dir: str
    store_max_bytes: int
    model_identity: str
    mode: str = DEFAULT_MODE
    """`cacheblend` (the check layer's deviation picks `recompute_ratio` of the reused tokens), `epic`
    (the first `epic_tokens` of each reused span, no check layer) or `guided` (the question's attention
    picks `recompute_ratio` of them, no check layer)."""
    epic_tokens: int = 32

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> BlendConfig | None:
        raw = (extra or {}).get(EXTRA_CONFIG_KEY)
        return cls(**raw) if raw else None


@dataclass(frozen=True)
class BlendSettings:
    enabled: bool
    separator: str
    recompute_ratio: float
    mode: str = DEFAULT_MODE
    epic_tokens: int = 32
    sources: dict[str, str] = field(default_factory=dict)
    """setting -> where it came from (`option.lmcache_blend_separator`, the file's key, or `default`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# setting -> (option key, file key, reads the file's value)
_KEYS = {
    "enabled": ("lmcache_blend", "enable_blending", lambda f: f.enable_blending),
    "separator": ("lmcache_blend_separator", "blend_special_str", lambda f: f.blend_special_str),
    "recompute_ratio": (
        "lmcache_blend_recompute_ratio",
        "blend_recompute_ratios",
        lambda f: f.blend_recompute_ratios[0] if f.blend_recompute_ratios else None,
    ),
}


def resolve_blend_settings(options: LMCacheOptions, file_config: LMCacheFileConfig | None = None) -> BlendSettings:
    """The one set of blend settings; KVCacheConfigError where the option and the file disagree."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting, (option_key, file_key, read) in _KEYS.items():
        option_value = getattr(options, option_key)
        given = option_key in options.model_fields_set
        file_value = read(file_config) if file_config is not None and file_key in file_config.model_fields_set else None
        in_file = file_value is not None
        if given and in_file and file_value != option_value:
            raise KVCacheConfigError(
                f"option.{option_key}={option_value!r} and `{file_key}` in the LMCache file ({file_value!r}) "
                "set the same thing differently; keep one"
            )
        if given:
            values[setting], sources[setting] = option_value, f"option.{option_key}"
        elif in_file:
            values[setting], sources[setting] = file_value, f"LMCache file `{file_key}`"
        else:
            values[setting], sources[setting] = option_value, "default"
    for setting in ("mode", "epic_tokens"):  # option keys only: the LMCache file has no such keys
        option_key = f"lmcache_blend_{setting}"
        values[setting] = getattr(options, option_key)
        sources[setting] = f"option.{option_key}" if option_key in options.model_fields_set else "default"
    return BlendSettings(**values, sources=sources)
