"""The disk tier's size limit, kept across restarts.

LMCache 0.5.6's `fs` L2 adapter writes one file per chunk and has no capacity limit, and a cache
directory that outlives the server holds files of earlier runs that no running process knows
about. The keeper counts every chunk file in the directory (all namespaces: the limit is the
volume's), at start before the cache server runs and then periodically, and deletes the oldest
(by modification time: when the chunk was stored) until the total is within the limit. Deleting
under a running server is safe: the adapter finds a chunk by its file, so a deleted one is a miss.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK_SUFFIX = ".data"
"""LMCache's fs adapter names each chunk `<key>.data` (temporary files end in `.tmp`)."""
DEFAULT_INTERVAL_S = 30.0


@dataclass(frozen=True)
class SweepResult:
    files: int
    bytes: int
    removed_files: int
    removed_bytes: int


def chunk_files(directory: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every chunk file under `directory`, oldest first."""
    found: list[tuple[float, int, Path]] = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            if not name.endswith(CHUNK_SUFFIX):
                continue
            path = Path(root, name)
            try:
                st = path.stat()
            except OSError:  # removed meanwhile
                continue
            found.append((st.st_mtime, st.st_size, path))
    found.sort(key=lambda item: (item[0], str(item[2])))
    return found


def sweep(directory: Path, limit_bytes: int) -> SweepResult:
    """Delete the oldest chunk files until those left take at most `limit_bytes`."""
    files = chunk_files(directory)
    total = sum(size for _, size, _ in files)
    removed_files = removed_bytes = 0
    for _, size, path in files:
        if total - removed_bytes <= limit_bytes:
            break
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("disk tier: could not remove %s: %s", path, e)
            continue
        removed_files += 1
        removed_bytes += size
    return SweepResult(len(files) - removed_files, total - removed_bytes, removed_files, removed_bytes)


class DiskBudgetKeeper:
    """Sweeps the disk tier at start and every `interval_s` from a daemon thread."""

    def __init__(self, directory: Path, limit_bytes: int, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        self.interval_s = interval_s
        self.last: SweepResult | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_now(self) -> SweepResult:
        result = sweep(self.directory, self.limit_bytes)
        self.last = result
        if result.removed_files:
            log.info(
                "disk tier %s: removed the %d oldest chunk files (%.1f MiB) to stay within %.1f MiB; %d files "
                "(%.1f MiB) kept", self.directory, result.removed_files, result.removed_bytes / 2**20,
                self.limit_bytes / 2**20, result.files, result.bytes / 2**20,
            )
        return result

    def start(self) -> SweepResult:
        """Count and trim what earlier runs left, then keep trimming in the background."""
        first = self.sweep_now()
        log.info(
            "disk tier %s: %d chunk files (%.1f MiB) found at start, limit %.1f MiB",
            self.directory, first.files + first.removed_files, (first.bytes + first.removed_bytes) / 2**20,
            self.limit_bytes / 2**20,
        )
        self._thread = threading.Thread(target=self._run, name="lmcache-disk-budget", daemon=True)
        self._thread.start()
        return first

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep_now()
            except OSError as e:  # the volume went away: say so, try again next time
                log.warning("disk tier %s: sweep failed: %s", self.directory, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
