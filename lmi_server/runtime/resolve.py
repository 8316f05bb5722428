"""From a validated ServingConfig to the Runtime: each step is one module of this package, called
here in order (model location, defaults, speculation, engine memory, LMCache, checks, front end).

Kept apart from config/ so that config stays pure (no file building, no environment writes);
`lmi-server config` prints `Runtime.describe()` without starting anything.
"""

from __future__ import annotations

from typing import Any

from lmi_server import catalogue
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.engine import engine_environment
from lmi_server.runtime.blend import plan_blend
from lmi_server.runtime.checks import preflight_checks
from lmi_server.runtime.defaults import builtin_defaults, builtin_tool_defaults, cpu_scheduler_defaults, vision_defaults
from lmi_server.runtime.engine_memory import default_engine_memory
from lmi_server.runtime.fair_slots import fair_headroom, tenant_scheduler
from lmi_server.runtime.frontend import resolve_frontend_args
from lmi_server.runtime.kv_plan import plan_kv_cache
from lmi_server.runtime.model_files import model_config as read_model_config
from lmi_server.runtime.remote import fetch_remote
from lmi_server.runtime.result import Runtime
from lmi_server.runtime.speculative import resolve_speculative


def locate_model(cfg: ServingConfig, engine_args: dict[str, Any], *, build: bool, notes: list[str]) -> None:
    """Point the engine at the model's files: a built-in model built (when serving) from its catalogue
    entry, an s3:// model downloaded; other models are already where config said."""
    entry = catalogue.by_source(cfg.model.source)
    if entry is not None:
        if build and entry.build is not None:
            try:
                engine_args["model"] = str(entry.build())
            except catalogue.BuiltinUnavailable as exc:
                raise ConfigError([str(exc)]) from exc
        notes.append(entry.note)
    elif cfg.model.source == "s3":
        engine_args["model"] = str(fetch_remote(cfg.model.path_or_id, "option.model_id", download=build, notes=notes))


def resolve_runtime(cfg: ServingConfig, *, build_demo: bool) -> Runtime:
    """Everything the process runs with; `build_demo` builds built-in models and downloads s3://
    references (serving), without it nothing is built or fetched (`lmi-server config`)."""
    engine_args = dict(cfg.engine_args)
    notes: list[str] = []
    locate_model(cfg, engine_args, build=build_demo, notes=notes)
    builtin_defaults(cfg, engine_args, notes)
    vision_defaults(cfg, engine_args, notes)
    fair_slots = fair_headroom(cfg, engine_args, notes)
    tenant_scheduler(cfg, engine_args, notes)
    engine_args.pop("speculative_config", None)
    speculative = resolve_speculative(cfg, engine_args, build_demo=build_demo, notes=notes)
    if speculative is not None:
        engine_args["speculative_config"] = speculative
    env = engine_environment(cfg, notes=notes)
    # A file-configured LMCache CPU tier is known before the engine's KV size; the auto plan
    # instead sizes its tier from what the engine's KV leaves.
    file_plan = cfg.lmcache.lmcache_config_file is not None
    kv_plan = plan_kv_cache(cfg, engine_args, contact_hub=build_demo) if file_plan else None
    l1_bytes = kv_plan.tiers.l1_bytes if kv_plan is not None and kv_plan.tiers is not None else 0
    memory = default_engine_memory(cfg, engine_args, env, lmcache_cpu_bytes=l1_bytes)
    if memory is not None:
        engine_args["kv_cache_memory_bytes"] = memory.kv_cache_bytes
    if kv_plan is None:
        kv_plan = plan_kv_cache(cfg, engine_args, contact_hub=build_demo)
    _, model_config = read_model_config(str(engine_args["model"]))
    cpu_scheduler_defaults(engine_args, model_config, notes)
    preflight_checks(engine_args, model_config, kv_plan)
    blend = plan_blend(cfg, engine_args, model_config, kv_plan)
    if kv_plan.kv_transfer_config is not None:
        engine_args["kv_transfer_config"] = kv_plan.kv_transfer_config
    env.update(kv_plan.env)
    frontend_args = resolve_frontend_args(cfg, engine_args)
    builtin_tool_defaults(cfg, engine_args, frontend_args, notes)
    return Runtime(
        cfg=cfg, engine_args=engine_args, env=env, kv_plan=kv_plan, notes=notes,
        engine_memory=memory.to_dict() if memory is not None else None,
        frontend_args=frontend_args, blend=blend, fair_slots=fair_slots,
    )
