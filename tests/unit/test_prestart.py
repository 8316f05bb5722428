"""tests/support/prestart.py in a real pytest run (a subprocess, so that its module state is its own):
a server fixture starts in a thread while the test before its first user runs, its user takes it,
its stop runs after its last user in the main thread; what no test took is stopped at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest

from tests.support import prestart


@pytest.fixture(autouse=True)
def _ahead(request):
    prestart.ahead(request.node)


def pytest_sessionfinish(session):
    prestart.stop_untaken()
"""

# What each test module starts with: its imports and `note`, which records an event with its thread.
PREAMBLE = """
import json
import os
import threading
import time

import pytest

from tests.support.prestart import prestartable


def note(*event):
    with open(os.environ["EVENTS"], "a") as fh:
        fh.write(json.dumps([*event, threading.current_thread().name, time.monotonic()]) + "\\n")
"""

TESTS = PREAMBLE + """

@pytest.fixture(scope="module")
@prestartable
def server(tmp_path_factory):
    note("start", "server")
    time.sleep(1.5)
    try:
        yield "ready"
    finally:
        note("stop", "server")


@pytest.fixture(scope="module")
@prestartable
def needs_request(request):
    note("start", "needs_request")
    yield "ready"


def test_before():
    note("test", "before")
    time.sleep(2)


def test_user(server):
    note("test", "user")
    assert server == "ready"


def test_after():
    note("test", "after")


def test_other_user(needs_request):
    note("test", "other")
"""

ALONE = PREAMBLE + """

@pytest.fixture(scope="module")
@prestartable
def first(tmp_path_factory):
    yield "first"


@pytest.fixture(scope="module")
@prestartable
def later(tmp_path_factory):
    note("start", "later")
    time.sleep(1.5)
    note("ready", "later")
    yield "later"


def test_first(first):
    note("test", "first")


@pytest.mark.alone
def test_timed():
    note("test", "timed")


def test_user(later):
    note("test", "user")
"""


def run(tmp_path: Path, tests: str, *args: str) -> tuple[subprocess.CompletedProcess, list[list]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_servers.py").write_text(textwrap.dedent(tests))
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "EVENTS": str(events), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    lines = events.read_text().splitlines() if events.exists() else []
    return proc, [json.loads(line) for line in lines]


def test_a_server_starts_in_a_thread_during_the_test_before_its_user_and_stops_after_it(tmp_path):
    proc, events = run(tmp_path, TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [(kind, what, thread) for kind, what, thread, _ in events]
    assert ("start", "server", "prestart") in names  # run ahead, not in the user's setup
    when = {(kind, what): t for kind, what, _, t in events}
    assert when[("start", "server")] < when[("test", "before")] + 1.0  # while the test before ran (2 s)
    assert names.index(("test", "user", "MainThread")) < names.index(("stop", "server", "MainThread"))
    assert names.count(("start", "server", "prestart")) == 1 and ("start", "server", "MainThread") not in names
    # a fixture that asks for `request` cannot run ahead: it starts in its user's setup
    assert ("start", "needs_request", "MainThread") in names


def test_a_server_started_ahead_for_a_test_that_never_runs_is_stopped_at_the_end(tmp_path):
    failing_first = TESTS.replace('note("test", "before")\n    time.sleep(2)', 'note("test", "before")\n    time.sleep(2)\n    assert False')
    proc, events = run(tmp_path, failing_first, "-x")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    names = [(kind, what, thread) for kind, what, thread, _ in events]
    assert ("start", "server", "prestart") in names and ("test", "user", "MainThread") not in names
    assert names[-1] == ("stop", "server", "MainThread")


def test_no_start_runs_beside_a_test_marked_alone(tmp_path):
    proc, events = run(tmp_path, ALONE, "-p", "no:warnings")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [(kind, what) for kind, what, _, _ in events]
    # begun ahead during test_first, finished before the timed test began
    assert names.index(("start", "later")) < names.index(("ready", "later")) < names.index(("test", "timed"))
