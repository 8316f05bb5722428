"""What an image installs: the wheel built from exactly the files the Dockerfiles COPY (their
COPY lines, the build context filtered by .dockerignore; no Docker daemon) holds every package the
project ships (`lmi_server`, `djl_python` for LMI's model.py files) and the package data the server
reads at run time."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.packaging.test_dockerfiles import REPO, instructions, one

DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")

# Tracked files under lmi_server/ that the server does not read, so the wheel need not carry them.
NOT_SHIPPED = {
    "lmi_server/kvcache/blend/DESIGN.md": "design notes for readers of the source",
    "lmi_server/demo/assistant/corpus/*.jsonl": "training data of the scripts that retrain the assistant's heads",
    "lmi_server/demo/assistant/corpus/manifest.json": "index of that training data (a .json, so shipped anyway)",
}


def dockerignore() -> list[str]:
    path = REPO / ".dockerignore"
    if not path.is_file():
        return []
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's matching, as far as these patterns need: `**/` at any depth, a directory excludes what is in it."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        if pat.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pat[3:]) for p in parts):
                return True
        elif any(fnmatch.fnmatchcase(p, pat.rstrip("/")) for p in prefixes):
            return True
    return False


def copy_lines(name: str) -> list[tuple[list[str], str]]:
    out = []
    for word, rest in instructions(REPO / name):
        if word == "COPY":
            tokens = [t for t in rest.split() if not t.startswith("--")]
            out.append((tokens[:-1], tokens[-1]))
    return out


def build_context(name: str, dest: Path) -> Path:
    """The WORKDIR of the image after its COPY lines, built from this checkout."""
    assert one(instructions(REPO / name), "WORKDIR").startswith("/")
    patterns = dockerignore()
    for sources, target in copy_lines(name):
        for src in sources:
            assert not ignored(src, patterns), f"{name} copies {src}, which .dockerignore leaves out"
            origin = REPO / src
            to = dest / target if not (target.endswith("/") or len(sources) > 1) else dest / target / Path(src).name
            if origin.is_dir():
                def skip(folder, names, origin=origin):
                    rel = Path(folder).relative_to(REPO).as_posix()
                    return [n for n in names if ignored(f"{rel}/{n}", patterns)]

                shutil.copytree(origin, to, ignore=skip)
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, to)
    return dest


def tracked(prefix: str) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", prefix], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the shipped file list is unknown")
    return [ln for ln in out.splitlines() if ln]


_wheels: dict[tuple, list[str]] = {}


def wheel_names(name: str, tmp_path_factory) -> list[str]:
    """Names in the wheel that `pip install .` builds inside the image (one build per distinct COPY set)."""
    key = tuple((tuple(s), t) for s, t in copy_lines(name))
    if key not in _wheels:
        ctx = build_context(name, tmp_path_factory.mktemp("context"))
        out = tmp_path_factory.mktemp("wheel")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "-q", "-w", str(out), str(ctx)],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (wheel,) = out.glob("lmi_server-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            entry_points = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
            _wheels[key] = zf.namelist() + ["entry_points: " + zf.read(entry_points).decode()]
    return _wheels[key]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_wheel_carries_every_package_and_data_file(name, tmp_path_factory):
    names = set(wheel_names(name, tmp_path_factory))
    missing_code = [f for f in tracked("djl_python") + tracked("lmi_server") if f.endswith(".py") and f not in names]
    assert not missing_code, f"{name}: the image lacks {missing_code[:10]} (add a COPY line or a package)"
    shipped_data = [f for f in tracked("lmi_server") if not f.endswith(".py")]
    exempt = [f for f in shipped_data if any(fnmatch.fnmatchcase(f, p) for p in NOT_SHIPPED)]
    missing_data = [f for f in shipped_data if f not in names and f not in exempt]
    assert not missing_data, f"{name}: the image lacks package data {missing_data[:10]} (pyproject's package-data)"
    assert "djl_python/output_formatter.py" in names and "lmi_server/config/lmi_keys.json" in names
    entry_points = next(n for n in names if n.startswith("entry_points: "))
    assert "lmi-server = lmi_server.cli:main" in entry_points  # the image's ENTRYPOINT


def test_every_exemption_still_names_a_file():
    files = tracked("lmi_server")
    for pattern in NOT_SHIPPED:
        assert any(fnmatch.fnmatchcase(f, pattern) for f in files), f"NOT_SHIPPED lists {pattern}, which matches nothing"


def test_dockerignore_matching():
    pats = [".venv", "**/__pycache__", "**/*.pyc", "build"]
    assert ignored(".venv/lib/x.py", pats) and ignored("lmi_server/api/__pycache__/a.pyc", pats)
    assert ignored("lmi_server/x.pyc", pats) and ignored("build/lib/x", pats)
    assert not ignored("lmi_server/build_helpers.py", pats) and not ignored("djl_python/inputs.py", pats)
