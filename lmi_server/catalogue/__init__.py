"""The models that ship with the server, one entry each (`entry.BuiltinModel`), found by the
`option.model_id` that names them or by the `source` of a resolved configuration.

Pure: importing it loads no engine, torch or demo builder (config/ reads it).
"""

from __future__ import annotations

from pathlib import Path

from lmi_server.catalogue.assistant import ASSISTANT
from lmi_server.catalogue.demo import DEMO
from lmi_server.catalogue.embedding import EMBEDDING
from lmi_server.catalogue.entry import BuiltinModel, BuiltinUnavailable
from lmi_server.catalogue.vision import VISION

BUILTIN_MODELS: dict[str, BuiltinModel] = {m.name: m for m in (ASSISTANT, DEMO, EMBEDDING, VISION)}
"""option.model_id -> entry."""
DEFAULT_MODEL = ASSISTANT
"""Served when no model is configured and the model directory holds none."""

_BY_SOURCE = {m.source: m for m in BUILTIN_MODELS.values()}


def by_name(model_id: str | None) -> BuiltinModel | None:
    """The built-in model `option.model_id` names, if it names one."""
    return BUILTIN_MODELS.get(model_id) if model_id is not None else None


def by_source(source: str) -> BuiltinModel | None:
    """The built-in model a resolved configuration serves (`cfg.model.source`), if any."""
    return _BY_SOURCE.get(source)


def example_adapters_dir(source: str) -> Path | None:
    """The example adapters shipped for the built-in model `source` serves; None for other models."""
    entry = by_source(source)
    return entry.adapters_dir() if entry is not None and entry.adapters_dir is not None else None


__all__ = [
    "ASSISTANT", "BUILTIN_MODELS", "DEFAULT_MODEL", "DEMO", "EMBEDDING", "VISION", "BuiltinModel",
    "BuiltinUnavailable", "by_name", "by_source", "example_adapters_dir",
]
