"""The lazy LoRA registry: register now (no weights), load on first use, keep the LRU resident.

Life of an adapter:
  registered   directory validated (config, safetensors header, shapes against the base model),
               model.py imported (from a remote src only with option.trust_remote_code, else the
               adapter is refused: `src_paths.refuse_remote_code`); no weights read.
               `discover()` does this for every sub-directory of the adapters root at start-up.
  resident     first request: weights loaded into vLLM by vLLM's own
               `OpenAIServingModels.load_lora_adapter` (a `LoRARequest` the engine caches).
               One asyncio.Lock per name, so concurrent first requests load once.
  evicted      more resident adapters than vLLM keeps (`max_cpu_loras`, default `max_loras`):
               the least recently used idle, unpinned one is removed from the engine
               (`remove_lora`) and reloaded transparently on its next request.
  deleted      DELETE: new requests get 404 at once; requests in flight keep their lease and
               finish; the engine copy is removed when the last one ends.

Management follows LMI's adapter API (`add`, `update`, `remove`): `preload` (default true, as LMI)
loads the weights at registration, `pin` (default false) loads them and keeps them resident;
pin without preload is refused, and so is unpinning (vLLM cannot unpin: delete and register again).
Adapters found by `discover()` at start-up stay lazy (preload false).

The registry never talks to vLLM directly: a `LoRABackend` does (the vLLM one is in
`vllm_backend.py`; unit tests use a fake), so the LRU and lock logic is testable without an engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from lmi_server.adapters import src_paths
from lmi_server.adapters.entry import AdapterEntry, Lease, LoRABackend, weights_fingerprint
from lmi_server.adapters.errors import AdapterConflict, AdapterNotFound, AdapterUnavailable
from lmi_server.adapters.formatters import FormatterError, load_formatters
from lmi_server.adapters.validation import (
    AdapterInvalid,
    BaseModelInfo,
    has_adapter_files,
    inspect_adapter,
    validate_name,
)
from lmi_server.metric_labels import OTHER, adapter_label
from lmi_server.source_ref import is_remote

log = logging.getLogger(__name__)

ADAPTER_LOADS = Counter("lmi_adapter_loads", "LoRA adapter weight loads into the engine (first use and reloads)", ["adapter"])
ADAPTER_EVICTIONS = Counter("lmi_adapter_evictions", "LoRA adapters evicted from the engine (least recently used)", ["adapter"])
ADAPTERS_RESIDENT = Gauge("lmi_adapters_resident", "LoRA adapters whose weights are loaded in the engine")
ADAPTER_RESIDENT = Gauge(
    "lmi_adapter_resident", "1 while the adapter's weights are loaded in the engine, else 0 (\"other\": how many "
    "adapters past option.metrics_max_adapters are)", ["adapter"],
)
ADAPTERS_REGISTERED = Gauge("lmi_adapters_registered", "LoRA adapters registered (weights not necessarily loaded)")

PIN_WITHOUT_PRELOAD = "Can not set preload to false and pin to true"
PAGE_LIMIT = 100  # LMI's list API: default and largest page


class AdapterRegistry:
    """Registered adapters by name, the LRU of resident ones, and LMI's management operations."""

    def __init__(
        self,
        backend: LoRABackend,
        *,
        root: Path | None,
        allowed_roots: list[Path] | None = None,
        max_rank: int | None = None,
        capacity: int = 1,
        base: BaseModelInfo | None = None,
        trust_remote_code: bool = False,
    ):
        self.backend = backend
        self.root = root
        self.allowed_roots = [p.resolve() for p in (allowed_roots if allowed_roots is not None else ([root] if root else []))]
        self.max_rank = max_rank
        self.capacity = max(1, capacity)
        self.base = base
        self.trust_remote_code = trust_remote_code  # import model.py of an adapter from a remote src
        self.adapters: dict[str, AdapterEntry] = {}
        self.failed: dict[str, str] = {}
        self._lru: OrderedDict[str, AdapterEntry] = OrderedDict()  # resident, least recent first
        self._residency = asyncio.Lock()

    # ------------------------------------------------------------------ registration (sync, no weights)

    def discover(self) -> tuple[list[str], dict[str, str]]:
        """Register every sub-directory of the root holding adapter files. Returns (ok, failed)."""
        ok: list[str] = []
        if self.root is None or not self.root.is_dir():
            log.info("adapters: no adapter directory at %s", self.root)
            return ok, {}
        start = time.perf_counter()
        for child in sorted(self.root.iterdir(), key=lambda p: p.name):
            if not child.is_dir() or not has_adapter_files(child):
                continue
            try:
                self.register(child.name, self.confine(child, str(child)))
                ok.append(child.name)
            except (AdapterInvalid, FormatterError, AdapterConflict) as exc:
                self.failed[child.name] = str(exc)
                log.error("adapters: %s", exc)
        log.info(
            "adapters: registered %d from %s in %.3f s (%d failed)",
            len(ok), self.root, time.perf_counter() - start, len(self.failed),
        )
        return ok, dict(self.failed)

    def resolve_src(self, src: str) -> Path:
        """A local directory inside an allowed root (symlinks resolved), else AdapterInvalid."""
        return src_paths.resolve_src(src, self.allowed_roots)

    def confine(self, path: Path, shown: str) -> Path:
        """The resolved directory when it and its files lie inside an allowed root (`src_paths.confine`)."""
        return src_paths.confine(path, shown, self.allowed_roots)

    def register(self, name: str, path: Path, *, pin: bool = False) -> AdapterEntry:
        """Validate and register; on any failure nothing is registered (all-or-nothing)."""
        validate_name(name)
        if name in self.adapters or self._by_alias(name) is not None:
            raise AdapterConflict(f"adapter {name!r} is already registered; DELETE it first")
        if self.backend.is_base_model(name):
            raise AdapterInvalid(f"adapter name {name!r} is the base model's name; choose another")
        spec = inspect_adapter(name, path, max_rank=self.max_rank, base=self.base)
        formatters = load_formatters(name, path)
        entry = AdapterEntry(spec=spec, formatters=formatters, pinned=pin)
        self.adapters[name] = entry  # the one mutation: only after everything succeeded
        self.failed.pop(name, None)
        ADAPTERS_REGISTERED.set(len(self.adapters))
        return entry

    def get(self, name: str) -> AdapterEntry:
        """The adapter registered as `name`, else the one registered with `name` as its alias."""
        entry = self.adapters.get(name) or self._by_alias(name)
        if entry is not None:
            return entry
        if name in self.failed:
            raise AdapterUnavailable(f"adapter {name!r} failed to register: {self.failed[name]}")
        raise AdapterNotFound(name, list(self.adapters))

    def _by_alias(self, alias: str) -> AdapterEntry | None:
        return next((e for e in self.adapters.values() if e.alias == alias), None)

    def _check_alias(self, name: str, alias: str | None) -> None:
        """An alias names one adapter: neither another adapter's name nor its alias."""
        if alias is None or alias == name:
            return
        try:
            validate_name(alias)
        except AdapterInvalid as exc:
            raise AdapterInvalid(f"alias: {exc}") from None
        if alias in self.adapters or self._by_alias(alias) is not None:
            raise AdapterConflict(f"alias {alias!r} already names a registered adapter; DELETE it first")

    def describe(self) -> list[dict[str, Any]]:
        return [e.describe() for e in sorted(self.adapters.values(), key=lambda e: e.name)]

    def page(self, limit: int = PAGE_LIMIT, token: int = 0) -> tuple[list[dict[str, Any]], str | None]:
        """One page of `describe()` as LMI's list pages: `limit` outside 0..100 means 100, a negative
        token means 0; the next page's token (a string) when more adapters follow, else None."""
        if limit < 0 or limit > PAGE_LIMIT:
            limit = PAGE_LIMIT
        token = max(0, token)
        items = self.describe()
        last = min(token + limit, len(items))
        return items[token:last], (str(last) if last < len(items) else None)

    # ------------------------------------------------------------------ loading and leases

    async def acquire(self, name: str) -> Lease:
        """Ensure the adapter is resident and count one request in flight on it."""
        entry = self.get(name)
        async with entry.lock:
            if entry.deleted:
                raise AdapterNotFound(name, list(self.adapters))
            if not entry.resident:
                await self._load(entry)
            entry.in_flight += 1
            entry.last_used = time.time()
            if entry.name in self._lru:
                self._lru.move_to_end(entry.name)
        return Lease(entry, self)

    async def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        entry = lease.entry
        entry.in_flight -= 1
        if entry.deleted and entry.in_flight == 0:
            await self._finish_delete(entry)

    async def _load(self, entry: AdapterEntry) -> None:
        async with self._residency:
            await self._make_room(exclude=entry.name)
            start = time.perf_counter()
            try:
                entry.fingerprint = await asyncio.to_thread(weights_fingerprint, entry.spec.path)
                handle = await self.backend.load(entry.name, entry.spec.path)
            except Exception as exc:  # noqa: BLE001 - reported to the client as a failed dependency
                log.error("adapters: loading %r failed: %s", entry.name, exc)
                raise AdapterUnavailable(f"adapter {entry.name!r} could not be loaded: {exc}") from exc
            entry.handle = handle
            entry.loads += 1
            self._lru[entry.name] = entry
            self._lru.move_to_end(entry.name)
            if entry.pinned:
                await self.backend.pin(handle)
            ADAPTER_LOADS.labels(adapter_label(entry.name)).inc()
            self._resident_gauges()
            log.info(
                "adapters: loaded %r in %.3f s (load #%d, %d resident of %d)",
                entry.name, time.perf_counter() - start, entry.loads, len(self._lru), self.capacity,
            )

    async def _make_room(self, exclude: str) -> None:
        while len(self._lru) >= self.capacity:
            victim = next(
                (e for n, e in self._lru.items() if n != exclude and e.in_flight == 0 and not e.pinned and not e.lock.locked()),
                None,
            )
            if victim is None:
                # Every resident adapter is busy or pinned: vLLM's own LRU cache makes room.
                log.info("adapters: all %d resident adapters busy or pinned; vLLM's cache makes room", len(self._lru))
                return
            await self._evict(victim)

    async def _evict(self, entry: AdapterEntry, reason: str = "least recently used") -> None:
        handle, entry.handle = entry.handle, None
        if self._lru.get(entry.name) is entry:  # a newer entry of the same name keeps its place
            self._lru.pop(entry.name)
        self._resident_gauges()
        if handle is not None:
            try:
                await self.backend.unload(entry.name, handle)
            except Exception:  # noqa: BLE001 - the engine copy is gone or will be reloaded anyway
                log.exception("adapters: unloading %r failed", entry.name)
        if not entry.deleted:
            ADAPTER_EVICTIONS.labels(adapter_label(entry.name)).inc()
            log.info("adapters: evicted %r (%s)", entry.name, reason)

    def _resident_gauges(self) -> None:
        """lmi_adapters_resident, and per adapter label how many of its adapters are resident."""
        ADAPTERS_RESIDENT.set(len(self._lru))
        counts = dict.fromkeys(adapter_label.seen(), 0)
        for name in self._lru:
            label = adapter_label(name)
            counts[label] = counts.get(label, 0) + 1
        if OTHER in counts or len(adapter_label.seen()) >= adapter_label.limit:
            counts.setdefault(OTHER, 0)
        for label, value in counts.items():
            ADAPTER_RESIDENT.labels(adapter=label).set(value)

    def engine_replaced(self, backend: LoRABackend) -> None:
        """The engine was rebuilt after it died: every registration stays, but nothing is resident
        in the new engine, so each adapter loads again on its next use."""
        self.backend = backend
        for entry in self.adapters.values():
            entry.handle = None
        self._lru.clear()
        self._resident_gauges()
        log.info("adapters: engine replaced; %d registered adapters load again on their next use", len(self.adapters))

    # ------------------------------------------------------------------ management

    async def add(
        self, name: str, src: str, *, preload: bool = True, pin: bool = False, alias: str | None = None
    ) -> AdapterEntry:
        """LMI's register: validate, register, and (preload, the default) load the weights now;
        `pin` keeps them resident. A preload that cannot load leaves nothing registered. `alias`
        (SageMaker's) is a second name requests may use."""
        if pin and not preload:
            raise AdapterInvalid(PIN_WITHOUT_PRELOAD)
        self._check_alias(name, alias)
        path = await asyncio.to_thread(self.resolve_src, src) if is_remote(src) else self.resolve_src(src)
        src_paths.refuse_remote_code(name, src, path, trusted=self.trust_remote_code)
        entry = self.register(name, path, pin=pin)
        entry.preload, entry.source, entry.alias = preload, src, alias
        log.info("adapters: registered %r from %s (preload %s, pin %s)", name, path, preload, pin)
        if preload:
            try:
                lease = await self.acquire(name)
            except AdapterUnavailable:
                self.adapters.pop(name, None)
                ADAPTERS_REGISTERED.set(len(self.adapters))
                raise
            await self.release(lease)
        return entry

    async def update(
        self, name: str, *, src: str | None = None, preload: bool | None = None, pin: bool | None = None
    ) -> AdapterEntry:
        """LMI's update: what is not given keeps its value. preload false -> true loads now,
        true -> false unloads (when idle and unpinned; a busy adapter is left to the LRU);
        pin false -> true loads and pins. Changing `src` and unpinning are refused, as in LMI."""
        entry = self.get(name)
        if src is not None and src != entry.source and self._local_path(src) != entry.spec.path:
            raise AdapterInvalid(
                f"adapter {name!r}: changing src is not supported (registered from {entry.spec.path}); "
                "DELETE the adapter and register it again"
            )
        new_pin = entry.pinned if pin is None else pin
        new_preload = entry.preload if preload is None else preload
        if entry.pinned and not new_pin:
            raise AdapterInvalid(
                f"Unpinning adapter is not supported. To unpin adapter {name!r}, please delete the adapter "
                "and re-register it without pinning."
            )
        if new_pin and not new_preload:
            raise AdapterInvalid(PIN_WITHOUT_PRELOAD)
        if new_preload or new_pin:
            pinned_before, loads_before = entry.pinned, entry.loads
            entry.pinned = new_pin  # a load from here on pins (see _load)
            try:
                lease = await self.acquire(name)
            except AdapterUnavailable:
                entry.pinned = pinned_before
                raise
            try:
                if new_pin and not pinned_before and entry.loads == loads_before and entry.handle is not None:
                    await self.backend.pin(entry.handle)  # already resident: pin the engine copy now
            finally:
                await self.release(lease)
        elif entry.preload and entry.resident:
            async with entry.lock:
                if entry.resident and entry.in_flight == 0 and not entry.pinned:
                    async with self._residency:
                        await self._evict(entry, reason="preload set to false")
        entry.preload = new_preload
        log.info("adapters: updated %r (preload %s, pin %s)", name, entry.preload, entry.pinned)
        return entry

    def _local_path(self, src: str) -> Path | None:
        """Where a local `src` points (None for a URL or a path that is refused): update compares it."""
        if "://" in src:
            return None
        try:
            return self.resolve_src(src)
        except AdapterInvalid:
            return None

    async def remove(self, name: str) -> AdapterEntry | None:
        """Unregister (by name or alias); None when the name was only a failed registration (now forgotten)."""
        entry = self.adapters.get(name) or self._by_alias(name)
        if entry is None:
            if self.failed.pop(name, None) is not None:
                return None
            raise AdapterNotFound(name, list(self.adapters))
        name = entry.name
        del self.adapters[name]
        ADAPTERS_REGISTERED.set(len(self.adapters))
        entry.deleted = True
        async with entry.lock:  # a load in progress completes first
            pass
        if entry.in_flight == 0:
            await self._finish_delete(entry)
        else:
            # Requests in flight keep the engine copy (their LoRARequest, its int id); the name is
            # freed now so that the same name can be registered and loaded again meanwhile.
            if entry.handle is not None:
                self.backend.detach(entry.name, entry.handle)
            log.info("adapters: %r deleted; %d request(s) in flight finish first", name, entry.in_flight)
        return entry

    async def _finish_delete(self, entry: AdapterEntry) -> None:
        async with self._residency:
            await self._evict(entry)
        log.info("adapters: %r removed", entry.name)


