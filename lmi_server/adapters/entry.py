"""One registered adapter (`AdapterEntry`), a request's hold on it (`Lease`), and what the registry
asks of the engine (`LoRABackend`: the vLLM one is `vllm_backend.py`, unit tests use a fake)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lmi_server.adapters.formatters import Formatters
from lmi_server.adapters.validation import CONFIG_FILE, WEIGHTS_FILES, AdapterSpec, weights_file


def weights_fingerprint(path: Path) -> str:
    """sha256 over the adapter's config and weight files (what the engine loads)."""
    digest = hashlib.sha256()
    weights = weights_file(path)
    for fname in (CONFIG_FILE, weights.name if weights is not None else WEIGHTS_FILES[0]):
        digest.update(fname.encode() + b"\0")
        with open(path / fname, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


class LoRABackend(Protocol):
    def is_base_model(self, name: str) -> bool: ...
    def base_names(self) -> list[str]: ...
    async def load(self, name: str, path: Path) -> Any: ...  # -> handle (LoRARequest)
    async def unload(self, name: str, handle: Any) -> None: ...
    def detach(self, name: str, handle: Any) -> None: ...
    async def pin(self, handle: Any) -> None: ...


@dataclass(eq=False)
class AdapterEntry:
    spec: AdapterSpec
    formatters: Formatters
    pinned: bool = False
    preload: bool = False  # weights loaded at registration (LMI's `preload`)
    source: str | None = None  # `src` as registered through the API (None: found at start-up)
    alias: str | None = None  # SageMaker's X-Amzn-SageMaker-Adapter-Alias at registration
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    handle: Any = None  # vLLM LoRARequest while resident
    in_flight: int = 0
    loads: int = 0
    last_used: float | None = None
    deleted: bool = False
    registered_at: float = field(default_factory=time.time)
    fingerprint: str | None = None  # sha256 of the weight files, computed at each load

    def cache_identity(self) -> str:
        """What KV computed under this adapter is keyed by: its name and the weights in the engine."""
        return f"lora:{self.name}:{self.fingerprint or 'unloaded'}"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def resident(self) -> bool:
        return self.handle is not None

    def describe(self) -> dict[str, Any]:
        s = self.spec
        return {
            "name": s.name,
            "alias": self.alias,
            "src": str(s.path),
            "status": "loaded" if self.resident else "registered",
            "preload": self.preload,
            "pin": self.pinned,  # LMI's name
            "pinned": self.pinned,
            "rank": s.rank,
            "lora_alpha": s.alpha,
            "target_modules": s.target_modules,
            "base_model": s.base_model,
            "input_formatter": self.formatters.has_input,
            "output_formatter": self.formatters.has_output,
            "weight_bytes": s.weight_bytes,
            "weights_file": s.weights_file,
            "loads": self.loads,
            "fingerprint": self.fingerprint,
            "in_flight": self.in_flight,
            "last_used": self.last_used,
        }


@dataclass
class Lease:
    entry: AdapterEntry
    registry: Any = None  # the AdapterRegistry that gave it out (typed loosely: it imports this module)
    released: bool = False

    async def release(self) -> None:
        if self.registry is not None:
            await self.registry.release(self)
