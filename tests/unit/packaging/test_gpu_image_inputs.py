"""The GPU image is rebuilt by the container test when what it installs changes, and only then."""

from __future__ import annotations

from tests.support.containers import image_relevant_pyproject

PYPROJECT = '''
[project]
name = "x"
dependencies = ["a==1"]  # a comment
[project.optional-dependencies]
gpu = ["vllm==0.32.0"]
test = ["pytest>=8"]
'''


def test_a_test_dependency_or_a_comment_does_not_change_what_the_image_installs():
    base = image_relevant_pyproject(PYPROJECT)
    assert image_relevant_pyproject(PYPROJECT.replace('"pytest>=8"', '"pytest>=8", "anthropic==2.17.0"')) == base
    assert image_relevant_pyproject(PYPROJECT.replace("# a comment", "# another")) == base


def test_a_runtime_or_gpu_dependency_does():
    base = image_relevant_pyproject(PYPROJECT)
    assert image_relevant_pyproject(PYPROJECT.replace('"a==1"', '"a==2"')) != base
    assert image_relevant_pyproject(PYPROJECT.replace('"vllm==0.32.0"', '"vllm==0.33.0"')) != base
