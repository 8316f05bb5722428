"""From a validated ServingConfig to what the process runs: model path, engine arguments, env.

Kept apart from config/ so that config stays pure (no file building, no environment writes);
`lmi-server config` prints `describe()` without starting anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lmi_server.config.schema import ServingConfig
from lmi_server.engine import engine_environment


@dataclass
class Runtime:
    cfg: ServingConfig
    engine_args: dict[str, Any]
    env: dict[str, str]
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
            "speculative": self.cfg.speculative.model_dump(mode="json"),
            "adapters": self.cfg.adapters.model_dump(mode="json"),
            "sessions": self.cfg.sessions.model_dump(mode="json"),
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
    return Runtime(cfg=cfg, engine_args=engine_args, env=engine_environment(cfg), notes=notes)
