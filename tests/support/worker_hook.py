"""Code to run inside a real server's engine processes, for tests and benchmarks that must reach
where LMCache's connector lives (to time its copies or make them fail).

`install(directory, source)` writes a `sitecustomize.py` that runs `on_connector_import()` (defined
by `source`) once LMCache's vLLM connector module is imported, and returns the PYTHONPATH that puts
it in every process the server starts.
"""

from __future__ import annotations

import os
from pathlib import Path

CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"

_HOOK = f'''

import builtins as _builtins

_import = _builtins.__import__


def _hook(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name == "{CONNECTOR_MODULE}":
        _builtins.__import__ = _import
        on_connector_import()
    return module


_builtins.__import__ = _hook
'''


def install(directory: Path, source: str) -> str:
    """Write directory/sitecustomize.py from `source` (which defines `on_connector_import()`) and
    the import hook; the PYTHONPATH value for the server's environment."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(source + _HOOK)
    return os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
