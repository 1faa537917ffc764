"""What fleet tests share besides fixtures: the CLI in-process, topologies, connections."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
from click.testing import CliRunner

from shardctl.cli import cli
from shardctl.dev.process import ram_backed_dir
from shardctl.model.topology import Topology

# A test's own servers (private sandboxes, standbys) hold little data: 2 GiB of tmpfs is plenty.
PRIVATE_NEED_GB = 2


def sandbox_dir(label: str) -> Path:
    """A directory for servers, outside pytest's tmp_path: on tmpfs when it has room, like the
    session's servers (``dev.process.ram_backed_dir``).

    pytest deletes old base temp dirs (a concurrent pytest session would delete a running server's
    data directory), and resets ``/tmp/pytest-of-<user>`` to mode 0700 when a session starts, so a
    server running as the unprivileged sandbox user would lose access to it."""
    return Path(
        tempfile.mkdtemp(prefix=f"shardctl-test-{label}-", dir=ram_backed_dir(PRIVATE_NEED_GB))
    )


def admin_dsn(port: int, db: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}"


def load(path: Path) -> Topology:
    return Topology.load(path)


def stale_copy(path: Path, name: str = "stale.yaml") -> Path:
    """Another app server's copy of the topology file (beside it: its relative paths hold), taken now
    and never updated: a Router on it meets a move only through the old host's redirect."""
    copy = path.with_name(name)
    shutil.copy(path, copy)
    return copy


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
