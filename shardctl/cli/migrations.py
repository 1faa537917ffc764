"""``shardctl migrations import``: another tool's migration history as shardctl migrations."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli, json_option, settings
from .output import stdout
from .params import flag_option


@cli.group("migrations")
def migrations_group() -> None:
    """Work with the migrations folder (import another tool's history)."""


@migrations_group.command("import")
@click.option(
    "--from",
    "fmt",
    required=True,
    metavar="FORMAT",
    help="The history's tool: golang-migrate, goose, dbmate, flyway or prisma.",
)
@click.option(
    "--to",
    "target",
    metavar="DIR",
    help="Folder to write into (default: the topology's migrations folder).",
)
@flag_option("--dry-run", help="Convert, check and lint, but write nothing.")
@click.argument("directory", metavar="DIR")
@json_option
def import_cmd(fmt: str, target: str | None, dry_run: bool, directory: str, as_json: bool) -> None:
    """Import a migration history in its own order, one V file per migration; report lint findings
    and what must change before the first init."""
    from ..ops.import_history import import_history
    from .options import finish

    topo = settings().topology()
    result = import_history(
        topo, fmt, Path(directory), Path(target) if target else None, dry_run=dry_run
    )

    def human() -> None:
        for f in result.files:
            kind = " (host-level)" if f.host_level else ""
            stdout.print(f"{f.source} -> {f.name}{kind}", highlight=False)
            for note in f.notes:
                stdout.print(f"    {note}", highlight=False)
        for f in result.findings:
            mark = "silently wrong: " if f.silently_wrong else ""
            stdout.print(
                f"{mark}{f.file}:{f.line}:{f.column} {f.rule}: {f.message}", highlight=False
            )
        verb = "would write" if dry_run else "wrote"
        stdout.print(
            f"{verb} {len(result.files)} file(s) into {result.target_dir} from {result.format} "
            f"({len(result.findings)} lint finding(s))",
            highlight=False,
        )
        if result.must_change:
            stdout.print("Before the first init, change:", highlight=False)
            for line in result.must_change:
                stdout.print(f"  - {line}", highlight=False)

    finish(as_json, result.to_dict(), human, None)
