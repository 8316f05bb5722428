"""Markers follow the folder: tests/unit -> unit, tests/integration -> integration, tests/e2e -> e2e.
Servers start ahead of their first test while earlier tests run (tests/support/prestart.py)."""

import pathlib

import pytest

from tests.support import prestart


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(autouse=True)
def _next_server_ahead(request):
    """Start the next server the coming tests ask for while this test runs."""
    prestart.ahead(request.node)


def pytest_sessionfinish(session):
    prestart.stop_untaken()
