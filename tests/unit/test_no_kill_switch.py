"""No shipped module kills its own process or reads a fault-injection variable: the crash tests
install their fault through the move's hook registry (tests/support/crash_at.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from shardctl.ops.move import run

PACKAGE = Path(__file__).resolve().parents[2] / "shardctl"


def test_no_module_kills_itself_or_reads_a_crash_variable() -> None:
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "CRASH" not in node.value, f"{path} names a crash variable"
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.kill":
                assert "getpid" not in ast.unparse(node), f"{path} kills its own process"


def test_the_move_hooks_are_empty_until_a_test_installs_one() -> None:
    assert run.HOOKS == {}
    run.checkpoint("after-prepare")  # a no-op
    seen = []
    run.HOOKS["after-prepare"] = lambda: seen.append("after-prepare")
    try:
        run.checkpoint("after-sync")
        run.checkpoint("after-prepare")
    finally:
        run.HOOKS.clear()
    assert seen == ["after-prepare"]
