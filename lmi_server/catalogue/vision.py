"""tiny-qwen2-vl-shapes, the built-in vision-language model: a tiny Qwen2-VL trained to name
shapes, read in place from the package (`lmi_server/demo/vlm`, `lmi_server.demo.vision`)."""

from __future__ import annotations

from pathlib import Path

from lmi_server.catalogue.entry import BuiltinModel

NAME = "tiny-qwen2-vl-shapes"


def _locate() -> Path:
    from lmi_server.demo.vision import vlm_dir

    return vlm_dir()


VISION = BuiltinModel(
    name=NAME,
    source="vision",
    note=f"serving the built-in vision-language model {NAME} (lmi_server/demo/vlm)",
    locate=_locate,
    reads_own_files=True,
)
