"""One entry point: model directory + properties file + environment -> ServingConfig."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from lmi_server.config.lmi_compat import read_environment
from lmi_server.config.properties import load_properties_file, merge_sources
from lmi_server.config.schema import DEFAULT_MODEL_DIR, ConfigError, ServingConfig, build_serving_config

log = logging.getLogger(__name__)


def load_serving_config(
    model_dir: str | Path | None = None,
    properties_path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServingConfig:
    """Read `serving.properties` (from model_dir unless given) and OPTION_* variables; the file wins."""
    environ = os.environ if environ is None else environ
    model_dir = Path(model_dir or environ.get("LMI_MODEL_DIR") or DEFAULT_MODEL_DIR).expanduser()
    if properties_path is not None:
        path = Path(properties_path).expanduser()
        if not path.is_file():
            raise ConfigError([f"--properties {path}: no such file"])
    else:
        path = model_dir / "serving.properties"
    try:
        file_props = load_properties_file(path) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError([f"{path}: cannot be read: {exc}"]) from exc
    environment = read_environment(environ)
    merged = merge_sources(file_props, environment.props)
    cfg = build_serving_config(
        merged.values,
        model_dir,
        sources=merged.sources,
        overridden_by_file=merged.overridden_by_file,
        environ=dict(environ),
        environment=environment,
    )
    log_lmi_settings(cfg)
    return cfg


def log_lmi_settings(cfg: ServingConfig) -> None:
    """One line per LMI setting that is not simply an option of this server: what it became, or
    why it does not apply; and LMI's defaults where they differ from vLLM's."""
    for key, what in cfg.translated.items():
        log.info("LMI setting %s -> %s", key, what)  # never a secret value: names and reasons only
    for key, why in cfg.not_applicable.items():
        log.info("%s is not applicable here (%s); ignored", key, why)
    for arg, why in cfg.defaults.items():
        log.info("LMI default %s=%s", arg, why)
