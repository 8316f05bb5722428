"""The record of the verified GPU image build stands for a tree only while the inputs its checks depend
on are unchanged (tests/support/gpu_record.py); a stale one fails with the command that refreshes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import gpu_record
from tests.support.gpu_record import CODE_CHECKS, DEPENDENCY_CHECKS, image_relevant_pyproject, judge, new_record
from tests.support.image_inputs import combine

REPO = Path(__file__).resolve().parents[3]

PYPROJECT = '''
[project]
name = "x"
dependencies = ["a==1"]  # a comment
[project.optional-dependencies]
gpu = ["vllm==0.32.0"]
test = ["pytest>=8"]
[tool.setuptools.packages.find]
include = ["x*"]
[tool.pytest.ini_options]
addopts = "-ra"
'''


def test_a_test_dependency_a_test_option_or_a_comment_does_not_change_what_the_image_installs():
    base = image_relevant_pyproject(PYPROJECT)
    assert image_relevant_pyproject(PYPROJECT.replace('"pytest>=8"', '"pytest>=8", "anthropic==2.17.0"')) == base
    assert image_relevant_pyproject(PYPROJECT.replace("# a comment", "# another")) == base
    assert image_relevant_pyproject(PYPROJECT.replace('"-ra"', '"-ra --durations=30"')) == base


def test_a_runtime_or_gpu_dependency_or_the_package_layout_does():
    base = image_relevant_pyproject(PYPROJECT)
    assert image_relevant_pyproject(PYPROJECT.replace('"a==1"', '"a==2"')) != base
    assert image_relevant_pyproject(PYPROJECT.replace('"vllm==0.32.0"', '"vllm==0.33.0"')) != base
    assert image_relevant_pyproject(PYPROJECT.replace('["x*"]', '["x*", "y*"]')) != base


CHECKS = {name: f"{name} seen" for name in DEPENDENCY_CHECKS + CODE_CHECKS}


@pytest.fixture
def tree(tmp_path) -> Path:
    """A small copy of what the GPU image copies, with the project's Dockerfiles."""
    for rel in ("Dockerfile", "Dockerfile.cpu", ".dockerignore", "pyproject.toml", "README.md", "scripts/containers.sh",
                "scripts/repair_torch.py", "scripts/build_suffix_decoding.py", "lmi_server/__init__.py",
                "lmi_server/cli.py", "djl_python/__init__.py", "lmcache_configs/cpu.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    return tmp_path


def verdict(tree: Path, record: dict):
    return judge(record, gpu_record.gpu_image_inputs(tree), code_stage_is_cpu_images=gpu_record.code_stage_shared(tree))


def built(tree: Path) -> dict:
    """The record a build of this tree writes."""
    return json.loads(json.dumps(new_record(gpu_record.gpu_image_inputs(tree), base="b", build_s=1.0, image_bytes=1,
                                            checks=CHECKS)))


def edit(tree: Path, rel: str, old: str = "", new: str = "\n# changed\n") -> None:
    path = tree / rel
    path.write_text(path.read_text().replace(old, new) if old else path.read_text() + new)


def test_the_gpu_image_inputs_are_its_copy_lines():
    got = gpu_record.gpu_image_inputs()
    assert {"pyproject.toml", "scripts/repair_torch.py", "scripts/build_suffix_decoding.py", "README.md",
            "lmi_server", "djl_python", "lmcache_configs", "Dockerfile", "scripts/containers.sh"} == set(got.image)
    assert {"lmi_server/cli.py", "lmi_server/host_requirements.py", "djl_python/__init__.py",
            "lmcache_configs/cpu.yaml"} <= set(got.files)
    assert not [f for f in got.files if "__pycache__" in f or f.endswith(".pyc") or f.startswith("tests/")]
    assert "lmi_server" not in got.dependencies and "pyproject.toml" in got.dependencies


def test_a_change_in_lmi_server_changes_the_gpu_image_digest(tree):
    """With the project's own Dockerfile and .dockerignore, over a small copy of what it copies."""
    before = gpu_record.gpu_image_inputs(tree)
    edit(tree, "lmi_server/cli.py")
    after = gpu_record.gpu_image_inputs(tree)
    assert after.image_sha256 != before.image_sha256 and after.dependencies_sha256 == before.dependencies_sha256
    (tree / "lmi_server" / "__pycache__").mkdir()
    (tree / "lmi_server" / "__pycache__" / "cli.cpython-311.pyc").write_text("bytecode")
    assert gpu_record.gpu_image_inputs(tree).image_sha256 == after.image_sha256
    assert gpu_record.code_stage_shared(tree)


def test_every_input_the_same_every_check_stands(tree):
    got = verdict(tree, built(tree))
    assert got.current and got.failure is None


def test_a_dependency_stage_change_fails_naming_it_and_the_refresh_command(tree):
    record = built(tree)
    edit(tree, "pyproject.toml", '"vllm==0.32.0"', '"vllm==0.33.0"')
    got = verdict(tree, record)
    assert not got.current and "pyproject.toml" in got.failure
    assert "make gpu-image-record" in got.failure and "commit tests/data/gpu_image_verified.json" in got.failure
    assert "13 min" in got.failure  # what the refresh costs


@pytest.mark.parametrize("rel", ["scripts/repair_torch.py", "scripts/build_suffix_decoding.py", "scripts/containers.sh"])
def test_the_scripts_and_the_base_recipe_are_dependency_stage(tree, rel):
    record = built(tree)
    edit(tree, rel)
    assert rel in verdict(tree, record).failure


def test_a_code_change_leaves_the_dependency_checks_standing_and_says_so(tree):
    record = built(tree)
    edit(tree, "lmi_server/cli.py")
    got = verdict(tree, record)
    assert not got.current and got.failure is None
    assert "lmi_server" in got.note and "make gpu-image-record" in got.note
    assert all(name in got.note for name in DEPENDENCY_CHECKS + CODE_CHECKS)


def test_a_code_stage_the_cpu_image_does_not_share_fails(tree):
    record = built(tree)
    edit(tree, "Dockerfile", 'ENTRYPOINT ["lmi-server"]', 'RUN echo gpu-only\nENTRYPOINT ["lmi-server"]')
    got = verdict(tree, record)
    assert got.failure and "Dockerfile.cpu" in got.failure and "make gpu-image-record" in got.failure


def test_a_record_without_its_checks_or_an_old_one_fails(tree):
    assert "make gpu-image-record" in verdict(tree, {}).failure
    old_format = {"inputs_sha256": gpu_record.gpu_image_inputs(tree).image_sha256, "checks": CHECKS}
    assert verdict(tree, old_format).failure
    record = built(tree)
    del record["dependencies"]["checks"]["suffix_decoding"]
    assert verdict(tree, record).failure


def test_only_a_build_writes_a_record_and_it_holds_every_check(tree):
    with pytest.raises(AssertionError, match="serve_without_gpu"):
        new_record(gpu_record.gpu_image_inputs(tree), base="b", build_s=1.0, image_bytes=1,
                   checks={name: "x" for name in DEPENDENCY_CHECKS + ("config",)})


def test_the_committed_record_is_of_the_project_s_format():
    record = gpu_record.read()
    assert set(record["dependencies"]["checks"]) == set(DEPENDENCY_CHECKS)
    assert set(record["image"]["checks"]) == set(CODE_CHECKS)
    assert record["base"].startswith("lmi-standin/vllm-openai:v0.32.0")
    for stage in ("dependencies", "image"):  # each digest is the one of the inputs it lists
        if record[stage]["inputs"] is not None:
            assert combine(record[stage]["inputs"]) == record[stage]["sha256"]
