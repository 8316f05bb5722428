"""Bounded label values for per-tenant and per-adapter Prometheus series.

Why: a tenant named by a header, or adapters registered at run time, could otherwise make /metrics
grow without bound (every label value is a series kept for the process's life). The first `limit`
distinct names seen keep their own label; every later one is counted under "other". The limits are
option.metrics_max_tenants and option.metrics_max_adapters (`configure`, called once at start-up).
API keys are never label values: tenants are labelled by the name the key file gives them.
"""

from __future__ import annotations

import threading

OTHER = "other"
BASE = "base"
"""The adapter label of a request to the base model (no adapter)."""
DEFAULT_LIMIT = 20


class LabelBound:
    """First-seen names up to `limit` keep their label; the rest map to OTHER."""

    def __init__(self, limit: int = DEFAULT_LIMIT, always: tuple[str, ...] = ()):
        self.limit = limit
        self.always = set(always)  # labels that never count against the limit (e.g. the base model)
        self._seen: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, name: str | None) -> str:
        name = str(name) if name is not None else OTHER
        if name in self.always or name in self._seen:
            return name
        with self._lock:
            if name in self._seen:
                return name
            if len(self._seen) < self.limit:
                self._seen.append(name)
                return name
        return OTHER

    def seen(self) -> list[str]:
        return list(self._seen)

    def reset(self, limit: int | None = None) -> None:
        with self._lock:
            self._seen.clear()
            if limit is not None:
                self.limit = limit


tenant_label = LabelBound()
adapter_label = LabelBound(always=(BASE,))


def configure(max_tenants: int | None = None, max_adapters: int | None = None) -> None:
    """Set the bounds (start-up; names seen before keep their label)."""
    if max_tenants is not None:
        tenant_label.limit = max_tenants
    if max_adapters is not None:
        adapter_label.limit = max_adapters
