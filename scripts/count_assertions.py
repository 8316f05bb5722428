"""Count the assertions in the test suite, so that a change to the tests can show it dropped none.

An assertion is, in the syntax tree of each tests/**/*.py file: an `assert` statement, a call of
`pytest.raises` or `pytest.warns` (as a `with` block or a plain call), or a call of a function or
method whose name starts with `assert` or `expect` (the suite's own helpers such as
`assert_healthy(server)`, and mocks' `assert_called_once()`). Definitions are not counted, calls
are: a helper called from three tests counts three times.

    python scripts/count_assertions.py             # totals per folder (unit, integration, e2e, ...)
    python scripts/count_assertions.py --by-file   # one line per file as well
    python scripts/count_assertions.py --json      # machine-readable
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAISING = {"raises", "warns"}
HELPER_PREFIXES = ("assert", "expect")


def _called_name(call: ast.Call) -> tuple[str | None, str | None]:
    """(the object's name for `obj.name(...)`, the called name)."""
    func = call.func
    if isinstance(func, ast.Name):
        return None, func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    return None, None


def count_tree(tree: ast.AST) -> Counter:
    """The three kinds of assertion in one parsed file."""
    found: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found["assert"] += 1
        elif isinstance(node, ast.Call):
            owner, name = _called_name(node)
            if owner == "pytest" and name in RAISING:
                found["pytest.raises/warns"] += 1
            elif name and name.startswith(HELPER_PREFIXES):
                found["assert*/expect* calls"] += 1
    return found


def count_files(root: Path) -> dict[str, Counter]:
    """Counts per file (paths relative to the repository)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out[str(path.relative_to(REPO))] = count_tree(tree)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO / "tests", help="folder to count (default: tests/)")
    parser.add_argument("--by-file", action="store_true", help="print each file's counts too")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    per_file = count_files(args.root.resolve())
    per_folder: dict[str, Counter] = {}
    for name, counts in per_file.items():
        parts = Path(name).parts
        folder = parts[1] if len(parts) > 2 else "(top)"
        per_folder.setdefault(folder, Counter()).update(counts)
    total = sum(per_folder.values(), Counter())
    if args.json:
        report = {"total": sum(total.values()), "kinds": dict(total),
                  "folders": {k: sum(v.values()) for k, v in sorted(per_folder.items())}}
        if args.by_file:
            report["files"] = {k: sum(v.values()) for k, v in per_file.items()}
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    if args.by_file:
        for name, counts in per_file.items():
            if counts:
                print(f"{sum(counts.values()):6d}  {name}")
    for folder, counts in sorted(per_folder.items()):
        print(f"{folder:12s} {sum(counts.values()):6d}  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{'total':12s} {sum(total.values()):6d}  " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
