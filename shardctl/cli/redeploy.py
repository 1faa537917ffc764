"""``shardctl redeploy``: re-deploy changed template functions (next_id() flavour, a team's own) online."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..engine.defaults import REDEPLOY_LOCK_TIMEOUT
from ..model.ranges import format_shards
from . import cli, settings
from .options import host_options, wait_option
from .output import flagged, host_table, stdout
from .params import Duration, flag_option, show_duration

if TYPE_CHECKING:
    from ..engine.fanout import HostResult


@cli.command("redeploy")
@host_options
@flag_option("--dry-run", help="Only list the shards whose template functions differ.")
@click.option(
    "--lock-timeout",
    type=Duration(),
    default=REDEPLOY_LOCK_TIMEOUT,
    show_default=show_duration(REDEPLOY_LOCK_TIMEOUT),
    help="Give up on a shard when a lock is not granted in time (PostgreSQL interval).",
)
@wait_option
def redeploy_cmd(as_json: bool, **given: Any) -> None:
    """Re-deploy template functions (next_id() after an id.function change, your own) on every shard, online.

    Refuses a layout or epoch change, which would break existing IDs."""
    from .options import finish, status_of

    topo = settings().topology()
    from ..ops.redeploy import redeploy

    report = redeploy(topo, **given)

    def cells(h: HostResult) -> list:
        stale = "; ".join(f"{o}: {format_shards(s)}" for o, s in h.value.stale.items()) or "-"
        return ["yes" if h.reachable else "NO", stale, len(h.value.deployed), len(h.value.failed)]

    def human() -> None:
        title = "redeploy (dry run)" if report.dry_run else "redeploy"
        columns = ["reachable", "differs", "re-deployed", "failed"]
        stdout.print(host_table(title, columns, report.hosts, cells))
        for h in report.hosts:
            if h.error:
                flagged(h.host, h.error)
            for f in h.value.failed[:20]:
                stdout.print(
                    f"[red]failed[/red] shard {f['shard']} on {h.host}: {f['error']}",
                    markup=True,
                    highlight=False,
                )
        if report.ok and not any(h.value.stale for h in report.hosts):
            stdout.print(
                "Nothing to re-deploy: every shard's template functions match the rendering."
            )

    finish(as_json, report.to_dict(), human, status_of(report))
