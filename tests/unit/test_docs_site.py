"""The README is a short guide and the documentation site (mkdocs.yml, docs/) holds the rest: the
README's shape, the site's nav, and a strict build that fails on a missing figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CONFIG = yaml.safe_load((REPO / "mkdocs.yml").read_text())
GENERATED = {"reference.md"}  # added by docs/hooks/site.py at build time


def nav_pages(nav) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_readme_is_a_short_guide():
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    long = [n for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"lines over 200 characters: {long}"


def test_the_readme_carries_the_test_command_that_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    command = ci.strip().splitlines()[-1]
    assert command == "make test", command
    assert re.search(r"^make test\s", README, re.M), "the README's test command is the one .ci/run runs"
    assert re.search(r"^make serve\s", README, re.M)


def test_the_readmes_links_into_the_docs_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links, "the README links into docs/"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, missing


def test_the_nav_holds_every_page_and_the_generated_reference():
    pages = set(nav_pages(CONFIG["nav"]))
    written = {p.name for p in (REPO / "docs").glob("*.md")}
    assert written - pages == set(), "pages missing from mkdocs.yml's nav"
    assert pages - written == GENERATED, "nav entries without a page"
    assert "architecture.md" in pages


def build(config: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="the docs extra (make setup installs it)")
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def site_config(tmp_path: Path, docs: Path) -> dict:
    return {**CONFIG, "docs_dir": str(docs), "site_dir": str(tmp_path / "site"),
            "hooks": [str(REPO / h) for h in CONFIG["hooks"]]}


def test_the_site_builds_strictly_with_the_reference_and_the_figures(tmp_path):
    result = build(site_config(tmp_path, REPO / "docs"), tmp_path)
    assert result.returncode == 0, result.stderr
    site = tmp_path / "site"
    assert "option.lmcache_blend_mode" in (site / "reference" / "index.html").read_text()
    figures = sorted((REPO / "benchmarks" / "results").glob("*.png"))
    assert all((site / "benchmarks" / "results" / png.name).is_file() for png in figures)
    listing = (site / "benchmarks" / "index.html").read_text()
    assert [png.name for png in figures if f"results/{png.name}" not in listing] == [], "every figure is reachable"


def test_a_missing_figure_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for page in (REPO / "docs").glob("*.md"):
        (docs / page.name).write_text(page.read_text())
    with (docs / "metrics.md").open("a") as page:
        page.write("\n![gone](benchmarks/results/no_such_figure.png)\n")
    result = build(site_config(tmp_path, docs), tmp_path)
    assert result.returncode != 0
    assert "no_such_figure.png" in result.stderr
