"""What both sandbox engines share: the directory with its state, ``shardctl.yaml`` and migrations,
the checks of ``up``'s arguments, and waiting for a new server to accept connections."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ..errors import BadInput
from ..model.layouts import SIGNLESS_INSTAGRAM_BITS
from ..sql.render import builtin_dir

DATABASE = "app"
DEFAULT_HOSTS = 2
DEFAULT_SHARDS = 256
MAX_HOSTS = 64
MAX_SHARDS = 8192  # the 13 shard bits of the layout the sandbox writes


class HostState(Protocol):
    name: str

    @property
    def dsn(self) -> str: ...


class FleetState(Protocol):
    """What ``topology_text`` reads of an engine's state (SandboxState, DockerState)."""

    hosts: list[Any]
    password_env: str | None

    def standby_of(self, name: str) -> HostState | None: ...


def read_state(path: Path) -> dict | None:
    """An engine's state file as a dict; None when there is none."""
    return json.loads(path.read_text()) if path.exists() else None


def write_state(path: Path, state: Any) -> None:
    """``state`` (a dataclass) as its state file, indented JSON."""
    path.write_text(json.dumps(asdict(state), indent=2) + "\n")


def check_up_args(hosts: int, shards: int, password_env: str | None) -> None:
    """``sandbox up``'s numbers and password variable, before anything is made."""
    if hosts < 1 or hosts > MAX_HOSTS:
        raise BadInput(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    if shards < 1 or shards > MAX_SHARDS:
        raise BadInput(
            f"--shards must be between 1 and {MAX_SHARDS} (the sandbox layout's 13 shard bits), got {shards}"
        )
    if shards < hosts:
        raise BadInput(f"--shards ({shards}) must be at least --hosts ({hosts})")
    if password_env and not os.environ.get(password_env):
        raise BadInput(f"--password-env {password_env}: that environment variable is not set")


def connect_when_ready(
    dsn: str, password_env: str | None, timeout: float, gone: Callable[[], bool] | None = None
) -> Any:
    """An autocommit connection to a server that is starting; raises the last OperationalError
    after ``timeout`` seconds, or as soon as ``gone()`` says the server will not come."""
    import psycopg

    kwargs = {"password": os.environ.get(password_env)} if password_env else {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=5, **kwargs)
        except psycopg.OperationalError:
            if time.monotonic() > deadline or (gone is not None and gone()):
                raise
            time.sleep(0.2)


def topology_text(state: FleetState, shards: int, function: str, epoch: str) -> str:
    """``shardctl.yaml`` for the sandbox's hosts: shards split evenly, standbys named."""
    n = len(state.hosts)
    lines = [
        "# Written by `shardctl sandbox up`: a local fleet for trying shardctl.",
        "version: 1",
        "id:",
        "  # Instagram's split (41 ms | 13 shard) with 9 sequence bits: 63 bits, so IDs never turn",
        "  # negative; 8192 shards, 512 IDs per ms per shard (`shardctl info` shows the limits).",
        "  layout: custom",
        f"  bits: {{{', '.join(f'{k}: {v}' for k, v in SIGNLESS_INSTAGRAM_BITS.items())}}}",
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


class SandboxBase:
    """A sandbox directory: the engine's state file, ``shardctl.yaml`` and ``migrations/``."""

    state_class: ClassVar[Any]  # the engine's state: read(directory) -> state | None
    missing: ClassVar[str] = "no sandbox in {dir}"  # the error when there is no state, by ``dir``

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory).resolve()

    @property
    def topology_path(self) -> Path:
        return self.dir / "shardctl.yaml"

    @property
    def state(self) -> Any:
        return self.state_class.read(self.dir)

    def host_count(self, requested: int | None, state: Any = None) -> int:
        """How many servers ``up`` runs: on a sandbox whose topology is written, exactly the hosts it
        wrote it for (another ``requested`` count is refused: the topology would not name a new
        server, and a smaller count would leave hosts it names down); else ``requested`` (default
        DEFAULT_HOSTS), at least the hosts an interrupted first ``up`` made."""
        state = self.state if state is None else state
        made = len(state.hosts) if state is not None else 0
        if made and self.topology_path.exists():
            if requested is not None and requested != made:
                raise BadInput(
                    f"--hosts {requested}: the sandbox in {self.dir} has {made} "
                    f"host{'s' if made > 1 else ''}, named in its shardctl.yaml; run `sandbox up` "
                    f"without --hosts to restart them (shardctl add-host adds a server), or use "
                    f"another --dir"
                )
            return made
        return max(requested or DEFAULT_HOSTS, made)

    def _require_state(self) -> Any:
        state = self.state
        if state is None:
            raise BadInput(self.missing.format(dir=self.dir))
        return state

    @staticmethod
    def topology_text(state: FleetState, shards: int, function: str, epoch: str) -> str:
        return topology_text(state, shards, function, epoch)

    def _write_fleet_files(self, state: FleetState, shards: int, function: str, epoch: str) -> bool:
        """``shardctl.yaml`` when the directory has none (whether it wrote one), and the built-in
        migrations when it has no ``migrations/``."""
        wrote = not self.topology_path.exists()
        if wrote:
            self.topology_path.write_text(self.topology_text(state, shards, function, epoch))
        migrations = self.dir / "migrations"
        if not migrations.exists():
            shutil.copytree(builtin_dir("migrations"), migrations)
        return wrote
