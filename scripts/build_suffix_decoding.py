"""Build and install Arctic Inference's suffix-decoding extension, which vLLM's `method: suffix` imports.

Why a script: PyPI has only the source distribution of `arctic-inference` (pinned below, with its hash),
and its setup.py imports torch at build time. An isolated pip build would fetch a second, CUDA torch
from PyPI into the build environment; so it is built without isolation against the environment's own
torch, with its C++ build tools (nanobind, cmake) put in a throwaway folder rather than in the
environment. Only `arctic_inference.suffix_decoding._C` is compiled (plain C++, no CUDA): the CUDA
custom ops are built only when ARCTIC_INFERENCE_PRECOMPILED_OPS is set, which this script clears.
Idempotent: does nothing when the pinned version already imports. Used by `make setup` and both
Dockerfiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

PACKAGE = "arctic-inference"
VERSION = "0.3.0"
SDIST_SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
BUILD_TOOLS = ("nanobind==2.9.2", "cmake==3.31.10")
"""nanobind at the version the sdist's build-system names; cmake below 4 (the sdist's CMake files use
policies that CMake 4 removed). setuptools comes with vLLM, which requires it."""
PIN = f"{PACKAGE}=={VERSION}"


def installed_version() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def extension_imports() -> bool:
    code = "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(4, 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True, env=env)


def build() -> None:
    with tempfile.TemporaryDirectory(prefix="arctic-build-") as tmp:
        tools = Path(tmp) / "tools"
        pip("install", "--quiet", "--no-cache-dir", "--target", str(tools), *BUILD_TOOLS)
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{PIN} --hash=sha256:{SDIST_SHA256}\n")
        env = {k: v for k, v in os.environ.items() if k != "ARCTIC_INFERENCE_PRECOMPILED_OPS"}
        env["PATH"] = f"{tools / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tools), env.get("PYTHONPATH", "")) if p)
        pip("install", "--quiet", "--no-cache-dir", "--no-build-isolation", "--no-deps", "--no-binary", PACKAGE,
            "--require-hashes", "-r", str(requirements), env=env)


def main() -> int:
    if installed_version() == VERSION and extension_imports():
        print(f"{PIN}: already installed")
        return 0
    build()
    if not extension_imports():
        print(f"{PIN} installed but arctic_inference.suffix_decoding does not import", file=sys.stderr)
        return 1
    print(f"{PIN}: built and installed (suffix decoding extension only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
