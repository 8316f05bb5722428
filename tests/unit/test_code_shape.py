"""Small modules with one job: no module of `lmi_server/` over 400 lines, no function over 80 lines
(every module, every function and method, nested ones included; read with `ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_server"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_functions(path: Path, base: Path = PACKAGE.parent) -> list[str]:
    """`path:line name (n lines)` for each function longer than the limit, decorators included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - start + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(base)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_module_is_over_400_lines():
    big = [
        f"{p.relative_to(PACKAGE.parent)} ({n} lines)"
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + "\n".join(big)


def test_no_function_is_over_80_lines():
    long = [line for p in sources() for line in long_functions(p)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_function_check_measures_what_it_says(tmp_path):
    probe = tmp_path / "probe.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    probe.write_text(f"def short():\n    pass\n\n\nclass C:\n    async def long(self):\n{body}\n")
    assert [line.split()[1] for line in long_functions(probe, tmp_path)] == ["long"]
