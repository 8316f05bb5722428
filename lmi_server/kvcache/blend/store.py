"""Segments' KV kept per chunk in files under one directory, shared by the engine's scheduler
(which asks how much of a segment is there) and its worker (which reads and writes the KV).

Why not the LMCache server: its chunks are the raw bytes of whole vLLM blocks, keyed by a hash
chain from the request's first token, and a segment starts anywhere inside a block (DESIGN.md,
"What is missing in the MP protocol"). A segment's KV is therefore kept here token by token, K at
segment-local positions (0..), under the position-independent chunk keys of `segments.py`: chunk
i's key covers the segment's tokens [0, (i + 1) x chunk_size), so the tokens found are the run of
chunk files present from the first.

The directory is a tmpfs (/dev/shm) by default: the scheduler's lookup is a `stat` per chunk and
the worker's read maps the file. Writes go to a temporary name and are renamed into place, so a
reader never sees half a chunk. The store keeps itself under `max_bytes` by deleting the chunks
read or written longest ago (a read touches the file). A chunk deleted between the scheduler's
lookup and the worker's read is a miss: the worker computes those tokens instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from lmi_server.kvcache.blend.segments import ChunkKey, segment_chunk_keys
from lmi_server.kvcache.blend.settings import STORE_PREFIX

logger = logging.getLogger("lmi_server.kvcache.blend.store")

LayerKV = tuple[torch.Tensor, torch.Tensor]
SUFFIX = ".kv"
CONTEXT_SUFFIX = ".ctx"
"""An empty marker `<last chunk key>.<context key>.ctx`: the segment's KV was computed in full after
the prompt prefix of that context key (`segments.ContextKeys`)."""
STATS_FILE = "stats.json"


class SegmentStore:
    """Per-chunk KV files of segments, keyed by `segments.segment_chunk_keys(tokens, salt)`."""

    def __init__(self, root: str | os.PathLike, *, chunk_size: int, max_bytes: int) -> None:
        if chunk_size <= 0 or max_bytes <= 0:
            raise ValueError(f"chunk_size ({chunk_size}) and max_bytes ({max_bytes}) must be positive")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _path(self, key: ChunkKey) -> Path:
        return self.root / f"{key.hex()}{SUFFIX}"

    def keys(self, token_ids: Sequence[int], salt: bytes) -> list[ChunkKey]:
        return segment_chunk_keys(token_ids, salt, self.chunk_size)

    def cached_tokens(self, token_ids: Sequence[int], salt: bytes) -> int:
        """How many of the segment's first tokens are stored: the chunks present from the first on."""
        found = 0
        for key in self.keys(token_ids, salt):
            if not self._path(key).exists():
                break
            found = key.end
        return found

    def _context_path(self, token_ids: Sequence[int], salt: bytes, context: bytes) -> Path | None:
        keys = self.keys(token_ids, salt)
        return self.root / f"{keys[-1].hex()}.{context.hex()[:32]}{CONTEXT_SUFFIX}" if keys else None

    def mark_exact(self, token_ids: Sequence[int], salt: bytes, context: bytes) -> None:
        """Record that the stored segment's KV is exact after the prefix `context` keys."""
        path = self._context_path(token_ids, salt, context)
        if path is not None:
            path.touch()

    def is_exact(self, token_ids: Sequence[int], salt: bytes, context: bytes) -> bool:
        """The segment is stored and its KV was computed after this very prefix."""
        path = self._context_path(token_ids, salt, context)
        return path is not None and path.exists()

    def load(self, token_ids: Sequence[int], salt: bytes, n_tokens: int) -> list[LayerKV] | None:
        """Per-layer K and V `[n_tokens, kv_heads, head_dim]` of the segment's first `n_tokens` (whole
        chunks, or the whole segment), K at positions 0..; None where a chunk has gone since."""
        parts: list[torch.Tensor] = []
        for key in self.keys(token_ids, salt):
            if key.start >= n_tokens:
                break
            path = self._path(key)
            try:
                parts.append(torch.load(path, map_location="cpu", mmap=True, weights_only=True))
                os.utime(path)
            except (FileNotFoundError, RuntimeError, OSError):
                return None
        if not parts:
            return None
        stacked = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
        if stacked.shape[2] != n_tokens:
            return None
        return [(layer[0], layer[1]) for layer in stacked]

    def save(self, token_ids: Sequence[int], salt: bytes, kv: Sequence[LayerKV], *, skip_tokens: int = 0,
             context: bytes | None = None) -> int:
        """Store the segment's chunks from `skip_tokens` (a chunk boundary: those before are stored
        already) to its end; `kv` covers the whole segment, K at positions 0... With `context` (the
        KV was computed in full after that prefix), the segment is marked exact there, provided
        every chunk stored is this KV (none kept from another prompt). Returns bytes written."""
        stacked = torch.stack([torch.stack((k, v)) for k, v in kv])  # [layers, 2, tokens, heads, dim]
        if stacked.shape[2] != len(token_ids):
            raise ValueError(f"KV for {len(token_ids)} tokens expected, got {stacked.shape[2]}")
        written = 0
        ours = skip_tokens == 0
        for key in self.keys(token_ids, salt):
            path = self._path(key)
            if key.start < skip_tokens or path.exists():
                ours = False
                continue
            fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
            os.close(fd)
            try:
                torch.save(stacked[:, :, key.start : key.end].clone(), tmp)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written += path.stat().st_size
        if context is not None and ours:
            self.mark_exact(token_ids, salt, context)
        if written:
            self.evict()
        return written

    def size_bytes(self) -> int:
        return store_bytes(self.root)

    def _chunks(self) -> list[os.DirEntry]:
        return _chunk_entries(self.root)

    def evict(self) -> int:
        """Delete the chunks used longest ago until the store holds at most `max_bytes`; the count."""
        with self._lock:
            entries = []
            for entry in self._chunks():
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, entry.path))
            total = sum(size for _, size, _ in entries)
            gone: set[str] = set()
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                gone.add(os.path.basename(path)[: -len(SUFFIX)])
                total -= size
            if gone:  # the exact markers go with the chunks they vouch for: one more directory scan
                for entry in os.scandir(self.root):
                    if entry.name.endswith(CONTEXT_SUFFIX) and entry.name.split(".", 1)[0] in gone:
                        Path(entry.path).unlink(missing_ok=True)
            return len(gone)


def _chunk_entries(root: str | os.PathLike) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(root) if e.name.endswith(SUFFIX)]
    except FileNotFoundError:
        return []


def store_bytes(root: str | os.PathLike) -> int:
    """Bytes of chunk files under `root` (0 for a store not created yet)."""
    total = 0
    for entry in _chunk_entries(root):
        try:
            total += entry.stat().st_size
        except FileNotFoundError:
            pass  # evicted meanwhile
    return total


def remove_store(root: str | os.PathLike) -> None:
    """A server's own store goes with it (its shutdown)."""
    shutil.rmtree(root, ignore_errors=True)


def remove_stale_stores(base: str | os.PathLike) -> list[str]:
    """Delete the stores of servers that are gone (killed before their shutdown removed their own):
    segment KV in a tmpfs is memory until someone deletes it. Returns what was removed."""
    removed = []
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = entry.name[len(STORE_PREFIX):]
        if not entry.name.startswith(STORE_PREFIX) or not pid.isdigit() or not entry.is_dir() or _alive(int(pid)):
            continue
        remove_store(entry.path)
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BlendCounters:
    """Totals of what blending did, written by the worker next to the store and read by /metrics
    in the API process (the engine runs in other processes)."""

    FIELDS = ("blended_requests", "reused_tokens", "recomputed_tokens", "computed_tokens",
              "stored_segments", "stored_bytes", "missed_loads", "blend_seconds")

    def __init__(self, root: str | os.PathLike) -> None:
        self.path = Path(root) / STATS_FILE
        self.values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **deltas: float) -> None:
        for name, delta in deltas.items():
            self.values[name] += delta
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.values))
        os.replace(tmp, self.path)

    @classmethod
    def read(cls, root: str | os.PathLike) -> dict[str, float]:
        try:
            data = json.loads((Path(root) / STATS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        return {name: float(data.get(name, 0)) for name in cls.FIELDS}
