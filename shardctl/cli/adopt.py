"""``shardctl adopt``: bring one live PostgreSQL database into the fleet (``plan``, ``baseline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from . import cli, json_option, settings
from .options import connect_timeout_option
from .output import stdout, table


@cli.group("adopt")
def adopt_group() -> None:
    """Adopt an existing database: plan it (read-only), then write its baseline migration."""


def _from_option(func: Any) -> Any:
    return click.option(
        "--from",
        "dsn",
        required=True,
        metavar="DSN",
        help="The database to adopt (a libpq DSN; its password from PGPASSWORD or ~/.pgpass).",
    )(func)


def _schema_option(func: Any) -> Any:
    return click.option(
        "--schema", default="public", show_default=True, help="The app's schema in that database."
    )(func)


@adopt_group.command("plan")
@_from_option
@_schema_option
@click.option(
    "--root", metavar="TABLE", help="The table whose primary key is the shard key (default: found)."
)
@click.option("--out", metavar="FILE", help="Write the plan file here (written with blockers too).")
@json_option
@connect_timeout_option
def plan_cmd(as_json: bool, **given: Any) -> None:
    """Plan the adoption (read-only): each table's shard key, the blockers and their fixes, and the
    app's statements by class. Exit 1 when there are blockers."""
    from ..ops.adopt import adopt_plan
    from .options import finish, status_of

    topo = settings().topology()
    given["out"] = Path(given["out"]) if given["out"] else None
    result = adopt_plan(topo, **given)

    def human() -> None:
        rows = [
            [t.name, t.kind, t.key or "-", " then ".join(t.path) or "-", t.id_column or "-", t.rows]
            for t in result.tables
        ]
        columns = ["table", "kind", "key", "foreign-key path", "id column", "rows (est.)"]
        stdout.print(table(f"adopt plan: {result.source} ({result.schema})", columns, rows))
        stdout.print(
            f"root {result.root}.{result.root_key}; global tables on {result.global_host}; "
            f"groups: {'; '.join(', '.join(g) for g in result.groups) or '-'}",
            highlight=False,
        )
        for h in result.history:
            stdout.print(
                f"history: {h.tool} ({h.table}): {h.applied} applied, last {h.last}",
                highlight=False,
            )
        if result.queries.available:
            q = result.queries.classes
            rows = [
                [c, v["statements"], v["calls"], f"{100 * v['time_share']:.1f}%"]
                for c, v in q.items()
            ]
            stdout.print(
                table("the app's statements", ["class", "statements", "calls", "time"], rows)
            )
        for note in result.notes:
            stdout.print(f"note: {note}", highlight=False)
        for b in result.blockers:
            stdout.print(f"[red]blocker[/red] {b.message}", markup=True, highlight=False)
            for line in b.fix:
                stdout.print(f"    {line}", highlight=False, markup=False)
        if result.written:
            stdout.print(f"wrote {result.written}", highlight=False)
        if result.ok:
            stdout.print(
                "No blockers: next, `shardctl adopt baseline --plan FILE`.", highlight=False
            )

    finish(as_json, result.to_dict(), human, status_of(result))
