"""How many times something may be restarted: at most `max_restarts` within any `window_s` seconds.

Why: rebuilding a dead engine in-process is worth it when deaths are rare; an engine that keeps
dying (a request that kills it every time, a failing host) should end the process instead, so that
the orchestrator replaces the instance and operators see the crash loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_restarts = max(0, int(max_restarts))
        self.window_s = float(window_s)
        self._clock = clock
        self._times: deque[float] = deque()

    def _prune(self, now: float) -> None:
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()

    def used(self) -> int:
        """Restarts within the window ending now."""
        self._prune(self._clock())
        return len(self._times)

    def take(self) -> bool:
        """Count one restart and say yes, or say no when the window holds `max_restarts` already."""
        now = self._clock()
        self._prune(now)
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True
