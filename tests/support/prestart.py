"""Start the suite's servers ahead of their first test, in a thread, while the tests before them run.

Why: an engine start on the 2-core CI host takes 30-80 s, mostly one core's worth of imports, model
loading and a profile run, while the tests before it mostly wait on an engine bound to one core.
Started ahead, that time overlaps other tests instead of adding to the suite's.

A server fixture marked `prestartable` is a generator fixture whose code up to its `yield` starts a
server and waits until it is ready. Before each test, `ahead` looks at the tests still to run,
finds the next such fixture they will ask for and runs that code in a thread; when a test then asks
for the fixture, it takes the running server instead of starting one. The code after `yield` (the
server's stop) runs as it always did, in the main thread. At most two servers wait started ahead,
and only while the host has memory to spare; a fixture whose arguments are not all session-scoped
(a module's own fixture, `request`) starts when it is asked for, as without this module. A test
that times the server's answers is marked `alone`: no start runs beside it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

# Below this much available memory no server is started ahead (an engine with its cache server
# takes about 3.5 GB; the CI host has 24 GB).
MIN_AVAILABLE_BYTES = 8 * 2**30
# Servers started ahead and not yet taken by their fixture, at most: two starts overlap the tests
# before them (and each other) without a third engine's memory.
MAX_WAITING = 2


class _Ahead:
    """A fixture's start-up running (or done) in a thread: its generator, the value it yielded."""

    def __init__(self, gen: Iterator[Any]):
        self.gen = gen
        self.value: Any = None
        self.error: BaseException | None = None
        self.taken = False
        self.thread = threading.Thread(target=self._run, name="prestart", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = next(self.gen)
        except BaseException as exc:  # handed to the fixture, which raises it in its test
            self.error = exc

    def take(self) -> Any:
        self.thread.join()
        self.taken = True
        if self.error is not None:
            raise self.error
        return self.value


_ahead: dict[Callable, _Ahead] = {}  # by fixture function
_used: set[Callable] = set()  # fixtures that started (ahead or not)
_plan: dict[int, Any] = {}  # per session: _first_uses


def prestartable(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Mark a generator server fixture (under @pytest.fixture) whose start may run ahead. Its
    arguments are then made early, before the test ahead of it: none may be a fixture whose making
    changes what other tests find (a seed that stops a server)."""

    @functools.wraps(fn)
    def fixture(**kwargs: Any) -> Iterator[Any]:
        _used.add(fixture)
        started = _ahead.get(fixture)
        if started is not None:
            gen, value = started.gen, started.take()
        else:
            gen = fn(**kwargs)
            value = next(gen)
        yield value
        for _ in gen:  # the stop; a fixture yields once
            raise RuntimeError(f"{fn.__name__} yielded twice")

    fixture.prestartable = True
    return fixture


def _first_uses(session: pytest.Session) -> tuple[list[tuple[int, Callable, pytest.Item]], dict[int, int]]:
    """The prestartable fixtures in test order (index of the first test that asks for one, the
    fixture function, that test), and each test's index; computed once per session."""
    if id(session) not in _plan:
        plan, seen = [], set()
        for i, item in enumerate(session.items):
            info = getattr(item, "_fixtureinfo", None)
            for name in getattr(item, "fixturenames", ()):
                defs = info.name2fixturedefs.get(name) if info else None
                func = defs[-1].func if defs else None
                if getattr(func, "prestartable", False) and func not in seen:
                    seen.add(func)
                    plan.append((i, func, item))
        _plan.clear()
        _plan[id(session)] = (plan, {id(item): i for i, item in enumerate(session.items)})
    return _plan[id(session)]


def _arguments(func: Callable, user: pytest.Item) -> dict[str, Any] | None:
    """The fixture's arguments as its first user sees them, or None where one is not
    session-scoped (a module's fixture, `request`): those exist only once their test runs."""
    defs = user._fixtureinfo.name2fixturedefs
    request = getattr(user, "_request", None)
    own = next((fd for fds in defs.values() for fd in fds if fd.func is func), None)
    if request is None or own is None:
        return None
    if any(not defs.get(name) or defs[name][-1].scope != "session" for name in own.argnames):
        return None
    return {name: request.getfixturevalue(name) for name in own.argnames}


def ahead(item: pytest.Item) -> None:
    """Start the next server the coming tests ask for, if fewer than MAX_WAITING wait started and
    memory allows;
    before a test marked `alone`, let every start under way finish and begin none."""
    if item.get_closest_marker("alone"):
        for started in _ahead.values():
            started.thread.join()
        return
    if sum(not a.taken for a in _ahead.values()) >= MAX_WAITING:
        return
    if psutil.virtual_memory().available < MIN_AVAILABLE_BYTES:
        return
    plan, index = _first_uses(item.session)
    here = index.get(id(item), -1)
    for first, func, user in plan:
        if first <= here or func in _ahead or func in _used:
            continue
        kwargs = _arguments(func, user)
        if kwargs is not None:
            _ahead[func] = _Ahead(func.__wrapped__(**kwargs))
            return


def stop_untaken() -> None:
    """At the session's end: stop what was started ahead for tests that never ran."""
    for started in _ahead.values():
        if not started.taken:
            started.thread.join()
            started.taken = True
            if started.error is None:
                started.gen.close()  # the fixture's own stop (a `finally` or a context manager's exit)
