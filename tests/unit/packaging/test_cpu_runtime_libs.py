"""tcmalloc (vLLM's CPU guide) is installed wherever the CPU engine is set up: `make setup`, the
CPU image and CI; the server preloads it when found (lmi_server/cpu_preload.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = "libtcmalloc-minimal4"


def test_the_cpu_image_installs_tcmalloc_and_leaves_the_preload_to_the_server():
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile.cpu").read_text())
    runs = [line for line in text.splitlines() if line.strip().startswith("RUN ")]
    assert any("apt-get install" in r and PACKAGE in r for r in runs)
    # no fixed LD_PRELOAD: the server finds the libraries (and a missing one is no start failure)
    envs = [line for line in text.splitlines() if line.strip().startswith("ENV ")]
    assert not any("LD_PRELOAD" in e for e in envs)


def test_make_setup_installs_tcmalloc_when_it_can_and_goes_on_when_it_cannot():
    recipe = (REPO / "Makefile").read_text().split("$(STAMP):", 1)[1].split("\nserve:", 1)[0]
    line = re.sub(r"\\\n", " ", recipe)
    assert f"apt-get install -y -qq --no-install-recommends {PACKAGE}" in line
    assert 'id -u)" = 0' in line and "command -v apt-get" in line  # root with apt only
    assert "|| echo" in line  # a failed install does not fail the setup


def test_ci_installs_tcmalloc_beside_redis():
    text = (REPO / ".ci" / "run").read_text()
    assert PACKAGE in text and "redis-server" in text
    assert text.index(PACKAGE) < text.index("make test")
