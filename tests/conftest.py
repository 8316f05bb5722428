"""Markers follow the folder: tests/unit -> unit, tests/integration -> integration, tests/e2e -> e2e."""

import pathlib

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))
