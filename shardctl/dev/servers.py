"""The embedded engine's servers: how they are configured (``ServerConfig``) and their life cycle
(``LocalServers``: initdb, start, stop, pid, base backups of standbys).

The servers run in an environment of their own: ``HOME`` is the sandbox directory (so a
subscription's libpq reads the sandbox's ``.postgresql/``, never the invoking user's), and nothing
else of the caller's environment (``PG*`` variables included) reaches them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import OperationFailed
from ..model.file_lock import file_lock
from . import certs, pgbuilds
from .process import SERVER_USER, live_pid, make_traversable, port_open, run, server_env

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
TLS_DIR = "tls"  # the sandbox's CA (certs.py), the invoking user's alone
SERVER_HOME_PG = ".postgresql"  # in the servers' HOME: root.crt, the CA their subscriptions trust
CONF_FILE = "shardctl_sandbox.conf"  # the settings, rewritten at every start
# A directory of clusters made once per build, copied for each new server (LocalServers.initdb).
INITDB_CACHE_ENV = "SHARDCTL_INITDB_CACHE"


class Server(Protocol):
    """What the life cycle needs of a host: its name, port and data directory (SandboxHost)."""

    name: str
    port: int
    data_dir: str


@dataclass(frozen=True)
class ServerConfig:
    """How every server of one sandbox is set up: its binaries, its user, TLS and authentication."""

    home: Path  # the sandbox directory: the servers' HOME, and the TLS files' home
    bin_dir: Path
    user: str | None  # the server user (when we are root), else None: ourselves
    tls: bool = False
    password_env: str | None = None

    @property
    def auth_method(self) -> str:
        return "scram-sha-256" if self.password_env else "trust"

    @property
    def server_ca(self) -> Path:
        """The servers' own copy of the sandbox CA: ``~/.postgresql/root.crt`` in their HOME (TLS)."""
        return self.home / SERVER_HOME_PG / "root.crt"

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return server_env(self.home, extra)

    def prepare(self) -> str:
        """Make the binaries and the sandbox reachable by the server user, and with TLS the sandbox CA
        (made the first time) and the servers' copy of it; returns the clients' CA file (or "")."""
        if self.user:
            make_traversable(self.bin_dir)
            make_traversable(self.home)
        if not self.tls:
            return ""
        ca = certs.ensure_ca(self.home / TLS_DIR)
        certs.install_copy(ca, self.server_ca, self.user, 0o644)
        if self.user:
            shutil.chown(self.server_ca.parent, self.user, self.user)
        self.server_ca.parent.chmod(0o700)
        return str(ca)

    def settings(self, port: int) -> dict[str, str]:
        """The server's settings: the sandbox's, its port, pg_stat_statements preloaded where the build
        ships it (its view needs that; CREATE EXTENSION alone does not), and with TLS the sandbox
        CA's server certificate (for 127.0.0.1 and localhost, certs.py)."""
        settings = dict(SERVER_SETTINGS, port=str(port))
        build = pgbuilds.build_at(self.bin_dir, "")
        if build is not None and build.has_library("pg_stat_statements"):
            settings["shared_preload_libraries"] = "'pg_stat_statements'"
        if self.tls:
            settings.update(ssl="on", ssl_cert_file="'server.crt'", ssl_key_file="'server.key'")
        return settings

    def write_hba(self, hba: Path) -> None:
        """Replication connections for shard moves (subscriptions connect over TCP); with TLS, TLS only:
        hostssl lines and nothing else (a connection without TLS matches no line)."""
        method = self.auth_method
        if self.tls:
            hba.write_text(
                "# shardctl sandbox --tls: TLS connections only\n"
                f"hostssl all all 127.0.0.1/32 {method}\n"
                f"hostssl replication all 127.0.0.1/32 {method}\n"
            )
            return
        with hba.open("a") as f:
            f.write(f"host replication all 127.0.0.1/32 {method}\n")

    def replication_env(self) -> dict[str, str]:
        """The environment of a tool that connects to a primary (pg_basebackup -R writes the TLS
        settings into primary_conninfo: the servers' own copy of the CA)."""
        extra = {"PGPASSWORD": os.environ[self.password_env]} if self.password_env else {}
        if self.tls:
            extra.update(PGSSLMODE="verify-full", PGSSLROOTCERT=str(self.server_ca))
        return self.env(extra)


class LocalServers:
    """The life cycle of one sandbox's PostgreSQL servers, each a data directory run by ``pg_ctl``."""

    def __init__(self, config: ServerConfig):
        self.config = config

    @staticmethod
    def pid(host: Server) -> int | None:
        return live_pid(Path(host.data_dir) / "postmaster.pid")

    def running(self, host: Server) -> bool:
        return self.pid(host) is not None

    def log(self, host: Server, name: str) -> Path:
        """``<host>.<name>`` beside the host's data directory, writable by the server user."""
        path = Path(host.data_dir).parent / f"{host.name}.{name}"
        if not path.exists():
            path.touch()
            if os.geteuid() == 0:
                shutil.chown(path, SERVER_USER)
        return path

    def _run(self, host: Server, log: str, *args: str, timeout: float = 120) -> None:
        run(
            [self.config.tool(args[0]), *args[1:]],
            self.config.user,
            self.log(host, log),
            timeout,
            self.config.env(),
        )

    def _own_dir(self, data: Path) -> None:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.config.user:
            shutil.chown(data, self.config.user, self.config.user)

    def initdb(self, host: Server) -> None:
        """A new data directory (nothing to do when it exists), including the sandbox's settings file
        and its pg_hba.conf lines. With ``SHARDCTL_INITDB_CACHE`` set and no password, a copy of a
        cluster that initdb made once for this build (:meth:`_copy_cached_cluster`)."""
        data = Path(host.data_dir)
        if (data / "PG_VERSION").exists():
            return
        self._own_dir(data)
        cache = os.environ.get(INITDB_CACHE_ENV)
        if cache and not self.config.password_env:
            self._copy_cached_cluster(Path(cache), host)
        else:
            self._initdb(host, data)
        with (data / "postgresql.conf").open("a") as f:
            f.write(f"\n# added by shardctl sandbox\ninclude_if_exists = '{CONF_FILE}'\n")
        self.config.write_hba(data / "pg_hba.conf")

    def _initdb(self, host: Server, data: Path) -> None:
        args = [
            "initdb",
            "-D",
            str(data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        ]
        args.append("--auth-local=trust")
        pwfile = None
        if self.config.password_env:
            pwfile = data.parent / f".{host.name}.pw"
            pwfile.write_text(os.environ[self.config.password_env] + "\n")
            pwfile.chmod(0o600)
            if self.config.user:
                shutil.chown(pwfile, self.config.user, self.config.user)
            args += ["--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        else:
            args += ["--auth-host=trust"]
        try:
            self._run(host, "initdb.log", *args)
        finally:
            if pwfile:
                pwfile.unlink(missing_ok=True)

    def _copy_cached_cluster(self, cache: Path, host: Server) -> None:
        """Copy into the host's (empty) data directory the cluster initdb made once for this build in
        ``cache``, making it first (under a lock, so concurrent sandboxes and test workers make it once).

        A copy costs about a tenth of initdb's CPU (0.04 s against 0.5 s on tmpfs). Every copy has the
        same system identifier, which nothing a sandbox runs depends on (logical replication does not
        read it; standbys are base backups, which share it anyway): for throwaway servers only."""
        cache.mkdir(mode=0o755, parents=True, exist_ok=True)
        make_traversable(cache)
        key = hashlib.sha256(f"{self.config.bin_dir.resolve()}|{self.config.user}".encode())
        source = cache / key.hexdigest()[:16]
        with file_lock(cache / ".lock"):
            if not (source / "PG_VERSION").exists():
                building = cache / f"{source.name}.building"
                shutil.rmtree(building, ignore_errors=True)
                self._own_dir(building)
                self._initdb(host, building)
                building.rename(source)
        # cp -a keeps the server user's ownership and the 0700 modes PostgreSQL checks
        subprocess.run(["cp", "-a", f"{source}/.", host.data_dir], check=True, capture_output=True)

    def start(self, host: Server) -> None:
        if self.running(host):
            return
        if port_open(host.port):
            raise OperationFailed(
                f"sandbox host {host.name}: port {host.port} is taken by another program"
            )
        data = Path(host.data_dir)
        if self.config.tls:
            for name in ("server.crt", "server.key"):
                certs.install_copy(self.config.home / TLS_DIR / name, data / name, self.config.user)
        conf = data / CONF_FILE
        conf.write_text("".join(f"{k} = {v}\n" for k, v in self.config.settings(host.port).items()))
        if self.config.user:
            shutil.chown(conf, self.config.user, self.config.user)
        server_log = str(self.log(host, "server.log"))
        self._run(
            host,
            "pg_ctl.log",
            "pg_ctl",
            "-D",
            host.data_dir,
            "-l",
            server_log,
            "-w",
            "-t",
            "120",
            "start",
        )

    def stop(self, host: Server, mode: str = "fast", wait: int | None = None) -> bool:
        """Stop the server if it runs (``wait``: pg_ctl's -t); whether it was running."""
        if not self.running(host):
            return False
        timeout = ["-t", str(wait)] if wait else []
        self._run(
            host, "pg_ctl.log", "pg_ctl", "-D", host.data_dir, "-m", mode, "-w", *timeout, "stop"
        )
        return True

    def basebackup(self, primary: Server, replica: Server) -> None:
        """The replica's data directory: ``pg_basebackup -R`` of the running primary (a streaming standby)."""
        data = Path(replica.data_dir)
        shutil.rmtree(data, ignore_errors=True)  # a half-made copy of an interrupted run
        self._own_dir(data)
        args = ["-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D", str(data)]
        args += ["-X", "stream", "-R", "-c", "fast", "--no-sync"]
        run(
            [self.config.tool("pg_basebackup"), *args],
            self.config.user,
            self.log(replica, "basebackup.log"),
            env=self.config.replication_env(),
        )
