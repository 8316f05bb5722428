"""An image's inputs are what its Dockerfile copies, .dockerignore applied (tests/support/image_inputs.py):
the digest a verified build is recorded under changes with any of them and with nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.image_inputs import (
    Instruction, copy_sources, ignore_patterns, ignored, image_inputs, instructions,
)

DOCKERFILE = """\
ARG BASE_IMAGE=base:1
FROM ${BASE_IMAGE}
# dependencies first
COPY pyproject.toml ./
COPY scripts/dep.py \\
     ./scripts/
RUN python3 -m pip install --no-cache-dir ".[gpu]" \\
    && python3 scripts/dep.py
COPY README.md ./
COPY pkg ./pkg
RUN python3 -m pip install --no-deps .
"""
DOCKERIGNORE = """\
# the build context
.git
**/__pycache__
**/*.pyc
build
pkg/secret.txt
!pkg/keep.pyc
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def context(tmp_path) -> Path:
    for rel, text in {
        "Dockerfile": DOCKERFILE, ".dockerignore": DOCKERIGNORE, "pyproject.toml": "[project]\nname='x'\n",
        "scripts/dep.py": "print(1)\n", "scripts/base.sh": "echo base\n", "README.md": "# x\n",
        "pkg/__init__.py": "", "pkg/mod.py": "A = 1\n", "pkg/sub/deep.py": "B = 2\n", "pkg/data.json": "{}\n",
        "pkg/__pycache__/mod.cpython-311.pyc": "bytecode", "pkg/stale.pyc": "bytecode", "pkg/keep.pyc": "kept",
        "pkg/secret.txt": "local", "build/lib/pkg/mod.py": "A = 0\n", "pkg/build/x.py": "X = 1\n",
        "tests/test_mod.py": "def test(): pass\n", "notes.md": "not copied\n", ".git/HEAD": "ref\n",
    }.items():
        write(tmp_path, rel, text)
    return tmp_path


def inputs(context: Path):
    return image_inputs(context, "Dockerfile", extra=("scripts/base.sh",))


def test_the_inputs_are_what_the_copy_lines_bring_in(context):
    files = inputs(context).files
    assert files == (
        "README.md", "pkg/__init__.py", "pkg/build/x.py", "pkg/data.json", "pkg/keep.pyc", "pkg/mod.py",
        "pkg/sub/deep.py", "pyproject.toml", "scripts/dep.py",
    )


@pytest.mark.parametrize("rel", ["pkg/mod.py", "pkg/sub/deep.py", "pkg/data.json", "README.md", "pyproject.toml",
                                 "scripts/dep.py", "scripts/base.sh", "Dockerfile"])
def test_changing_any_input_changes_the_image_digest(context, rel):
    before = inputs(context)
    write(context, rel, (context / rel).read_text() + "\n# changed\n")
    after = inputs(context)
    assert after.image_sha256 != before.image_sha256
    assert [name for name in after.image if after.image[name] != before.image[name]]


def test_a_new_or_removed_file_in_a_copied_folder_changes_it(context):
    before = inputs(context).image_sha256
    write(context, "pkg/new.py", "")
    assert inputs(context).image_sha256 != before
    (context / "pkg" / "new.py").unlink()
    assert inputs(context).image_sha256 == before
    (context / "pkg" / "mod.py").rename(context / "pkg" / "renamed.py")  # same content, other path
    assert inputs(context).image_sha256 != before


@pytest.mark.parametrize("rel", ["pkg/__pycache__/mod.cpython-311.pyc", "pkg/stale.pyc", "pkg/secret.txt",
                                 "build/lib/pkg/mod.py", "tests/test_mod.py", "notes.md", ".git/HEAD"])
def test_a_file_the_image_does_not_copy_leaves_it_alone(context, rel):
    before = inputs(context)
    write(context, rel, "changed")
    after = inputs(context)
    assert (after.image_sha256, after.dependencies_sha256) == (before.image_sha256, before.dependencies_sha256)


def test_a_new_copy_line_is_covered_without_listing_it(context):
    before = inputs(context)
    write(context, "configs/a.yaml", "a: 1\n")
    write(context, "Dockerfile", DOCKERFILE + "COPY configs ./configs\n")
    after = inputs(context)
    assert "configs/a.yaml" in after.files and "configs" in after.image
    write(context, "configs/a.yaml", "a: 2\n")
    assert inputs(context).image["configs"] != after.image["configs"]


def test_the_code_stage_leaves_the_dependency_digest_alone(context):
    before = inputs(context)
    write(context, "pkg/mod.py", "A = 2\n")
    write(context, "Dockerfile", DOCKERFILE.replace("--no-deps .", "--no-deps . && echo done"))
    after = inputs(context)
    assert after.dependencies_sha256 == before.dependencies_sha256 and after.image_sha256 != before.image_sha256
    for rel in ("pyproject.toml", "scripts/dep.py", "scripts/base.sh"):
        write(context, rel, "changed")
        assert inputs(context).dependencies_sha256 != before.dependencies_sha256, rel


def test_a_dependency_stage_line_changes_the_dependency_digest_a_comment_does_not(context):
    before = inputs(context)
    write(context, "Dockerfile", DOCKERFILE.replace("# dependencies first", "# deps"))
    assert inputs(context).dependencies_sha256 == before.dependencies_sha256
    write(context, "Dockerfile", DOCKERFILE.replace("--no-cache-dir", "--no-cache-dir -v"))
    assert inputs(context).dependencies_sha256 != before.dependencies_sha256


def test_without_a_dependency_install_every_change_is_a_dependency_change(context):
    write(context, "Dockerfile", DOCKERFILE.replace('".[gpu]"', "-r requirements.txt"))
    before = inputs(context)
    write(context, "pkg/mod.py", "A = 2\n")
    assert inputs(context).dependencies_sha256 != before.dependencies_sha256


def test_the_digest_is_deterministic(context, tmp_path_factory):
    first = inputs(context)
    copy = tmp_path_factory.mktemp("copy")
    for rel in sorted((p.relative_to(context) for p in context.rglob("*") if p.is_file()), reverse=True):
        write(copy, str(rel), (context / rel).read_text())  # created in the other order
    second = inputs(copy)
    assert (first.image, first.dependencies, first.files) == (second.image, second.dependencies, second.files)
    assert len(first.image_sha256) == 64


def test_wildcards_and_the_json_form(context):
    write(context, "Dockerfile", DOCKERFILE + 'COPY ["scripts/*.py", "./s/"]\nCOPY pkg/s?b ./x/\n')
    got = inputs(context)
    assert {"scripts/*.py", "pkg/s?b"} <= set(got.image)
    write(context, "scripts/other.py", "")
    assert inputs(context).image["scripts/*.py"] != got.image["scripts/*.py"]


def test_a_dockerfile_ignore_file_beside_it_wins(context):
    write(context, "Dockerfile.dockerignore", "pkg/data.json\n")
    files = inputs(context).files
    assert "pkg/data.json" not in files and "pkg/stale.pyc" in files


def parse(args: str) -> list[str]:
    return copy_sources(Instruction("COPY", args, 1))


def test_copy_lines_are_read_as_docker_reads_them():
    assert parse("--chown=1:1 --chmod=644 a b ./") == ["a", "b"]
    assert parse('["a b", "c", "/dst/"]') == ["a b", "c"]
    assert parse("--from=builder /opt/x /opt/x") == []  # another stage's files, not the context's
    with pytest.raises(ValueError, match="--exclude"):
        parse("--exclude=*.md . ./")  # a flag that changes the inputs must be understood first
    with pytest.raises(ValueError, match="not in the build context"):
        copy_sources(Instruction("ADD", "https://example.com/x.tgz /x", 1))
    with pytest.raises(ValueError, match="heredoc"):
        instructions("FROM x\nCOPY <<EOF /a\nhello\nEOF\n")


def test_a_missing_source_fails_as_the_build_would(context):
    write(context, "Dockerfile", DOCKERFILE + "COPY nowhere ./\n")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        inputs(context)


def test_dockerignore_follows_dockers_rules():
    patterns = ignore_patterns("build\n**/*.pyc\n/dist/\n!keep.pyc\ndocs/**\n!docs/keep.md\n")
    assert ignored("build/x.py", patterns) and not ignored("pkg/build/x.py", patterns)  # rooted, unlike .gitignore
    assert ignored("a.pyc", patterns) and ignored("a/b/c.pyc", patterns) and not ignored("keep.pyc", patterns)
    assert ignored("dist/x", patterns) and ignored("docs/a/b.md", patterns) and not ignored("docs/keep.md", patterns)
