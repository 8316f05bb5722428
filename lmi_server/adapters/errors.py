"""The registry's refusals that are not about an adapter's files (those are `validation.AdapterInvalid`);
`api/errors.py` maps each to its HTTP status."""

from __future__ import annotations


class AdapterNotFound(LookupError):
    def __init__(self, name: str, known: list[str] | None = None):
        self.name = name
        hint = ""
        if known is not None:
            shown = ", ".join(sorted(known)[:10]) + (", ..." if len(known) > 10 else "")
            hint = f"; registered adapters: {shown}" if known else "; no adapters are registered"
        super().__init__(f"adapter {name!r} not found{hint}")


class AdapterUnavailable(RuntimeError):
    """Registered-but-broken (failed registration) or failed to load: the dependency failed (424)."""


class AdapterConflict(ValueError):
    pass
