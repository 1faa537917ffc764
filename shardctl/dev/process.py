"""Running the sandbox's server-side programs (PostgreSQL, PgBouncer) on this machine.

Running as root, they run as the unprivileged user ``shardctl`` (PostgreSQL refuses to run as root),
in an environment of their own (``server_env``), with their output in a log file. Also: the local
ports they listen on, and the pid files they leave.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
from pathlib import Path

from ..errors import OperationFailed

SERVER_USER = "shardctl"
SERVER_PATH = "/usr/local/bin:/usr/bin:/bin"


def server_user() -> str | None:
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


RAM_DIR = "/dev/shm"


def _available_memory_gb() -> float:
    """MemAvailable from /proc/meminfo, in GiB (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return 0.0


def ram_backed_dir(need_gb: float) -> str | None:
    """``/dev/shm`` when it is writable and both it and the machine's available memory have
    ``need_gb`` GiB to spare, else None (the system's temporary directory).

    Servers whose data is thrown away (test fleets, scale runs) go there: PostgreSQL's file-heavy work
    (``CREATE DATABASE … TEMPLATE``, ``DROP DATABASE``, checkpoints, new relation files) costs several
    times less CPU on tmpfs than on a journaling filesystem. A container's 64 MB ``/dev/shm`` is
    too small, and falls back."""
    try:
        fs = os.statvfs(RAM_DIR)
    except OSError:
        return None
    room = fs.f_bavail * fs.f_frsize / 1024**3
    if room >= need_gb and _available_memory_gb() >= need_gb and os.access(RAM_DIR, os.W_OK):
        return RAM_DIR
    return None


def make_traversable(path: Path) -> None:
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


def run(
    args: list[str],
    user: str | None,
    log: Path | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> None:
    """Run a server-side program as ``user``; ``env`` is its whole environment (``server_env``)."""
    # Output goes to a file, never a pipe: the postmaster inherits it and would keep a pipe open.
    log = log or Path(os.devnull)
    with open(log, "ab") as sink:
        # Drop root's groups too: with gid 0 kept, root-owned 0711 directories deny access via the group bits.
        ids = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []} if user else {}
        proc = subprocess.run(
            args,
            check=False,
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
