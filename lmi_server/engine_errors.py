"""vLLM's engine processes hand the errors they die of to the server process, through a file.

Why: the engine core and its workers are processes of their own. When one fails while the engine
starts, the server's process only learns "Engine core initialization failed. See root cause
above."; the root cause (a truncated weight file, too little /dev/shm) is in those processes' own
log. vLLM loads its general plugins in every one of its processes (`vllm_plugin`, registered in
pyproject.toml); when the server has set LMI_ENGINE_ERROR_FILE, each error vLLM logs with an
exception is appended to that file as one JSON line, and `startup_failure` names the cause from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

ENV = "LMI_ENGINE_ERROR_FILE"
MAX_FILE_BYTES = 256 * 1024  # a crash loop of errors must not fill the disk
MAX_CHAIN = 5


def _exception_lines(exc: BaseException) -> list[str]:
    lines: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(lines) < MAX_CHAIN:
        message = " ".join(str(current).split())
        lines.append(f"{type(current).__name__}: {message}" if message else type(current).__name__)
        current = current.__cause__ or current.__context__
    return lines


class ErrorReportHandler(logging.Handler):
    """Appends each record at ERROR or above that carries an exception to the report file."""

    def __init__(self, path: str):
        super().__init__(level=logging.ERROR)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return
        try:
            if os.path.getsize(self.path) > MAX_FILE_BYTES:
                return
            entry = {"pid": os.getpid(), "logger": record.name, "errors": _exception_lines(exc)}
            # One write per line in append mode: lines of several processes do not interleave.
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        except Exception:  # noqa: BLE001 - reporting must never take a process down
            pass


def vllm_plugin() -> None:
    """vLLM general plugin: in each engine process, report vLLM's fatal errors to the server."""
    path = os.environ.get(ENV)
    if not path:
        return
    logger = logging.getLogger("vllm")
    if not any(isinstance(h, ErrorReportHandler) for h in logger.handlers):
        logger.addHandler(ErrorReportHandler(path))


class ErrorReports:
    """The server's side: one report file per server process, emptied before each engine build."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="lmi-engine-errors-", suffix=".jsonl")
        os.close(fd)
        self.path = Path(name)

    def arm(self) -> None:
        """Empty the file and point vLLM's processes started from now on at it."""
        self.path.write_text("")
        os.environ[ENV] = str(self.path)

    def errors(self) -> list[str]:
        """Every reported error line, in the order reported, innermost cause of each report first."""
        out: list[str] = []
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return out
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                out.extend(reversed(json.loads(line)["errors"]))
        return out

    def close(self) -> None:
        if os.environ.get(ENV) == str(self.path):
            del os.environ[ENV]
        with contextlib.suppress(OSError):
            self.path.unlink()
