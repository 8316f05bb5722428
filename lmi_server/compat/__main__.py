"""`python -m lmi_server.compat`: the seam's table checked against the vLLM and LMCache installed
in this interpreter, one line per row; exit status 1 when anything changed (`make upgrade-check`)."""

from __future__ import annotations

import importlib
import sys
from importlib import metadata
from pathlib import Path

from lmi_server.compat import CONTRACT, contract


def installed(package: str) -> str:
    """The version of `package` this interpreter imports (its own `__version__`: in an overlay venv
    two distributions of vLLM may be visible to importlib.metadata, only one to `import`)."""
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        return f"{package} (does not import: {exc})"
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "unknown version"
    return f"{package} {version} ({Path(module.__file__).parent})"


def main() -> int:
    print(f"checking {len(CONTRACT)} upstream names (private, then internal) against {installed('vllm')}, "
          f"{installed('lmcache')}")
    changed = 0
    for use, problem in contract.report(CONTRACT):
        if problem is None:
            print(f"  ok       {use.name}")
        else:
            changed += 1
            print(f"  CHANGED  {problem}\n           we rely on: {use.relies}")
    print(f"{changed} of {len(CONTRACT)} changed" if changed else f"all {len(CONTRACT)} unchanged")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
