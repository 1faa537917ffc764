"""PgBouncer in front of sandbox servers: config, start, reload, health check and stop.

One ``pgbouncer`` process serves any number of servers: its ``[databases]`` section maps a
database name the clients use (an alias) to a server's port and real database. It runs as the
sandbox's unprivileged user when we are root (PgBouncer refuses to run as root), daemonized, so it
outlives the command that started it (``shardctl sandbox up --pooler``).

Startup parameters: PgBouncer refuses a client that sends a startup parameter it does not track.
libpq sends ``options`` when the DSN or the caller sets it (the Router does, for
``statement_timeout``); the config ignores ``options`` and ``extra_float_digits``, so such a
client connects, but what it asked for in ``options`` is silently *not* applied on the server.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInput, OperationFailed
from .base import read_state, write_state
from .process import free_port, live_pid, make_traversable, port_open, run, server_user

STATE_FILE = "pooler.json"
MODES = ("transaction", "session")  # a host's ``pooler:`` in the topology names the same modes
IGNORED_STARTUP_PARAMETERS = "extra_float_digits,options"
USER = "postgres"


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable: ``$PGBOUNCER``, the PATH, or Debian's /usr/sbin."""
    explicit = os.environ.get("PGBOUNCER")
    if explicit:
        return explicit if Path(explicit).exists() else None
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None


@dataclass
class PoolerState:
    port: int
    mode: str = "transaction"
    pool_size: int = 3
    max_client_conn: int = 500
    password_env: str | None = None
    # alias -> [server port, real database]
    databases: dict[str, list] = field(default_factory=dict)


class Pooler:
    """A PgBouncer whose files (ini, userlist, pid, log, state) live in ``directory``."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory).resolve()

    # ---- state --------------------------------------------------------------------------------
    @property
    def state(self) -> PoolerState | None:
        raw = read_state(self.dir / STATE_FILE)
        return None if raw is None else PoolerState(**raw)

    def _save(self, state: PoolerState) -> None:
        write_state(self.dir / STATE_FILE, state)

    def configure(
        self,
        *,
        mode: str = "transaction",
        pool_size: int = 3,
        max_client_conn: int = 500,
        password_env: str | None = None,
        port: int | None = None,
    ) -> PoolerState:
        """Create (or change) the pooler's settings; ``start`` or ``reload`` applies them."""
        if mode not in MODES:
            raise BadInput(f"pool mode must be one of {', '.join(MODES)}, got {mode!r}")
        if pool_size < 1 or max_client_conn < 1:
            raise BadInput("pool size and max_client_conn must be at least 1")
        self.dir.mkdir(parents=True, exist_ok=True)
        old = self.state
        state = PoolerState(
            port=port or (old.port if old else free_port()),
            mode=mode,
            pool_size=pool_size,
            max_client_conn=max_client_conn,
            password_env=password_env,
            databases=old.databases if old else {},
        )
        self._save(state)
        return state

    def add_database(self, alias: str, port: int, dbname: str) -> None:
        """Route clients of database ``alias`` to ``dbname`` on the server at 127.0.0.1:``port``."""
        state = self._require_state()
        if not alias.replace("_", "").isalnum() or not dbname.replace("_", "").isalnum():
            raise BadInput(
                f"pooler database names must be plain identifiers: {alias!r}, {dbname!r}"
            )
        state.databases[alias] = [port, dbname]
        self._save(state)

    def dsn(self, alias: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self._require_state().port}/{alias}"

    def admin_dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self._require_state().port}/pgbouncer"

    # ---- files --------------------------------------------------------------------------------
    @property
    def ini_path(self) -> Path:
        return self.dir / "pgbouncer.ini"

    @property
    def pid_path(self) -> Path:
        return self.dir / "pgbouncer.pid"

    @property
    def log_path(self) -> Path:
        return self.dir / "pgbouncer.log"

    def ini_text(self, state: PoolerState) -> str:
        databases = "".join(
            f"{alias} = host=127.0.0.1 port={port} dbname={db}\n"
            for alias, (port, db) in sorted(state.databases.items())
        )
        auth = "scram-sha-256" if state.password_env else "trust"
        return (
            "; written by shardctl (shardctl/dev/pooler.py)\n"
            "[databases]\n" + databases + "\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {state.port}\n"
            "unix_socket_dir =\n"
            f"auth_type = {auth}\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            f"admin_users = {USER}\n"
            f"stats_users = {USER}\n"
            f"pool_mode = {state.mode}\n"
            f"default_pool_size = {state.pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            f"max_client_conn = {state.max_client_conn}\n"
            f"ignore_startup_parameters = {IGNORED_STARTUP_PARAMETERS}\n"
            "server_reset_query = DISCARD ALL\n"
            "server_check_delay = 0\n"
            "server_login_retry = 1\n"
            "query_wait_timeout = 60\n"
            f"logfile = {self.log_path}\n"
            f"pidfile = {self.pid_path}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )

    def _write_files(self, state: PoolerState, user: str | None) -> None:
        password = ""
        if state.password_env:
            password = os.environ.get(state.password_env) or ""
            if not password:
                raise BadInput(f"pooler: the environment variable {state.password_env} is not set")
        userlist = self.dir / "userlist.txt"
        userlist.write_text(f'"{USER}" "{password}"\n')
        userlist.chmod(0o600)
        self.ini_path.write_text(self.ini_text(state))
        for path in (userlist, self.ini_path):
            if user:
                shutil.chown(path, user, user)
        if user:
            if not self.log_path.exists():
                self.log_path.touch()
            shutil.chown(self.log_path, user, user)
            shutil.chown(self.dir, user, user)

    # ---- process --------------------------------------------------------------------------------
    def pid(self) -> int | None:
        return live_pid(self.pid_path)

    def running(self) -> bool:
        return self.pid() is not None

    def start(self) -> dict:
        """Start PgBouncer (daemonized, as the sandbox user when root) and wait until it answers."""
        state = self._require_state()
        binary = pgbouncer_binary()
        if binary is None:
            raise OperationFailed(
                "pgbouncer is not installed (apt-get install pgbouncer, or set $PGBOUNCER)"
            )
        user = server_user()
        self._write_files(state, user)
        if self.running():
            self.reload()
            return self.info()
        if port_open(state.port):
            raise OperationFailed(f"pooler: port {state.port} is taken by another program")
        if user:
            make_traversable(self.dir)
        self.pid_path.unlink(missing_ok=True)
        run(
            [binary, "-d", str(self.ini_path)],
            user,
            self.log_path.with_suffix(".start.log"),
            timeout=30,
        )
        self.wait_healthy()
        return self.info()

    def wait_healthy(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while True:
            problem = self.health()
            if problem is None:
                return
            if time.monotonic() > deadline:
                tail = (
                    self.log_path.read_text(errors="replace")[-1500:]
                    if self.log_path.exists()
                    else ""
                )
                raise OperationFailed(
                    f"pgbouncer on port {self._require_state().port} did not answer: "
                    f"{problem}\n{tail}"
                )
            time.sleep(0.1)

    def health(self) -> str | None:
        """None when the admin console answers ``SHOW VERSION``; else why not."""
        if not self.running():
            return "not running"
        try:
            self.admin("SHOW VERSION")
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            return str(exc).strip() or type(exc).__name__
        return None

    def _console(self) -> Any:
        """A connection to PgBouncer's admin console (simple query protocol: ClientCursor)."""
        import psycopg

        state = self._require_state()
        kwargs = {"password": os.environ.get(state.password_env)} if state.password_env else {}
        return psycopg.connect(
            self.admin_dsn(),
            autocommit=True,
            connect_timeout=5,
            cursor_factory=psycopg.ClientCursor,
            **kwargs,
        )

    def admin(self, command: str) -> list[tuple]:
        """Run a command on PgBouncer's admin console."""
        with self._console() as conn:
            cur = conn.execute(command)
            return cur.fetchall() if cur.description else []

    def reload(self) -> None:
        """Rewrite the ini from the state and make PgBouncer read it (``RELOAD``: synchronous)."""
        state = self._require_state()
        self._write_files(state, server_user())
        if self.running():
            self.admin("RELOAD")

    def pools(self) -> list[dict]:
        with self._console() as conn:
            cur = conn.execute("SHOW POOLS")
            names = [d.name for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    def stop(self, timeout: float = 15) -> bool:
        """Stop PgBouncer (SIGTERM: immediate shutdown); True if it was running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.pid() is not None:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
                break
            time.sleep(0.05)
        self.pid_path.unlink(missing_ok=True)
        return True

    def info(self) -> dict:
        state = self._require_state()
        return {
            "dir": str(self.dir),
            "port": state.port,
            "mode": state.mode,
            "pool_size": state.pool_size,
            "running": self.running(),
            "pid": self.pid(),
            "databases": {
                alias: {"port": p, "dbname": d} for alias, (p, d) in state.databases.items()
            },
        }

    def _require_state(self) -> PoolerState:
        state = self.state
        if state is None:
            raise BadInput(f"no pooler configured in {self.dir}")
        return state


# ---- a sandbox's pooler (``shardctl sandbox up --pooler MODE``) -------------------------------

POOLER_DIR = "pgbouncer"


def sandbox_pooler(directory: str | os.PathLike) -> Pooler:
    return Pooler(Path(directory) / POOLER_DIR)


def front_sandbox(directory: str | os.PathLike, mode: str, pool_size: int) -> dict:
    """Start a PgBouncer in front of the sandbox's hosts (one database per host, named after it) and
    point the topology's ``dsn`` of each host at it, with ``admin_dsn`` the server itself and
    ``pooler`` the pool mode."""
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    from ..model.topology_file import TopologyFile
    from .sandbox import DATABASE, SandboxState

    state = SandboxState.read(Path(directory).resolve())
    if state is None:
        raise BadInput(f"no sandbox in {directory}")
    pooler = sandbox_pooler(directory)
    pooler.configure(mode=mode, pool_size=pool_size, password_env=state.password_env)
    for host in state.hosts:
        pooler.add_database(host.name, host.port, DATABASE)
    info = pooler.start()
    doc = TopologyFile(Path(directory) / "shardctl.yaml")
    direct = {h.name: h.dsn for h in state.hosts}
    for node in doc.doc.get("hosts") or []:
        name = str(node.get("name"))
        if name in direct:
            node["dsn"] = DoubleQuotedScalarString(pooler.dsn(name))
            node["admin_dsn"] = DoubleQuotedScalarString(direct[name])
            node["pooler"] = mode  # the Router keeps no session state behind a transaction pooler
    doc.save()
    return info


def restart_sandbox_pooler(directory: str | os.PathLike) -> dict | None:
    """Start the sandbox's PgBouncer again if it has one (``sandbox up`` after ``sandbox down``)."""
    pooler = sandbox_pooler(directory)
    return pooler.start() if pooler.state is not None else None


def stop_sandbox_pooler(directory: str | os.PathLike) -> bool:
    pooler = sandbox_pooler(directory)
    return pooler.state is not None and pooler.stop()
