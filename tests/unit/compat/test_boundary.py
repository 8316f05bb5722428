"""No private vLLM or LMCache name outside lmi_server/compat/: every file of lmi_server/ is read
with `ast`, and each finding is named by file and line.

What counts: an import of an underscore name (or from an underscore module) of vllm/lmcache; an
attribute or a getattr/setattr string `_name` that lmi_server does not define itself (so it can
only be someone else's); an assignment to an attribute that the seam's table says we patch
(`kind` replace or write), e.g. `engine.generate = ...`; and any assignment into something imported
from vllm/lmcache (`MessageQueue.__init__ = ...`, `setattr(module, ...)`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lmi_server.compat import USES

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[3] / "lmi_server"
SEAM = PACKAGE / "compat"
UPSTREAM = ("vllm", "lmcache")
PRIVATE = re.compile(r"^_[A-Za-z0-9]\w*$")
PATCHED = frozenset(use.member for use in USES if use.kind in ("replace", "write"))
NOT_UPSTREAM = {
    "_exit": "os._exit: the standard library's documented hard exit",
    "_name_or_path": "a key of a Hugging Face config.json file, read as JSON",
}


def _private(name: str) -> bool:
    return bool(PRIVATE.match(name)) and not name.endswith("__")


def _files(root: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if SEAM not in p.parents)


def own_names(files: list[Path]) -> set[str]:
    """Every name lmi_server defines: functions, classes, variables, parameters, attributes it
    assigns, import aliases."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def _upstream(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in UPSTREAM


def _root(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (`a` of `a.b.c`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def upstream_bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> the vllm/lmcache module it was imported from, for every such import in the file."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _upstream(node.module):
            for alias in node.names:
                bound[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _upstream(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
    return bound


def findings(path: Path, own: set[str]) -> list[str]:
    """`file:line: what` for each private upstream name used in `path`."""
    where = path.relative_to(PACKAGE.parent)
    found: list[str] = []
    tree = ast.parse(path.read_text(), str(path))
    imported = upstream_bindings(tree)

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _upstream(node.module):
            if any(_private(part) for part in node.module.split(".")):
                flag(node, f"import from the private module {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    flag(node, f"import of {node.module}.{alias.name}")
            if node.module.split(".")[-1] in PATCHED or any(a.name in PATCHED for a in node.names):
                pass  # importing a patched module is fine; assigning into it is caught below
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _upstream(alias.name) and any(_private(part) for part in alias.name.split(".")):
                    flag(node, f"import of the private module {alias.name}")
        elif isinstance(node, ast.Attribute):
            if _private(node.attr) and node.attr not in own and node.attr not in NOT_UPSTREAM:
                flag(node, f"attribute {node.attr} (not defined in lmi_server: an upstream private name)")
            if isinstance(node.ctx, ast.Store) and _root(node.value) in imported:
                flag(node, f"assignment to {_root(node.value)}.{node.attr}, imported from {imported[_root(node.value)]}")
            elif isinstance(node.ctx, ast.Store) and node.attr in PATCHED:
                flag(node, f"assignment to {node.attr}, which the seam patches")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                if _private(name) and name not in own:
                    flag(node, f"{node.func.id} of {name} (not defined in lmi_server: an upstream private name)")
                if node.func.id == "setattr" and name in PATCHED:
                    flag(node, f"setattr of {name}, which the seam patches")
            if node.func.id in ("setattr", "delattr") and node.args and _root(node.args[0]) in imported:
                flag(node, f"{node.func.id} on {_root(node.args[0])}, imported from {imported[_root(node.args[0])]}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
            if node.value not in own and node.value not in NOT_UPSTREAM:
                flag(node, f"the string {node.value!r} (an upstream private name, looked up by name)")
    return found


def test_no_private_upstream_name_outside_the_seam():
    files = _files()
    own = own_names(files)
    bad = [line for path in files for line in findings(path, own)]
    assert not bad, ("private vLLM/LMCache names outside lmi_server/compat/ (move each behind a function "
                     "of compat.vllm / compat.lmcache, with a row in its USES):\n" + "\n".join(bad))


SAMPLE = '''
from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part
from lmcache.integration.vllm import lmcache_mp_connector as mp
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

def f(engine, serving, adapter, kernels):
    engine.generate = None
    mp.get_dcp_decorated_model_name = None
    serving._extract_prompt_len(1)
    adapter._completed_store_requests[1] = 1
    setattr(kernels, "_transfer_per_layer_fused", None)
    MessageQueue.__init__ = None
    setattr(mp, "anything", None)
'''


def test_the_check_names_each_kind_of_use_with_its_line(tmp_path):
    sample = tmp_path / "lmi_server" / "sample.py"
    sample.parent.mkdir()
    sample.write_text(SAMPLE)
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "lmi_server"
    try:
        found = findings(sample, own_names([sample]))
    finally:
        PACKAGE = saved
    text = "\n".join(found)
    assert "sample.py:2: import of vllm.renderers.chat_utils._parse_chat_message_content_mm_part" in text
    assert "sample.py:7: assignment to generate" in text
    assert "sample.py:8: assignment to mp.get_dcp_decorated_model_name, imported from lmcache" in text
    assert "sample.py:9: attribute _extract_prompt_len" in text
    assert "sample.py:10: attribute _completed_store_requests" in text
    assert "sample.py:11: setattr of _transfer_per_layer_fused" in text
    assert "sample.py:12: assignment to MessageQueue.__init__, imported from vllm.distributed" in text
    assert "sample.py:13: setattr on mp, imported from lmcache.integration.vllm" in text
