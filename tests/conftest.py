"""Markers follow the folder: tests/unit -> unit, tests/integration -> integration, tests/e2e -> e2e.
Unit and integration tests run first, so that the first servers of the end-to-end tests start
while they run: servers start ahead of their first test (tests/support/prestart.py)."""

import pathlib

import pytest

from tests.support import prestart


@pytest.hookimpl(trylast=True)  # after tests/e2e/conftest.py has ordered the end-to-end tests
def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)  # stable: each part keeps its order


@pytest.fixture(autouse=True)
def _next_server_ahead(request):
    """Start the next server the coming tests ask for while this test runs."""
    prestart.ahead(request.node)


def pytest_sessionfinish(session):
    prestart.stop_untaken()
