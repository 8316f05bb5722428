"""The LMCache plan (file, auto, or off) for this engine, with start-up errors naming the key."""

from __future__ import annotations

from typing import Any

from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.kvcache.plan import KVCachePlan
from lmi_server.preflight import engine_block_size
from lmi_server.runtime.model_files import longest_sequence_kv_bytes, max_model_len
from lmi_server.runtime.model_files import model_config as read_model_config


def plan_kv_cache(cfg: ServingConfig, engine_args: dict[str, Any], *, contact_hub: bool = False) -> KVCachePlan:
    """The LMCache plan (file, auto, or off); any problem is a start-up error naming the key.
    `contact_hub` (serving): a hub model's revision is resolved on the hub (`name_keys`)."""
    from lmi_server.kvcache.host import GIB, CacheDirError, probe_host
    from lmi_server.kvcache.plan import KVCacheConfigError
    from lmi_server.kvcache.planner import EngineFacts
    from lmi_server.kvcache.resolve import build_kvcache_plan

    opts, found, found_why = _with_mounted_cache_dir(cfg)
    model_path, model_config = read_model_config(str(engine_args["model"]))
    try:
        host = probe_host(
            model_dir=model_path,
            cache_dir=opts.lmcache_cache_dir,
            tensor_parallel=int(engine_args.get("tensor_parallel_size") or 1),
        )
        engine = None
        if opts.lmcache_auto_config:
            if model_config is None:
                raise KVCacheConfigError(
                    "option.lmcache_auto_config needs the model's config.json locally; "
                    "use option.lmcache_config_file for hub models"
                )
            kv_bytes = cfg.server.cpu_kv_cache_space * GIB if cfg.server.cpu_kv_cache_space else None
            engine = EngineFacts(
                max_num_seqs=int(engine_args.get("max_num_seqs") or 256),
                max_model_len=max_model_len(model_config, engine_args),
                gpu_memory_utilization=float(engine_args.get("gpu_memory_utilization") or 0.9),
                engine_kv_cache_bytes=kv_bytes or engine_args.get("kv_cache_memory_bytes"),
                kv_cache_dtype=engine_args.get("kv_cache_dtype"),
                block_size=engine_block_size(engine_args, gpu=host.platform != "cpu"),
                blend=opts.lmcache_blend,
            )
        # the auto plan sizes the connector's timing from its own footprint
        max_transfer = longest_sequence_kv_bytes(model_config, engine_args) if engine is None else None
        plan = build_kvcache_plan(
            opts, host=host, engine=engine, model_config=model_config, model_dir=cfg.model_dir,
            max_transfer_bytes=max_transfer,
        )
    except (KVCacheConfigError, CacheDirError) as exc:
        raise ConfigError([str(exc)]) from exc
    if found is not None and plan.tiers is not None and plan.tiers.disk is not None:
        plan.reasons.append(f"cache directory {found}: {found_why}; option.lmcache_cache_dir overrides it")
    name_keys(plan, engine_args, hub_model=cfg.model.source == "hub", contact_hub=contact_hub)
    return plan


def _with_mounted_cache_dir(cfg: ServingConfig) -> tuple[Any, Any, str]:
    """The LMCache options, with a default cache directory for the auto plan when
    option.lmcache_cache_dir is not set: a writable directory mounted at /mnt/kvcache, else on
    SageMaker /tmp/lmcache (`sagemaker_caches`); that directory (or None) and why it was chosen."""
    from lmi_server import sagemaker_caches
    from lmi_server.kvcache.host import mounted_cache_dir
    from lmi_server.sagemaker_env import why

    opts = cfg.lmcache
    if not opts.lmcache_auto_config or opts.lmcache_cache_dir is not None:
        return opts, None, ""
    found = mounted_cache_dir()
    reason = "a writable directory mounted at the conventional path (the Helm chart's kvCache volume)"
    if found is None:
        found = sagemaker_caches.kv_cache_dir()
        reason = (
            f"on SageMaker ({why()}) the instance's NVMe volume is mounted at /tmp, and LMI keeps its "
            "LMCache disk tier at /tmp/lmcache (O_DIRECT where the filesystem accepts it)"
        )
    if found is None:
        return opts, None, ""
    return opts.model_copy(update={"lmcache_cache_dir": found}), found, reason


def name_keys(
    plan: KVCachePlan, engine_args: dict[str, Any], *, hub_model: bool = False, contact_hub: bool = False,
) -> None:
    """Give the MP connector this server's KV namespace (`kvcache/namespace.py`): stored chunks
    are found again only by a server whose model files (a hub model: its commit), dtypes, KV-changing
    settings, chunk size and versions match."""
    from lmi_server.kvcache.namespace import EXTRA_CONFIG_KEY, kv_identity, kv_settings

    if plan.mode != "mp" or plan.kv_transfer_config is None or plan.tiers is None:
        return
    if hub_model:
        pin_hub_commit(plan, engine_args, contact_hub=contact_hub)
    identity = kv_identity(
        str(engine_args["model"]),
        revision=engine_args.get("revision"),
        dtype=engine_args.get("dtype"),
        kv_cache_dtype=engine_args.get("kv_cache_dtype"),
        chunk_size=plan.tiers.chunk_size,
        tensor_parallel=int(engine_args.get("tensor_parallel_size") or 1),
        pipeline_parallel=int(engine_args.get("pipeline_parallel_size") or 1),
        platform="cuda" if plan.tiers.transfer_mode == "lmcache_driven" else "cpu",
        settings=kv_settings(engine_args),
    )
    namespace = identity.namespace()
    plan.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY] = namespace
    plan.reasons.append(
        f"KV keys in namespace {namespace} ({identity.describe()}): a cache directory or Redis shared with "
        "another model or commit, dtype, quantization, config override, chunk size or LMCache/vLLM version "
        "never serves its chunks here; adapters are kept apart by their cache salt"
    )


def pin_hub_commit(plan: KVCachePlan, engine_args: dict[str, Any], *, contact_hub: bool) -> None:
    """A hub model's revision resolved to a commit (`model_source/hub.py`) and the engine pinned to
    it (`revision`), so that the KV keys name the weights loaded, not a branch that moves (a local
    directory is named by its files). Unresolved (hub not asked or unreachable, not in the local
    cache): the revision as given, said in the plan."""
    from lmi_server.model_source.hub import hub_commit

    model = str(engine_args["model"])
    revision = engine_args.get("revision") or None  # None: the default branch, as the engine asks
    given = revision or "main"
    token = engine_args.get("hf_token")
    commit = hub_commit(model, revision, contact_hub=contact_hub, token=token if isinstance(token, str) else None)
    if commit is None:
        plan.reasons.append(
            f"hub model {model}: revision {given} not resolved to a commit (hub not asked or unreachable, "
            "not in the local cache): KV keys name the revision, which may move"
        )
        return
    engine_args["revision"] = commit
    if commit != given:
        plan.reasons.append(
            f"hub model {model}: revision {given} is commit {commit}; the engine loads that commit, "
            "and the KV keys name it"
        )
