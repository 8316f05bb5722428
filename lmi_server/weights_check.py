"""Safetensors headers read before the engine starts: a truncated or corrupt weights file of a
local model directory fails the start in a second, in this process, with the same one-line cause
(`startup_failure`: weights_corrupt) as when vLLM's engine process finds it while loading, instead
of after an engine start (worker processes, memory, minutes on a big model) that is bound to fail.

Only the headers are read (safetensors checks that they describe a file of exactly this size), of
the files vLLM loads: those the index names where there is one (`model.safetensors.index.json`),
else every `*.safetensors` beside config.json. A model that is not a local directory (a hub id
vLLM downloads itself) is left to vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

INDEX = "model.safetensors.index.json"


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files vLLM would load from `directory`."""
    index = directory / INDEX
    if index.is_file():
        try:
            names = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (ValueError, AttributeError):
            names = set()  # an unreadable index: vLLM's own error, not this check's
        return sorted(directory / n for n in names if (directory / n).is_file())
    return sorted(directory.glob("*.safetensors"))


def check_local_weights(model: str | None) -> int:
    """Raise safetensors' own SafetensorError for the first weights file of the model directory
    whose header does not describe the file; the number of files checked."""
    if not model or not Path(model).is_dir():
        return 0
    from safetensors import safe_open

    files = weight_files(Path(model))
    for path in files:
        with safe_open(str(path), framework="pt"):
            pass
    return len(files)
