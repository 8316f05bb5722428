"""Arctic Inference's suffix-decoding extension is built from its pinned sdist by every install path:
`make setup` (and so `.ci/run`), the CPU image and the GPU image (scripts/build_suffix_decoding.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = "scripts/build_suffix_decoding.py"
_spec = importlib.util.spec_from_file_location("build_suffix_decoding", REPO / SCRIPT)
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def run_lines(text: str) -> str:
    return re.sub(r"\\\n", " ", text)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_both_images_copy_and_run_the_build_after_the_dependencies(name):
    text = run_lines((REPO / name).read_text())
    copy = [line for line in text.splitlines() if line.startswith("COPY") and SCRIPT in line]
    assert copy, f"{name} does not copy {SCRIPT}"
    (run,) = [line for line in text.splitlines() if line.startswith("RUN") and "pip install --no-cache-dir \".[" in line]
    assert run.index("repair_torch.py") < run.index(f"python3 {SCRIPT}")


def test_make_setup_builds_it_after_the_project_and_rebuilds_when_the_script_changes():
    make = (REPO / "Makefile").read_text()
    assert SCRIPT in make.split("$(STAMP):", 1)[1].splitlines()[0]
    recipe = make.split("$(STAMP):", 1)[1]
    assert recipe.index("scripts/repair_torch.py\n") < recipe.index(f"$(PY) {SCRIPT}")


def test_the_gpu_image_record_covers_the_script():
    """The extension is built in the dependency stage: a change of the script calls for a GPU build."""
    from tests.support.gpu_record import gpu_image_inputs

    assert SCRIPT in gpu_image_inputs().dependencies


def test_pins_and_no_cuda_ops():
    assert build.PIN == "arctic-inference==0.3.0" and len(build.SDIST_SHA256) == 64
    assert all("==" in tool for tool in build.BUILD_TOOLS)
    assert build.BUILD_TOOLS[1].startswith("cmake==3.")


def test_build_is_isolated_from_cuda_and_pypi_torch(monkeypatch, tmp_path):
    """The sdist is built against the environment's torch (no build isolation), from the hashed pin only,
    with ARCTIC_INFERENCE_PRECOMPILED_OPS (the CUDA ops) cleared and the build tools kept out of the venv."""
    calls = []
    monkeypatch.setenv("ARCTIC_INFERENCE_PRECOMPILED_OPS", "1")
    monkeypatch.setattr(build, "pip", lambda *args, env=None: calls.append((args, env)))
    build.build()
    (tools_args, _), (install_args, env) = calls
    assert tools_args[tools_args.index("--target") + 1].endswith("tools")
    assert "--no-build-isolation" in install_args and "--no-deps" in install_args and "--require-hashes" in install_args
    assert "ARCTIC_INFERENCE_PRECOMPILED_OPS" not in env
    assert env["PATH"].split(":")[0].endswith("tools/bin")
