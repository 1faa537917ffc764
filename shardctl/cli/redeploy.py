"""``shardctl redeploy``: re-deploy changed template functions (next_id() flavour, a team's own) online."""

from __future__ import annotations

import click

from ..model.ranges import format_shards
from ..ops.redeploy import DEFAULT_LOCK_TIMEOUT, redeploy
from . import cli, settings
from .options import host_options, wait_option
from .output import flagged, stdout, table
from .params import flag_option


@cli.command("redeploy")
@host_options
@flag_option("--dry-run", help="Only list the shards whose template functions differ.")
@click.option(
    "--lock-timeout",
    default=DEFAULT_LOCK_TIMEOUT,
    show_default=True,
    help="Give up on a shard when a lock is not granted in time (PostgreSQL interval).",
)
@wait_option
def redeploy_cmd(
    host_names: str | None,
    connect_timeout: int,
    as_json: bool,
    dry_run: bool,
    lock_timeout: str,
    wait: float,
) -> None:
    """Re-deploy template functions (next_id() after an id.function change, your own) on every shard, online.

    Refuses a layout or epoch change, which would break existing IDs."""
    from .options import finish, split_hosts, status_of

    topo = settings().topology()
    report = redeploy(
        topo,
        hosts=split_hosts(host_names),
        dry_run=dry_run,
        lock_timeout=lock_timeout,
        wait=wait,
        connect_timeout=connect_timeout,
    )

    def human() -> None:
        rows = [
            [
                h.host,
                "yes" if h.reachable else "NO",
                "; ".join(f"{o}: {format_shards(s)}" for o, s in h.value.stale.items()) or "-",
                len(h.value.deployed),
                len(h.value.failed),
                f"{h.seconds:.2f}s",
            ]
            for h in report.hosts
        ]
        stdout.print(
            table(
                "redeploy (dry run)" if dry_run else "redeploy",
                ["host", "reachable", "differs", "re-deployed", "failed", "time"],
                rows,
            )
        )
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
