"""``shardctl lint``: squawk and shardctl's own rules over new migrations, rendered for a sample shard (logic in
sql/lint.py and sql/shard_lint.py)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import OperationFailed, first_few
from ..sql.lint import lint, new_migrations
from . import cli, json_option, settings
from .output import stdout
from .params import ASCII_INT, shown_option


@cli.command("lint")
@click.option(
    "--base",
    metavar="DIR",
    help="The base branch's migrations folder: lint only the migrations "
    "the change adds after its head (default: every migration).",
)
@shown_option("--shard", ASCII_INT, 0, "Render the migrations for this shard.")
@json_option
def lint_cmd(base: str | None, shard: int, as_json: bool) -> None:
    """Flag dangerous DDL in new migrations: squawk, plus shardctl's rules for schema-per-shard (catalog
    lookups with no schema filter, fixed schemas, database-wide statements, search_path, CONCURRENTLY in a
    transaction, sequences that bypass next_id()); rules set in the topology's lint: section."""
    from .options import finish

    topo = settings().topology()
    result = lint(topo, new_migrations(topo, Path(base) if base else None), shard)

    def human() -> None:
        if not result.files:
            stdout.print("No new migrations to lint.")
            return
        for f in result.findings:
            stdout.print(
                ("[red]silently wrong:[/red] " if f.silently_wrong else "")
                + f"[red]{f.file}:{f.line}:{f.column}[/red] {f.rule}: {f.message}"
                + (f" ({f.help})" if f.help else ""),
                markup=True,
                highlight=False,
            )
        skipped = (
            f"; rules off: {', '.join(result.excluded_rules)}" if result.excluded_rules else ""
        )
        stdout.print(
            f"lint (squawk and shardctl's schema-per-shard rules): {len(result.findings)} finding(s) in "
            f"{', '.join(result.files)} "
            f"(rendered for shard {result.shard}{skipped})",
            highlight=False,
        )

    error = None
    if result.findings:
        said = first_few(
            result.findings,
            1,
            lambda f: (
                ("silently wrong: " if f.silently_wrong else "")
                + f"{f.file}:{f.line} {f.rule}: {f.message}"
            ),
        )
        error = OperationFailed(f"lint: {said}")
    finish(as_json, result.to_dict(), human, error)
