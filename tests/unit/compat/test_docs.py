"""docs/upgrading.md lists every row of the seam's tables (a use added without its line fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_server.compat import CONTRACT

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[3] / "docs" / "upgrading.md"


def test_every_row_is_on_the_upgrading_page():
    text = PAGE.read_text()
    missing = [use.name for use in CONTRACT if f"`{use.name}`" not in text]
    assert not missing, "docs/upgrading.md does not list:\n" + "\n".join(missing)
