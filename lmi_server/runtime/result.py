"""What the process runs, resolved from a ServingConfig: engine and front-end arguments, environment,
the LMCache plan and the notes; `describe()` is what `lmi-server config` prints."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from lmi_server.config.schema import ServingConfig
from lmi_server.cpu_preload import MERGED_ENV
from lmi_server.kvcache.plan import KVCachePlan


@dataclass
class Runtime:
    cfg: ServingConfig
    engine_args: dict[str, Any]
    env: dict[str, str]
    kv_plan: KVCachePlan | None = None
    notes: list[str] = field(default_factory=list)
    engine_memory: dict[str, Any] | None = None
    frontend_args: dict[str, Any] = field(default_factory=dict)
    blend: dict[str, Any] | None = None
    fair_slots: dict[str, int] | None = None
    """Slots added to the engine for fair admission (`fair_headroom`); None where none were."""

    def apply_environment(self) -> None:
        """Before the engine is built: vLLM spawns its engine processes, which take this
        environment. A variable the user set wins; LD_PRELOAD is merged (`cpu_preload`)."""
        for key, value in self.env.items():
            if key in MERGED_ENV:
                os.environ[key] = value
            else:
                os.environ.setdefault(key, value)

    def log_start_up(self, log: logging.Logger) -> None:
        """What `lmi-server config` would show that an operator must see in the serving log too:
        the built-in choices, the LMCache plan's decisions and its warnings (e.g. a /dev/shm too
        small for the CPU tier)."""
        log.info("model kind: %s (%s); serves %s", self.cfg.kind.name, self.cfg.kind.reason, self.cfg.kind.serves)
        for note in self.notes:
            log.info("%s", note)
        if self.kv_plan is not None and self.kv_plan.mode is not None:
            log.info("LMCache plan: %s", "; ".join(self.kv_plan.reasons))
        for warning in self.kv_plan.warnings if self.kv_plan is not None else ():
            log.warning("LMCache: %s", warning)

    def _nodes_needed(self) -> list[dict[str, Any]] | None:
        """Nodes of 8 x H100 80GB and of 8 x H200 141GB the model needs, with the degrees (docs/multi-node.md)."""
        from lmi_server.config.group_planner import nodes_needed

        if self.cfg.model.source != "local":
            return None
        args = {k: v for k, v in self.engine_args.items() if k not in ("tensor_parallel_size", "pipeline_parallel_size")}
        return nodes_needed(self.cfg.model.path_or_id, args)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.cfg.model.model_dump(),
            "model_kind": self.cfg.kind.describe(),
            "model_dir": str(self.cfg.model_dir),
            "group": self.cfg.group.describe(self.engine_args) if self.cfg.group else None,
            "nodes_needed": self._nodes_needed(),
            "vllm_engine_args": self.engine_args,
            "vllm_frontend_args": self.frontend_args,
            "environment": self.env,
            "server": self.cfg.server.model_dump(mode="json"),
            "lmcache": self.cfg.lmcache.model_dump(mode="json"),
            "engine_memory": self.engine_memory,
            "lmcache_plan": self.kv_plan.to_dict() if self.kv_plan else None,
            "lmcache_blend": self.blend,
            "fair_slots": self.fair_slots,
            "speculative": self.cfg.speculative.model_dump(mode="json"),
            "adapters": self.cfg.adapters.model_dump(mode="json"),
            "sessions": self.cfg.sessions.model_dump(mode="json"),
            "security": {
                "api_key": "***" if self.cfg.security.api_key is not None else None,
                "api_key_file": str(self.cfg.security.api_key_file) if self.cfg.security.api_key_file else None,
                "metrics_public": self.cfg.security.metrics_public,
            },
            "not_applicable": self.cfg.not_applicable,
            "lmi_translated": self.cfg.translated,
            "lmi_defaults": self.cfg.defaults,
            "overridden_by_file": self.cfg.overridden_by_file,
            "sources": self.cfg.sources,
            "notes": self.notes,
        }
