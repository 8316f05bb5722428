"""The record of the last verified GPU image build (tests/data/gpu_image_verified.json) and whether it
stands for the tree at hand.

Why: the GPU image cannot be built in CI (its stand-in base is vLLM's CUDA wheels, ~9.5 GB from PyPI:
about 13 minutes and ~20 GB of disk), so tests/e2e/test_containers.py checks it by a record of a build
that was made and checked (`make gpu-image-record`, nothing else writes it). A record stands only for
the inputs it was built from, all of them derived from the Dockerfile (tests/support/image_inputs.py),
and it says which of its checks depend on which stage:

- dependency stage (the Dockerfile up to `pip install ".[gpu]"`, the files it copies, pyproject.toml
  as installed, the stand-in base's recipe): LMCache's CUDA ops import against the image's torch,
  the suffix-decoding extension builds and drafts. A change here leaves nothing of the record standing:
  the test fails with the command that refreshes it.
- code stage (what follows: the package's code, README, djl_python, lmcache_configs, its install):
  `lmi-server config` plans a GPU deployment, `serve` refuses a host without a GPU. The code changes in
  most commits; while the dependency stage stands and the code stage is the CPU image's, instruction
  for instruction, CI checks the code stage in the CPU image it builds from the same tree, and the
  record's code checks are reported as those of the other code they ran.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.support.image_inputs import ImageInputs, code_stage, image_inputs

REPO = Path(__file__).resolve().parents[2]
RECORD_PATH = "tests/data/gpu_image_verified.json"
RECORD = REPO / RECORD_PATH
DOCKERFILE = "Dockerfile"
CPU_DOCKERFILE = "Dockerfile.cpu"
# Not copied into the image, but it builds the stand-in base the recorded image stands on.
BASE_RECIPE = "scripts/containers.sh"
DEPENDENCY_CHECKS = ("lmcache_cuda_ops", "suffix_decoding")
CODE_CHECKS = ("config", "serve_without_gpu")
REFRESH = (
    "make gpu-image-record (builds the GPU image on its stand-in base and checks it: about 13 min and "
    "~20 GB of disk where the stand-in base is not built yet, vLLM's CUDA wheels coming from PyPI; about "
    "3 min where scripts/containers.sh kept it), then commit " + RECORD_PATH
)

TEST_ONLY_EXTRAS = ("test", "bench", "docs")
"""pyproject extras the GPU image never installs (it installs `.[gpu]`): tests, benchmarks, the docs site."""


def image_relevant_pyproject(text: str) -> bytes:
    """What of pyproject.toml the image's `pip install` reads: the parsed file without comments, without
    the test-only extras and without other tools' settings (pytest's among them), so that a new test
    dependency or test option does not call for a 13-minute image rebuild. `tool.setuptools` stays:
    it says what the package holds."""
    data = tomllib.loads(text)
    extras = data.get("project", {}).get("optional-dependencies", {})
    for name in TEST_ONLY_EXTRAS:
        extras.pop(name, None)
    tools = data.get("tool", {})
    for name in [name for name in tools if name != "setuptools"]:
        del tools[name]
    return json.dumps(data, sort_keys=True).encode()


NORMALIZE = {"pyproject.toml": lambda content: image_relevant_pyproject(content.decode())}


def gpu_image_inputs(context: Path = REPO) -> ImageInputs:
    return image_inputs(context, DOCKERFILE, extra=(BASE_RECIPE,), normalize=NORMALIZE)


def code_stage_shared(context: Path = REPO) -> bool:
    """Whether the GPU image's code stage is the CPU image's, instruction for instruction."""
    return code_stage(context, DOCKERFILE) == code_stage(context, CPU_DOCKERFILE)


def read(path: Path | None = None) -> dict:
    path = path or RECORD
    return json.loads(path.read_text()) if path.exists() else {}


def new_record(inputs: ImageInputs, *, base: str, build_s: float, image_bytes: int, checks: dict[str, str]) -> dict:
    """The record of a build that was just made and checked (the only way a record is written)."""
    missing = set(DEPENDENCY_CHECKS + CODE_CHECKS) - set(checks)
    assert not missing, f"a record holds every check; missing: {sorted(missing)}"
    return {
        "built": time.strftime("%Y-%m-%d"),
        "base": base,
        "build_s": round(build_s, 1),
        "image_bytes": image_bytes,
        "dependencies": {"sha256": inputs.dependencies_sha256, "inputs": inputs.dependencies,
                         "checks": {name: checks[name] for name in DEPENDENCY_CHECKS}},
        "image": {"sha256": inputs.image_sha256, "inputs": inputs.image,
                  "checks": {name: checks[name] for name in CODE_CHECKS}},
    }


def changes(recorded: dict[str, str] | None, now: dict[str, str]) -> str:
    """The inputs that differ from the recorded ones (changed, added or gone), by name."""
    if recorded is None:
        return "the build did not record them"
    return "changed: " + ", ".join(sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name)))


@dataclass(frozen=True)
class Verdict:
    current: bool = False
    """Every input is the recorded build's: all its checks stand for this tree."""
    failure: str | None = None
    """Why the record cannot stand for this tree, with the command that refreshes it."""
    note: str = ""
    """Only the code stage changed: what stands, what CI checks instead."""


def judge(record: dict, inputs: ImageInputs, *, code_stage_is_cpu_images: bool) -> Verdict:
    """What the record proves for a tree whose GPU image inputs are `inputs`."""
    where = RECORD_PATH
    deps, image = record.get("dependencies") or {}, record.get("image") or {}
    built = record.get("built", "?")
    if set(DEPENDENCY_CHECKS) - set(deps.get("checks") or {}) or set(CODE_CHECKS) - set(image.get("checks") or {}):
        return Verdict(failure=f"{where} is missing or lacks checks: refresh it with {REFRESH}")
    if deps.get("sha256") != inputs.dependencies_sha256:
        changed = changes(deps.get("inputs"), inputs.dependencies)
        return Verdict(failure=(
            f"{where} does not stand for this tree: the GPU image's dependency stage is not the one of the "
            f"build it records ({built}; {changed}). CI cannot build that image; refresh the record with {REFRESH}."
        ))
    if image.get("sha256") == inputs.image_sha256:
        return Verdict(current=True)
    changed = changes(image.get("inputs"), inputs.image)
    if not code_stage_is_cpu_images:
        return Verdict(failure=(
            f"{where} does not stand for this tree: the GPU image's code stage is not the one of the build "
            f"it records ({built}; {changed}), and it is not {CPU_DOCKERFILE}'s, which CI builds and runs. "
            f"Refresh the record with {REFRESH}."
        ))
    return Verdict(note=(
        f"the GPU image's code stage is not the one of the build {where} records ({built}; {changed}). Its dependency "
        f"stage is that build's, so the {', '.join(DEPENDENCY_CHECKS)} checks stand; the "
        f"{', '.join(CODE_CHECKS)} checks ran other code. This run checked the code stage in the CPU image "
        f"(the same instructions, from this tree); to see those checks in the GPU image again: {REFRESH}."
    ))
