"""`lmi-demo`: a tiny Llama trained on Python's standard library, with a trained EAGLE head; it
starts in a fraction of the assistant's time, for fast end-to-end tests (`lmi_server.demo.builder`)."""

from __future__ import annotations

from pathlib import Path

from lmi_server.catalogue.entry import BuiltinModel

NAME = "lmi-demo"


def _locate() -> Path:
    from lmi_server.demo.builder import default_cache_dir

    return default_cache_dir()


def _build() -> Path:
    from lmi_server.demo.builder import ensure_demo_model

    return ensure_demo_model()


def _eagle_draft() -> Path | None:
    from lmi_server.demo.builder import kit_draft_dir

    return kit_draft_dir()


DEMO = BuiltinModel(
    name=NAME,
    source="demo",
    note=f"serving the tiny trained demo model (option.model_id={NAME})",
    locate=_locate,
    build=_build,
    kind="generate",
    tool_calling=True,
    drafts={"eagle": _eagle_draft},
)
