"""LMCache blending (position-independent reuse): its settings checked against the engine and
the cache plan, and written into the connector's extra config."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.kvcache.plan import KVCachePlan


def mode_reason(settings: Any, check_layer: int, where: dict) -> str:
    """What the blend mode recomputes, and where its settings came from (the plan's reasons)."""
    if settings.mode == "cacheblend":
        return (f"CacheBlend mode ({where['mode']}): recompute {settings.recompute_ratio:g} of the reused tokens with "
                f"the most deviating KV at layer {check_layer} ({where['recompute_ratio']}), plus every token of "
                "missed segments and the query")
    if settings.mode == "epic":
        return (f"EPIC mode ({where['mode']}): recompute the first {settings.epic_tokens} tokens of each run of "
                f"reused tokens ({where['epic_tokens']}), no check layer, plus every token of missed segments and the query")
    return (f"guided mode ({where['mode']}): recompute {settings.recompute_ratio:g} of the reused tokens the question "
            f"attends to most ({where['recompute_ratio']}), found by a first pass of the tokens not reused; no check "
            "layer; plus every token of missed segments and the query")


def blend_settings(cfg: ServingConfig):
    """The blend settings (option keys and the LMCache file's), without touching the engine."""
    from lmi_server.kvcache.blend.settings import resolve_blend_settings
    from lmi_server.kvcache.lmcache_file import load_lmcache_config
    from lmi_server.kvcache.plan import KVCacheConfigError
    from lmi_server.kvcache.resolve import resolve_config_path

    opts = cfg.lmcache
    try:
        file_config = (
            load_lmcache_config(resolve_config_path(opts.lmcache_config_file, cfg.model_dir))
            if opts.lmcache_config_file is not None else None
        )
        return resolve_blend_settings(opts, file_config)
    except KVCacheConfigError as exc:
        raise ConfigError([str(exc)]) from exc


def plan_blend(
    cfg: ServingConfig, engine_args: dict[str, Any], model_config: dict[str, Any] | None, kv_plan: KVCachePlan
) -> dict[str, Any] | None:
    """What blending would do with this configuration, with reasons; None when it is off. A model or
    a cache layout it cannot handle is a ConfigError saying why."""
    from lmi_server.kvcache.blend.segments import DEFAULT_CHUNK_SIZE
    from lmi_server.kvcache.blend.settings import EXTRA_CONFIG_KEY, BlendConfig
    from lmi_server.kvcache.blend.support import BlendUnsupportedModel, check_model

    settings = blend_settings(cfg)
    if not settings.enabled:
        return None
    if kv_plan.mode is None:
        raise ConfigError([
            "option.lmcache_blend needs LMCache: set option.lmcache_config_file or option.lmcache_auto_config=true"
        ])
    if kv_plan.mode != "mp":
        raise ConfigError(["option.lmcache_blend works with LMCache's MP cache server: use option.lmcache_mode=mp (or auto)"])
    if model_config is None:
        raise ConfigError(["option.lmcache_blend needs the model's config.json locally to check that blending can handle it"])
    try:
        support = check_model(model_config, kv_cache_dtype=engine_args.get("kv_cache_dtype"))
    except BlendUnsupportedModel as exc:
        raise ConfigError([f"option.lmcache_blend: {exc}"]) from exc
    from lmi_server.kvcache.lmcache import GUARDED_MP_CONNECTOR

    if (kv_plan.kv_transfer_config or {}).get("kv_connector") != GUARDED_MP_CONNECTOR:
        raise ConfigError([
            "option.lmcache_blend runs in this server's connector, which blends into vLLM's CPU KV layout "
            "(engine_driven transfers); this host's plan uses LMCache's own connector (GPU), where blending is not built"
        ])
    if engine_args.get("speculative_config"):
        raise ConfigError([
            "option.lmcache_blend cannot be combined with speculative decoding: the draft model has no KV for the "
            "blended prompt; remove option.speculative_config / option.speculative_method or the blend option"
        ])
    chunk = kv_plan.tiers.chunk_size if kv_plan.tiers is not None else DEFAULT_CHUNK_SIZE
    opts = cfg.lmcache
    blend_config = BlendConfig(
        separator=settings.separator, recompute_ratio=settings.recompute_ratio, check_layer=support.check_layer,
        chunk_size=chunk, min_reused_tokens=opts.lmcache_blend_min_reused_tokens,
        store_dir=blend_store_dir(), store_max_bytes=int(opts.lmcache_blend_store_gb * 2**30),
        model_identity=f"{engine_args['model']}|{engine_args.get('dtype', 'auto')}|{engine_args.get('kv_cache_dtype', 'auto')}",
        mode=settings.mode, epic_tokens=settings.epic_tokens,
    )
    extra = kv_plan.kv_transfer_config.setdefault("kv_connector_extra_config", {})
    extra[EXTRA_CONFIG_KEY] = blend_config.to_dict()
    where = settings.sources
    return {
        **settings.to_dict(),
        "check_layer": support.check_layer,
        "chunk_size": chunk,
        "min_reused_tokens": blend_config.min_reused_tokens,
        "store_dir": blend_config.store_dir,
        "store_max_bytes": blend_config.store_max_bytes,
        "reasons": [
            f"segments cut at {settings.separator!r} ({where['separator']}); each segment keyed by its own tokens, "
            f"per {chunk}-token chunk, whatever stands before it",
            mode_reason(settings, support.check_layer, where),
            support.describe(),
            f"a prompt is blended when its cached segments cover >= {blend_config.min_reused_tokens} tokens; "
            f"segment KV kept in {blend_config.store_dir} (at most {opts.lmcache_blend_store_gb:g} GiB); "
            "vLLM's prefix caching off, LMCache serves prefixes",
        ],
    }


def blend_store_dir() -> str:
    """Where this server keeps segment KV: a tmpfs where there is one, one directory per server
    (those of servers that are gone are swept at start-up: `blend.store.remove_stale_stores`)."""
    from lmi_server.kvcache.blend.settings import STORE_PREFIX

    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"{STORE_PREFIX}{os.getpid()}")
