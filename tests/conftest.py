"""Fixtures: real PostgreSQL servers from the project's own sandbox (no Docker, no system install).

One sandbox of 3 servers runs for the whole session; each test fleet gets fresh
databases on them, so tests are isolated without paying for new servers. Tests
that stop or kill servers use ``private_sandbox`` instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from support.pooler import pgbouncer  # noqa: F401 - the fixture: PgBouncer in front of the session servers

from shardctl.cli import cli
from shardctl.dev.sandbox import Sandbox
from shardctl.model.topology import LayoutWarning, Topology
from shardctl.sql.render import builtin_dir

SESSION_HOSTS = 3


def pytest_configure(config):
    warnings.filterwarnings("ignore", category=LayoutWarning)


def _sandbox_dir(label: str) -> Path:
    # Not under pytest's tmp_path: pytest deletes old base temp dirs, and a concurrent
    # pytest session would delete a running server's data directory.
    return Path(tempfile.mkdtemp(prefix=f"shardctl-test-{label}-"))


@pytest.fixture
def server_dir():
    """A directory for a test's own servers, outside pytest's tmp_path.

    pytest resets ``/tmp/pytest-of-<user>`` to mode 0700 when a session starts, so a server
    (running as the unprivileged sandbox user) under tmp_path loses access to its data
    directory whenever another pytest session starts meanwhile.
    """
    path = _sandbox_dir("dir")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def servers() -> Sandbox:
    box = Sandbox(_sandbox_dir("servers"))
    box.up(hosts=SESSION_HOSTS, shards=SESSION_HOSTS)
    yield box
    box.destroy()


def admin_dsn(port: int, db: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}"


class FleetMaker:
    """Builds topologies over fresh databases on the session servers."""

    def __init__(self, servers: Sandbox, base: Path):
        self.servers = servers
        self.base = base
        self.created: list[tuple[int, str]] = []

    def __call__(
        self,
        hosts: int = 2,
        shards: int = 64,
        *,
        function: str = "plpgsql",
        schema: str = "insta{n}",
        name: str = "shardctl.yaml",
        epoch: str = "2026-01-01T00:00:00Z",
        ranges: list[str] | None = None,
        extra: str = "",
        pooler: str | None = None,
        encoding: str | None = None,
    ) -> Path:
        """``pooler``: each host's ``pooler:`` key; ``encoding``: the databases' server encoding (with C
        collation), else the server's default."""
        assert hosts <= SESSION_HOSTS
        state = self.servers.state
        directory = self.base / f"fleet-{uuid.uuid4().hex[:6]}"
        directory.mkdir()
        shutil.copytree(builtin_dir("migrations"), directory / "migrations")
        lines = [
            "version: 1",
            "id:",
            "  layout: instagram",
            f'  epoch: "{epoch}"',
            f"  function: {function}",
            "shards:",
            f"  count: {shards}",
            f'  schema: "{schema}"',
            "migrations: migrations/",
            "hosts:",
        ]
        for i in range(hosts):
            host = state.hosts[i]
            db = f"t_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(admin_dsn(host.port), autocommit=True) as conn:
                conn.execute(
                    f"CREATE DATABASE {db}"
                    + (
                        f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
                        if encoding
                        else ""
                    )
                )
            self.created.append((host.port, db))
            lo, hi = i * shards // hosts, (i + 1) * shards // hosts - 1
            rng = ranges[i] if ranges else f"{lo}-{hi}"
            lines += [
                f"  - name: pg{i + 1}",
                f'    dsn: "postgresql://postgres@127.0.0.1:{host.port}/{db}"',
                f'    shards: "{rng}"',
            ] + ([f"    pooler: {pooler}"] if pooler else [])
        path = directory / name
        path.write_text("\n".join(lines) + "\n" + extra)
        return path

    def new_database(self, index: int) -> str:
        """A fresh, empty database on session server ``index``; returns its DSN."""
        host = self.servers.state.hosts[index]
        db = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_dsn(host.port), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        self.created.append((host.port, db))
        return f"postgresql://postgres@127.0.0.1:{host.port}/{db}"

    def cleanup(self) -> None:
        for port, db in self.created:
            try:
                with psycopg.connect(admin_dsn(port), autocommit=True) as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            except psycopg.Error:
                pass


@pytest.fixture
def make_fleet(servers, tmp_path):
    maker = FleetMaker(servers, tmp_path)
    yield maker
    maker.cleanup()


@pytest.fixture
def fleet(make_fleet) -> Path:
    """A 2-host, 64-shard topology over fresh databases (not yet initialised)."""
    return make_fleet()


@pytest.fixture
def private_sandbox():
    """Servers of this test's own, for tests that stop or kill them."""
    boxes: list[Sandbox] = []

    def make(hosts: int = 2, shards: int = 64, **up) -> Sandbox:
        box = Sandbox(_sandbox_dir(f"private{len(boxes)}"))
        box.up(hosts=hosts, shards=shards, **up)
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.destroy()


def load(path: Path) -> Topology:
    return Topology.load(path)


def connect(topo: Topology, host: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(**topo.host(host).connect_kwargs(**kwargs))


class Result:
    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"Result(exit={self.exit_code}, stdout={self.stdout[-2000:]!r}, stderr={self.stderr[-2000:]!r})"


def run_cli(
    *args: str, config: Path | None = None, input: str | None = None, env: dict | None = None
) -> Result:
    """Run the CLI in-process, exactly as the console script does (same exit-code mapping)."""
    argv = (["--config", str(config)] if config else []) + [str(a) for a in args]
    result = CliRunner().invoke(cli, argv, input=input, env=env, catch_exceptions=False)
    return Result(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def shardctl():
    return run_cli


os.environ.setdefault(
    "SHARDCTL_SANDBOX", str(Path(os.environ.get("TMPDIR", "/tmp")) / "shardctl-test-sandbox")
)
