"""Loggers for code that runs inside vLLM's engine processes, which configure vLLM's loggers only."""

from __future__ import annotations

import logging


def engine_logger(name: str) -> logging.Logger:
    """`name`'s logger with a stderr handler of its own at INFO (once), not propagated: inside the
    engine process nothing else would print its lines."""
    log = logging.getLogger(name)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log
