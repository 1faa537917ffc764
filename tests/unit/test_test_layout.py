"""The test tree's own layout: helpers live in tests/support/, and tests import them from there.

A test file that imports another test file (or conftest) runs that file's module-level code and
fixtures a second time under another name, and hides which helpers are shared.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_no_test_imports_conftest_or_another_test_file():
    bad = [
        f"{path.relative_to(TESTS)}: imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in sorted(imported_modules(path))
        if module.split(".")[0] == "conftest" or module.split(".")[-1].startswith("test_")
    ]
    assert not bad, "import helpers from tests/support/ instead:\n" + "\n".join(bad)


def test_helpers_live_in_support():
    top = sorted(p.name for p in TESTS.glob("*.py"))
    assert top == ["conftest.py"], f"helper modules belong in tests/support/, not tests/: {top}"
