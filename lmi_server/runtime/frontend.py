"""vLLM's front-end options (applied to its serving objects), with LMI's reading of chat_template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmi_server.config.schema import ConfigError, ServingConfig


def resolve_frontend_args(cfg: ServingConfig, engine_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM front-end options, with `chat_template` read as LMI does: a file path relative to the
    model directory (or the model's own directory), an absolute path, or the template inline."""
    args = dict(cfg.frontend_args)
    template = args.get("chat_template")
    if template and "{" not in template:
        path = Path(template).expanduser()
        candidates = [path] if path.is_absolute() else [cfg.model_dir / path, Path(str(engine_args["model"])) / path]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise ConfigError([
                f"option.chat_template={template!r}: no such file (looked in "
                + ", ".join(str(c) for c in candidates) + "); give a path or the Jinja template inline"
            ])
        args["chat_template"] = str(found.resolve())
    return args
