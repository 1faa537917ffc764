"""``add-host`` and ``add-shard``."""

from __future__ import annotations

from typing import Any

import click

from ..model.topology import CONFIG_ENV, DEFAULT_FILE
from . import cli, json_option, settings
from .options import connect_timeout_option, finish, run_options
from .output import stdout
from .params import ASCII_INT, flag_option
from .progress import host_progress


def _path() -> str:
    import os

    return settings().config or os.environ.get(CONFIG_ENV) or DEFAULT_FILE


@cli.command("add-host")
@click.argument("name")
@click.option("--dsn", required=True, help="libpq connection string of the new host.")
@click.option("--password-env", metavar="VAR", help="Environment variable holding its password.")
@click.option("--standby", metavar="DSN", help="Optional standby DSN.")
@connect_timeout_option
@json_option
def add_host_cmd(
    name: str,
    dsn: str,
    password_env: str | None,
    standby: str | None,
    connect_timeout: int,
    as_json: bool,
) -> None:
    """Add an empty host to the topology and create its control schema."""
    settings().topology()  # the current file must be valid first
    from ..ops.grow import add_host

    result = add_host(
        _path(),
        name,
        dsn,
        password_env=password_env,
        standby=standby,
        allow_inline_password=settings().allow_inline_password,
        connect_timeout=connect_timeout,
    )
    finish(
        as_json,
        result.to_dict(),
        lambda: stdout.print(
            f"Added host {name} ({result.dsn}) to {result.topology}; it owns no shards yet."
        ),
        None,
    )


@cli.command("add-shard")
@click.option("--host", "host_name", required=True, help="Host that will own the new shards.")
@click.option("--count", type=ASCII_INT, help="Open this many new shards after the current count.")
@click.option(
    "--ids", metavar="RANGE", help="Open exactly these new shard ids (following on from the count)."
)
@click.option(
    "--modulus", type=ASCII_INT, help="Change the routing modulus (refused while shards hold data)."
)
@flag_option("--place-new", help="Send new objects to the new shards (placement.new_objects).")
@connect_timeout_option
@run_options
@json_option
def add_shard_cmd(
    host_name: str,
    count: int | None,
    ids: str | None,
    modulus: int | None,
    place_new: bool,
    as_json: bool,
    **run: Any,
) -> None:
    """Open new logical shards on a host, at the fleet's migration version, and record them."""
    settings().topology()  # the current file must be valid first
    from ..engine.executor import RunOptions
    from ..ops.grow import add_shard

    options = RunOptions(**run)  # jobs, wait, batch_size, recycle_after, connect_timeout
    with host_progress("add-shard", not as_json) as progress:
        result = add_shard(
            _path(),
            host_name,
            count=count,
            ids=ids,
            modulus=modulus,
            place_new=place_new,
            allow_inline_password=settings().allow_inline_password,
            options=options,
            progress=progress,
        )
    finish(
        as_json,
        result.to_dict(),
        lambda: stdout.print(
            f"Opened shards {result.new_shards} on {host_name} at migration version V{result.version or 0} "
            f"in {result.seconds:.2f}s; shard count {result.shard_count}, routing modulus {result.modulus}."
        ),
        None,
    )
