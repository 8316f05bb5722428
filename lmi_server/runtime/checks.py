"""Checks of the dry run: what the engine's own checks would refuse at start-up, refused before."""

from __future__ import annotations

from typing import Any

from lmi_server.config import host
from lmi_server.config.schema import ConfigError
from lmi_server.kvcache.plan import KVCachePlan


def preflight_checks(engine_args: dict[str, Any], model_config: dict[str, Any] | None, kv_plan: KVCachePlan) -> None:
    """Refuse in the dry run what the engine's own checks would refuse at start-up."""
    from lmi_server.preflight import check_chunk_size, check_max_model_len

    chunk = kv_plan.tiers.chunk_size if kv_plan.tiers is not None else None
    problems = [
        p for p in (
            check_max_model_len(engine_args, model_config),
            check_chunk_size(chunk, engine_args, gpu=host.gpu_count() > 0),
        ) if p
    ]
    if problems:
        raise ConfigError(problems)
