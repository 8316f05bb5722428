"""Imports run one way (cli -> api -> runtime/engine -> config, kvcache, adapters, speculative):
every import of every module of `lmi_server/`, including those inside functions, read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_server"
# Layers that must stay free of HTTP: no lmi_server.api, no FastAPI / Starlette.
LOWER = ("lmi_server.adapters", "lmi_server.admission", "lmi_server.kvcache", "lmi_server.config", "lmi_server.speculative")
HTTP = ("lmi_server.api", "fastapi", "starlette")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module path imported by the file, anywhere in it (absolute; relative resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def modules() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") or name.startswith(p + "_") for p in prefixes)


def test_lower_layers_import_nothing_from_the_api_or_http():
    bad = [
        f"{mod} imports {imp}"
        for mod, imps in modules().items()
        if _within(mod, LOWER)
        for imp in sorted(imps)
        if _within(imp, HTTP)
    ]
    assert not bad, "imports that run up a layer:\n" + "\n".join(bad)


def _package_of(name: str, known: set[str]) -> str | None:
    """The sub-package (or top-level module) of lmi_server a module belongs to."""
    parts = name.split(".")
    if parts[0] != "lmi_server" or len(parts) < 2:
        return None
    head = ".".join(parts[:2])
    return head if any(k == head or k.startswith(head + ".") for k in known) else None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_package_import_graph_has_no_cycle():
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for mod, imps in mods.items():
        src = _package_of(mod, known)
        if src is None:
            continue
        for imp in imps:
            dst = _package_of(imp, known)
            if dst is not None and dst != src:
                graph.setdefault(src, set()).add(dst)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between parts of lmi_server:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_import_cycle():
    mods = modules()
    graph = {mod: {imp for imp in imps if imp in mods and imp != mod} for mod, imps in mods.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_imports_inside_functions():
    probe = PACKAGE / "kvcache" / "mp_server.py"
    assert "lmi_server.kvcache.plan" in imports_of(probe)  # imported inside supervisor_for_plan
