"""The offline commands never import the database driver, nor does a fleet command refused for its
topology, and every command stays reachable.

Each offline command runs as a real process under ``python -X importtime``, which lists every module
the process imports (on stderr, one line each, the module name after the last ``|``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.process import run_shardctl

from shardctl.cli import COMMAND_MODULES, cli, load_commands

DRIVER = ("psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c")

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2011-01-01T00:00:00Z"
  function: plpgsql
shards:
  count: 16
  schema: "insta{n}"
hosts:
  - name: pg1
    dsn: "postgresql://app@127.0.0.1:1/app?sslmode=disable"
    shards: "0-7"
  - name: pg2
    dsn: "host=127.0.0.1 port=1 dbname=app2 user=app"
    shards: "8-15"
"""


def imported(stderr: str) -> set[str]:
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:")
    }


@pytest.fixture
def topo(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    return path


OFFLINE = {
    "decode-id": ["decode-id", "--layout", "instagram", "1"],
    "decode-id-topology": ["-c", "{topo}", "decode-id", str(1000 << 23 | 3 << 10 | 1)],
    "encode-id": ["-c", "{topo}", "encode-id", "--ms", "1", "--shard", "3", "--sequence", "1"],
    "locate": ["-c", "{topo}", "locate", "42"],
    "info": ["-c", "{topo}", "info", "--json"],
    "render": ["-c", "{topo}", "render", "--shard", "3"],
}


@pytest.mark.parametrize("name", list(OFFLINE))
def test_offline_command_does_not_import_psycopg(name, topo, tmp_path):
    args = [a.format(topo=topo) for a in OFFLINE[name]]
    proc = run_shardctl(
        *args, python_flags=("-X", "importtime"), unset=("SHARDCTL_CONFIG",), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = imported(proc.stderr)
    assert "shardctl.cli" in modules, "importtime output not understood"
    driver = sorted(m for m in modules if m.split(".")[0] in DRIVER)
    assert not driver, f"shardctl {' '.join(args)} imported {driver}"


def test_the_check_sees_a_driver_import(tmp_path):
    """The same check run on a command that connects does see psycopg (so the test above can fail)."""
    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    proc = run_shardctl(
        "-c",
        path,
        "status",
        "--connect-timeout",
        "1",
        python_flags=("-X", "importtime"),
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]  # port 1: refused
    assert "psycopg" in imported(proc.stderr)


def test_a_fleet_command_imports_psycopg_without_importlib_metadata(tmp_path):
    """The CLI gives psycopg its version from the dist-info directory's name (``cli.main``): the
    process never loads importlib.metadata (and email, zipfile...), and psycopg's version is the one
    importlib.metadata reads."""
    from importlib import metadata

    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    proc = run_shardctl(
        "-c", path, "migrate", "--check", "--connect-timeout", "1",
        python_flags=("-X", "importtime"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]  # port 1: refused
    modules = imported(proc.stderr)
    assert "psycopg" in modules and "psycopg_binary._psycopg" in modules
    assert "importlib.metadata" not in modules and "email" not in modules
    versions = subprocess.run(
        [sys.executable, "-c", _VERSIONS], capture_output=True, text=True, check=True
    ).stdout.split()
    assert versions == [metadata.version("psycopg"), metadata.version("psycopg-binary")] * 2


_VERSIONS = """
import sys
from shardctl import cli
cli._psycopg_versions_from_dist_info()
import psycopg, psycopg._cmodule
assert "importlib.metadata" not in sys.modules
print(psycopg.__version__, psycopg._cmodule.__version__)
print(sys.modules["psycopg.version"].__version__, sys.modules["psycopg_binary.version"].__version__)
"""


def test_help_lists_every_command():
    proc = run_shardctl("--help")
    assert proc.returncode == 0
    listed = {
        line.split()[0]
        for line in proc.stdout.split("Commands:", 1)[1].splitlines()
        if line.strip()
    }
    assert listed == set(COMMAND_MODULES)


def test_command_map_matches_the_modules():
    """Every command a module defines is in COMMAND_MODULES, under the module that defines it."""
    commands = load_commands()
    assert set(commands) == set(COMMAND_MODULES) == set(cli.commands)
    for name, command in commands.items():
        assert command is not None, name
        assert command.callback.__module__ == f"shardctl.cli.{COMMAND_MODULES[name]}", name


# ---- what a command imports before it needs a server ------------------------------------------------

_IMPORTS = """
import json, sys
from shardctl.cli import cli
seen = {}
for args in json.loads(sys.argv[1]):
    try:
        cli.main(args=args, prog_name="shardctl")
        code = 0
    except SystemExit as exc:
        code = exc.code
    seen[" ".join(args[2:])] = [code, "psycopg" in sys.modules]
print(json.dumps(seen))
"""


def test_no_database_driver_is_imported_before_a_command_needs_a_server(topo, tmp_path):
    """The offline commands never import psycopg, and a fleet command whose topology does not load
    is refused before it imports psycopg (about 0.1 s of CPU, and memory, per refusal)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOPOLOGY.replace('shards: "8-15"', 'shards: "15-8"'))
    assert bad.read_text() != TOPOLOGY
    offline = [args for args in OFFLINE.values() if args[0] == "-c"]  # with a topology
    refused = [
        ["init"],
        ["migrate"],
        ["migrate", "--check"],
        ["plan"],
        ["verify"],
        ["status"],
        ["redeploy"],
        ["add-shard", "--host", "pg1", "--count", "1"],
        ["add-host", "pg9", "--dsn", "postgresql://app@127.0.0.1:1/app9"],
        ["move-shard", "0-3", "--to", "pg2"],
        ["move-shard", "--status"],
        ["rebalance"],
    ]
    commands = [[a.format(topo=topo) for a in args] for args in offline]
    commands += [["--config", str(bad), *a] for a in refused]
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS, json.dumps(commands)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SHARDCTL_CONFIG"},
        check=True,
    )
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert len(seen) == len(commands), seen
    for args in commands[: len(offline)]:
        assert seen[" ".join(args[2:])] == [0, False], (args, seen)
    for args in refused:
        assert seen[" ".join(args)] == [2, False], (args, seen)
    assert proc.stderr.count("runs backwards") == len(refused), proc.stderr
