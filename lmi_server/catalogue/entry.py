"""What the server knows about one model that ships with it: one `BuiltinModel` per model.

Everything that differs between a built-in model and a user's model is a field here, so callers
ask the entry ("does this model get tool calling by default?") instead of comparing names.
The functions that find or build a model's files are referenced, not called, at import: this
module and the entries import nothing heavy (no vLLM, no torch, no `lmi_server.demo`), so
`config/` can read the catalogue and stay importable without an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

Kind = Literal["generate", "embed", "classify"]
DraftSchedule = list[tuple[int, int, int]]

_EMPTY: Mapping = MappingProxyType({})


class BuiltinUnavailable(RuntimeError):
    """A built-in model's files cannot be found or built here; the message says what to install."""


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in model (see the module docstring)."""

    name: str
    """`option.model_id` that selects it, and the name it is served under."""
    source: str
    """`ResolvedModel.source` of a configuration that serves it."""
    note: str
    """The start-up note that says which built-in model is served."""
    locate: Callable[[], Path]
    """Its directory, without building anything (what `lmi-server config` shows)."""
    build: Callable[[], Path] | None = None
    """Builds or converts it at start-up when serving; None: `locate` is already servable."""
    kind: Kind | None = None
    """What it does; None: read from its files like a user's model."""
    reads_own_files: bool = False
    """Its files are there before start-up (kind and tensor parallel look at them)."""
    cpu_dtype: str | None = "float32"
    """dtype on a CPU host where the user set none (`runtime.defaults.builtin_defaults` says why)."""
    cpu_eager: bool = True
    """enforce_eager on a CPU host where the user set neither it nor a compilation config."""
    tool_calling: bool = False
    """vLLM's pythonic tool parser and compact structured output on by default."""
    drafts: Mapping[str, Callable[[], Path | None]] = field(default_factory=lambda: _EMPTY)
    """Speculative method -> the shipped draft head's directory (None when it is not there)."""
    draft_tokens: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Speculative method -> tokens drafted per step when option.num_speculative_tokens is unset."""
    draft_tokens_by_batch: Mapping[str, DraftSchedule] = field(default_factory=lambda: _EMPTY)
    """Speculative method -> vLLM's `num_speculative_tokens_per_batch_size` default."""
    adapters_dir: Callable[[], Path] | None = None
    """Example LoRA adapters trained for it, used when the model directory has none."""

    def directory(self) -> Path:
        """`locate()`, with a missing model reported as BuiltinUnavailable."""
        try:
            return self.locate()
        except FileNotFoundError as exc:
            raise BuiltinUnavailable(str(exc)) from exc

    def servable_directory(self) -> Path:
        """The directory the engine loads, built first when the model is built at start-up."""
        return self.build() if self.build is not None else self.directory()

    def draft(self, method: str) -> Path | None:
        """The draft head shipped for `method`, when there is one."""
        find = self.drafts.get(method)
        return find() if find is not None else None
