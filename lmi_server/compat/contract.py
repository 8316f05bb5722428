"""One row per private upstream name the seam uses, and the check of a row against what is installed.

Rows with `private=False` are public-named entry points of vLLM's internal modules (its server's
app state, its serving classes) that callers use in place: not patched and no private state, but
undocumented, so the same check covers them on an upgrade.

A row says where the name lives (module, then a dotted path inside it), what we do with it, which
parameters we pass (checked by name with `inspect.signature`), or, for an attribute that an
object's constructor assigns, which method assigns it (checked in that method's source: no
instance is built). `check` answers None when the installed package still offers what the row
relies on, else one sentence saying what changed.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

KINDS = ("call", "replace", "read", "write")


@dataclass(frozen=True)
class Use:
    """One private name of vLLM or LMCache that the seam touches."""

    upstream: str  # "vllm" or "lmcache"
    module: str  # the module the name lives in, e.g. "vllm.v1.engine.utils"
    path: str  # dotted inside the module: "get_mp_context", "OpenAIServingResponses._extract_prompt_len"
    kind: str  # call | replace | read | write
    relies: str  # what we rely on, in a sentence
    used_by: str  # the seam function, e.g. "compat.vllm.replace_mp_context"
    why: str  # why no supported hook covers it
    params: tuple[str, ...] | None = None  # parameter names (in order) of a callable, else None
    assigned_in: str | None = None  # for an instance attribute: "Class.method" whose source assigns it
    private: bool = True  # False: a public-named entry point of an internal module, called in place

    @property
    def name(self) -> str:
        return f"{self.module}:{self.path}"

    @property
    def member(self) -> str:
        """The last part of the dotted path: the attribute we touch."""
        return self.path.rpartition(".")[2]


def _resolve(module: Any, dotted: str) -> Any:
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check(use: Use) -> str | None:
    """None when the installed upstream still has what `use` relies on, else what changed."""
    try:
        module = importlib.import_module(use.module)
    except ImportError as exc:
        return f"{use.name}: module {use.module} no longer imports ({exc})"
    if use.assigned_in is not None:
        return _check_assigned(module, use)
    try:
        target = _resolve(module, use.path)
    except AttributeError:
        return f"{use.name}: {use.path} no longer exists in {use.module} (used by {use.used_by})"
    if use.params is None:
        return None
    if not callable(target):
        return f"{use.name}: no longer callable (used by {use.used_by})"
    try:
        # A name this process has already replaced stands for the original (`__wrapped__`).
        found = tuple(inspect.signature(inspect.unwrap(target)).parameters)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: presence is all that can be checked
    if found != use.params:
        return f"{use.name}: parameters changed from {use.params} to {found} (used by {use.used_by})"
    return None


def _check_assigned(module: Any, use: Use) -> str | None:
    try:
        method = _resolve(module, use.assigned_in or "")
    except AttributeError:
        return f"{use.name}: {use.assigned_in} no longer exists in {use.module} (used by {use.used_by})"
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return f"{use.name}: the source of {use.assigned_in} cannot be read to find self.{use.member}"
    if f"self.{use.member}" not in source:
        return (f"{use.name}: {use.assigned_in} no longer assigns self.{use.member} "
                f"(used by {use.used_by})")
    return None


def report(uses: tuple[Use, ...]) -> list[tuple[Use, str | None]]:
    """Each row with what changed (None: unchanged)."""
    return [(use, check(use)) for use in uses]
