"""The speculative config: the user's, or a built-in model's shipped draft and measured token counts."""

from __future__ import annotations

import os
from typing import Any

from lmi_server import catalogue
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.runtime.remote import fetch_remote


def builtin_draft(source: str, method: str = "eagle") -> str | None:
    """The draft head shipped for a built-in model and speculative method, when there is one."""
    entry = catalogue.by_source(source)
    found = entry.draft(method) if entry is not None else None
    return str(found) if found is not None else None


def resolve_speculative(
    cfg: ServingConfig, engine_args: dict[str, Any], *, build_demo: bool, notes: list[str] | None = None,
) -> dict[str, Any] | None:
    """The engine's speculative_config, or None when no speculation is configured."""
    from lmi_server.speculative import DEFAULT_SPECULATIVE_TOKENS, SpeculativeConfigError, build_speculative_config
    from lmi_server.speculative_suffix import plugin_refusal

    refusal = plugin_refusal(os.environ)
    if refusal is not None:
        raise ConfigError([refusal])

    method = cfg.speculative.speculative_method
    default_draft = builtin_draft(cfg.model.source, method) if method in ("eagle", "eagle3") else None
    default_tokens, default_schedule = DEFAULT_SPECULATIVE_TOKENS, None
    entry = catalogue.by_source(cfg.model.source)
    if default_draft is not None and entry is not None and not cfg.speculative.speculative_draft_model:
        default_tokens = entry.draft_tokens.get(method, default_tokens)
        default_schedule = entry.draft_tokens_by_batch.get(method)
    try:
        return build_speculative_config(
            cfg, str(engine_args["model"]), default_draft, default_tokens, default_schedule,
            remote=lambda url: fetch_remote(url, "speculative draft model", download=build_demo, notes=[] if notes is None else notes),
        )
    except SpeculativeConfigError as exc:
        raise ConfigError([str(exc)]) from exc
