"""How a node of a group ends when the group is broken: one line, its children killed, a non-zero exit.

Why: LeaderWorkerSet's RecreateGroupOnPodRestart recreates the whole group when one pod restarts,
so a node that exits is the signal that heals the group; a node that stays up with half an engine
does not. The engine processes are killed first (a worker rank waiting on a peer that is gone
never returns), and the process leaves with os._exit: an orderly shutdown would wait on them.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

GROUP_BROKEN_EXIT_CODE = 5


def kill_children() -> None:
    """Every process this one started (vLLM's engine core and workers), without waiting for them."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil ships with vLLM
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def end_group(line: str, code: int = GROUP_BROKEN_EXIT_CODE) -> None:
    log.error("%s; exiting with code %d so that the group is recreated", line, code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    kill_children()
    os._exit(code)
