"""From a validated ServingConfig to what the process runs: model path, engine arguments, env.

Kept apart from config/ so that config stays pure (no file building, no environment writes);
`lmi-server config` prints `describe()` without starting anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.engine import engine_environment
from lmi_server.kvcache.plan import KVCachePlan


@dataclass
class Runtime:
    cfg: ServingConfig
    engine_args: dict[str, Any]
    env: dict[str, str]
    kv_plan: KVCachePlan | None = None
    notes: list[str] = field(default_factory=list)

    def apply_environment(self) -> None:
        for key, value in self.env.items():
            os.environ.setdefault(key, value)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.cfg.model.model_dump(),
            "model_dir": str(self.cfg.model_dir),
            "vllm_engine_args": self.engine_args,
            "environment": self.env,
            "server": self.cfg.server.model_dump(mode="json"),
            "lmcache": self.cfg.lmcache.model_dump(mode="json"),
            "lmcache_plan": self.kv_plan.to_dict() if self.kv_plan else None,
            "speculative": self.cfg.speculative.model_dump(mode="json"),
            "adapters": self.cfg.adapters.model_dump(mode="json"),
            "sessions": self.cfg.sessions.model_dump(mode="json"),
            "security": {
                "api_key": "***" if self.cfg.security.api_key is not None else None,
                "api_key_file": str(self.cfg.security.api_key_file) if self.cfg.security.api_key_file else None,
                "metrics_public": self.cfg.security.metrics_public,
            },
            "not_applicable": self.cfg.not_applicable,
            "overridden_by_file": self.cfg.overridden_by_file,
            "sources": self.cfg.sources,
            "notes": self.notes,
        }


def resolve_runtime(cfg: ServingConfig, *, build_demo: bool) -> Runtime:
    engine_args = dict(cfg.engine_args)
    notes: list[str] = []
    if cfg.model.source == "demo":
        from lmi_server.demo.builder import ensure_demo_model

        if build_demo:
            engine_args["model"] = str(ensure_demo_model())
        notes.append("no model configured: serving the embedded demo model")
    engine_args.pop("speculative_config", None)
    speculative = resolve_speculative(cfg, engine_args, build_demo=build_demo)
    if speculative is not None:
        engine_args["speculative_config"] = speculative
    env = engine_environment(cfg)
    kv_plan = plan_kv_cache(cfg, engine_args)
    if kv_plan.kv_transfer_config is not None:
        engine_args["kv_transfer_config"] = kv_plan.kv_transfer_config
    env.update(kv_plan.env)
    return Runtime(cfg=cfg, engine_args=engine_args, env=env, kv_plan=kv_plan, notes=notes)


def resolve_speculative(cfg: ServingConfig, engine_args: dict[str, Any], *, build_demo: bool) -> dict[str, Any] | None:
    from lmi_server.speculative import SpeculativeConfigError, build_speculative_config

    default_draft = None
    if cfg.model.source == "demo" and cfg.speculative.speculative_method in ("eagle",):
        from lmi_server.demo import builder

        try:  # the demo kit ships a trained EAGLE head for the demo model
            default_draft = str(builder.ensure_demo_draft())
        except FileNotFoundError:
            default_draft = None
    try:
        return build_speculative_config(cfg, str(engine_args["model"]), default_draft)
    except SpeculativeConfigError as exc:
        raise ConfigError([str(exc)]) from exc


def _model_config(model_path: str) -> tuple[Path | None, dict[str, Any] | None]:
    path = Path(model_path)
    if (path / "config.json").is_file():
        return path, json.loads((path / "config.json").read_text())
    return None, None


def plan_kv_cache(cfg: ServingConfig, engine_args: dict[str, Any]) -> KVCachePlan:
    """The LMCache plan (file, auto, or off); any problem is a start-up error naming the key."""
    from lmi_server.kvcache.host import GIB, CacheDirError, probe_host
    from lmi_server.kvcache.plan import KVCacheConfigError
    from lmi_server.kvcache.planner import EngineFacts
    from lmi_server.kvcache.resolve import build_kvcache_plan

    opts = cfg.lmcache
    model_path, model_config = _model_config(str(engine_args["model"]))
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
            max_len = engine_args.get("max_model_len") or model_config.get("max_position_embeddings") or 4096
            kv_bytes = cfg.server.cpu_kv_cache_space * GIB if cfg.server.cpu_kv_cache_space else None
            engine = EngineFacts(
                max_num_seqs=int(engine_args.get("max_num_seqs") or 256),
                max_model_len=int(max_len),
                gpu_memory_utilization=float(engine_args.get("gpu_memory_utilization") or 0.9),
                engine_kv_cache_bytes=kv_bytes or engine_args.get("kv_cache_memory_bytes"),
                kv_cache_dtype=engine_args.get("kv_cache_dtype"),
            )
        return build_kvcache_plan(opts, host=host, engine=engine, model_config=model_config, model_dir=cfg.model_dir)
    except (KVCacheConfigError, CacheDirError) as exc:
        raise ConfigError([str(exc)]) from exc
