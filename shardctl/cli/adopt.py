"""``shardctl adopt``: bring one live PostgreSQL database into the fleet (``plan``, ``baseline``,
``copy``, ``status``, ``verify``, ``cutover`` with ``--abort`` and ``--cleanup``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from . import cli, json_option, settings
from .options import connect_timeout_option
from .output import stdout, table
from .params import AsciiFloat, AsciiInt, flag_option, shown_option


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


def _refuse_inline_password(dsn: str) -> None:
    """A literal password in ``--from`` is refused, as in the topology, unless
    ``--allow-inline-password``: it would stay in the shell's history and the process list."""
    from ..errors import BadInput
    from ..model import dsn as dsnlib

    if dsnlib.has_inline_password(dsn) and not settings().allow_inline_password:
        raise BadInput(
            "--from contains a literal password; give it in PGPASSWORD or ~/.pgpass (or pass "
            "--allow-inline-password)"
        )


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
    topo = settings().topology()  # a file that does not load is refused before psycopg is imported
    _refuse_inline_password(given["dsn"])
    from ..ops.adopt import adopt_plan
    from .options import finish, status_of

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
                f"history: {h.tool} ({h.table}): applied up to {h.last}",
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
            worst = [s for s in result.queries.statements if s.cls in ("unroutable", "fan-out")]
            for s in sorted(worst, key=lambda s: -s.ms)[:5]:
                text = " ".join(s.query.split())[:120]
                stdout.print(f"{s.cls}: {s.reason}: {text}", highlight=False, markup=False)
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


@adopt_group.command("baseline")
@_from_option
@click.option(
    "--plan", "plan_file", required=True, metavar="FILE", help="The plan file adopt plan wrote."
)
@click.option(
    "--to",
    "target",
    metavar="DIR",
    help="Folder to write into (default: the topology's migrations folder).",
)
@flag_option("--dry-run", help="Build and check the baseline, but write nothing.")
@json_option
@connect_timeout_option
def baseline_cmd(as_json: bool, dry_run: bool, **given: Any) -> None:
    """Write the adopted tables' definitions as the fleet's first migration (V0001__baseline.sql),
    IDs from next_id(); the app's migration history is recorded as applied."""
    topo = settings().topology()
    _refuse_inline_password(given["dsn"])
    from ..ops.adopt import adopt_baseline
    from .options import finish

    given["plan_file"] = Path(given["plan_file"])
    given["target"] = Path(given["target"]) if given["target"] else None
    result = adopt_baseline(topo, dry_run=dry_run, **given)

    def human() -> None:
        verb = "wrote" if result.written else "would write"
        stdout.print(
            f"{verb} {result.file}: {len(result.tables)} sharded table(s), {len(result.types)} type(s)",
            highlight=False,
        )
        for h in result.history:
            stdout.print(
                f"history: {h.tool} ({h.table}) recorded as applied up to {h.last}; the next migration is V0002",
                highlight=False,
            )
        if result.global_tables:
            stdout.print(
                f"global tables, not in the shards: {', '.join(result.global_tables)}",
                highlight=False,
            )
        for item in result.not_carried:
            stdout.print(f"not carried: {item}", highlight=False)

    finish(as_json, result.to_dict(), human, None)


@adopt_group.command("copy")
@_from_option
@click.option(
    "--plan", "plan_file", required=True, metavar="FILE", help="The plan file adopt plan wrote."
)
@shown_option(
    "--copy-workers",
    AsciiInt(1, 4),
    4,
    "COPY streams from the old database in all, spread over the fleet hosts (copied at once).",
)
@shown_option(
    "--nice",
    AsciiFloat(0, 100),
    0,
    "Rest RATIO seconds after each second of the copy, leaving the source's CPU to the "
    "application (1: the copy runs half the time).",
    metavar="RATIO",
)
@click.option(
    "--publisher-dsn",
    metavar="DSN",
    help="How the fleet's servers reach the old database, if not by --from.",
)
@json_option
@connect_timeout_option
def copy_cmd(as_json: bool, **given: Any) -> None:
    """Copy the database into the fleet online (logical replication: one publication, slot and
    subscription per fleet host) and leave every later change streaming to the shards. Re-run to
    resume; `adopt status` shows the progress and lag."""
    topo = settings().topology()
    _refuse_inline_password(given["dsn"])
    from ..ops.adopt.copy import adopt_copy
    from .move import move_progress
    from .options import finish

    given["plan_file"] = Path(given["plan_file"])
    with move_progress(not as_json) as progress:
        result = adopt_copy(
            topo,
            progress=progress,
            allow_inline_password=settings().allow_inline_password,
            **given,
        )

    def human() -> None:
        _print_hosts(f"adopt copy: {result.source}: phase {result.phase}", result.hosts)
        _print_tables_changed(result)
        for note in result.notes:
            stdout.print(f"note: {note}", highlight=False)
        stdout.print(
            f"copied {result.copied_bytes} bytes this run in {result.seconds:.1f}s; "
            f"id floor {result.id_floor}",
            highlight=False,
        )

    finish(as_json, result.to_dict(), human, None)


def _print_tables_changed(result: Any) -> None:
    """What the copy changed on the old database's tables, said by both ``copy`` and ``status``."""
    for table_name in result.replica_identity_full:
        stdout.print(
            f"replica identity changed (its old one recorded): {table_name}", highlight=False
        )
    for table_name in result.routed:
        stdout.print(
            f"routed by trigger (an enum): {table_name}: its rows are held twice on each "
            f"host until the cutover",
            highlight=False,
        )


def _print_hosts(title: str, hosts: list) -> None:
    from ..ops.move.run import human_bytes

    rows = [
        [
            h.host,
            h.shards,
            h.state,
            h.rows,
            human_bytes(h.bytes),
            human_bytes(h.lag_bytes),
            "-" if h.lag_seconds is None else f"{h.lag_seconds:.1f}s",
            human_bytes(h.retained_bytes),
        ]
        for h in hosts
    ]
    columns = ["host", "shards", "state", "rows", "bytes", "lag", "lag (s)", "WAL held"]
    stdout.print(table(title, columns, rows))


@adopt_group.command("status")
@click.option(
    "--from",
    "dsn",
    metavar="DSN",
    help="The database being adopted (default: the topology's adoption.source).",
)
@json_option
@connect_timeout_option
def status_cmd(as_json: bool, **given: Any) -> None:
    """The adoption's phase, each fleet host's copy and lag, the WAL the old database holds for it,
    and the last adopt verify of the run (read-only)."""
    topo = settings().topology()
    if given["dsn"]:
        _refuse_inline_password(given["dsn"])
    from ..ops.adopt.copy import adopt_status
    from ..ops.move.run import human_bytes
    from .options import finish

    result = adopt_status(topo, **given)

    def human() -> None:
        _print_hosts(f"adopt status: {result.source}: phase {result.phase}", result.hosts)
        _print_tables_changed(result)
        stdout.print(
            f"the source holds {human_bytes(result.held_bytes)} of WAL for the copy "
            f"({len(result.hosts)} slot(s) and the id map's; the id map is "
            f"{human_bytes(result.id_map_lag_bytes)} behind)",
            highlight=False,
        )
        stdout.print(_verification_line(result.verification, result.verified), highlight=False)

    finish(as_json, result.to_dict(), human, None)


def _verification_line(run: dict | None, verified: bool) -> str:
    """``adopt status``'s line on the last ``adopt verify`` of the run."""
    if run is None:
        return "adopt verify: not run yet for this copy (the cutover needs a passing run)"
    if run["finished_at"] is None:
        return (
            f"adopt verify: started {run['started_at']}, not finished: {run['checked']} of "
            f"{run['chunks']} chunks checked (run it again to finish; the cutover needs a passing run)"
        )
    summary = run["summary"]
    figures = (
        f"{summary.get('source_rows', 0):,} rows on the source, {summary.get('fleet_rows', 0):,} "
        f"on the fleet, {summary.get('chunks', run['chunks'])} chunks"
    )
    if verified:
        return f"adopt verify: passed at {run['finished_at']} ({figures}); the cutover may run"
    problems = summary.get("problems") or []
    found = f"{problems[0]}" if problems else f"dark reads {summary.get('dark_reads')}"
    return (
        f"adopt verify: failed at {run['finished_at']} ({figures}): {found}; fix it and run "
        f"adopt verify again before the cutover"
    )


@adopt_group.command("verify")
@_from_option
@click.option(
    "--plan", "plan_file", required=True, metavar="FILE", help="The plan file adopt plan wrote."
)
@click.option(
    "--dark-reads",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Sampled values per single-shard read of the app's (0: no dark reads).",
)
@click.option(
    "--chunk-rows",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="Source rows per chunk (each chunk's result is recorded on the source).",
)
@json_option
@connect_timeout_option
def verify_cmd(as_json: bool, **given: Any) -> None:
    """Compare each shard's rows with the source's rows of its keys (counts and checksums, chunked,
    resumable; re-checked at lag 0 while the copy replicates) and run the app's single-shard reads on
    both (dark reads). Exit 1 naming each difference."""
    topo = settings().topology()
    _refuse_inline_password(given["dsn"])
    from ..ops.adopt import adopt_verify
    from .options import finish, status_of
    from .progress import host_progress

    given["plan_file"] = Path(given["plan_file"])
    with host_progress("adopt verify", enabled=not as_json) as progress:
        result = adopt_verify(topo, progress=progress, **given)

    def human() -> None:
        how = "at lag 0 (the copy replicates)" if result.replicating else "(nothing replicates)"
        stdout.print(
            f"adopt verify: {len(result.tables)} table(s), {result.chunks} chunk(s) {how}: "
            f"{result.source_rows} row(s) on the source, {result.fleet_rows} on the fleet"
            + (
                f"; {result.recorded} chunk(s) recorded by the interrupted run"
                if result.recorded
                else ""
            )
            + (
                f"; {result.busy} chunk(s) written throughout, left to the cutover's check"
                if result.busy
                else ""
            ),
            highlight=False,
        )
        for p in result.problems:
            stdout.print(f"[red]differs[/red] {p.message}", markup=True, highlight=False)
        rows = [[d.status, d.reads, d.query[:80], d.detail[:100]] for d in result.dark_reads]
        if rows:
            stdout.print(table("dark reads", ["result", "reads", "statement", "detail"], rows))
        if result.ok:
            stdout.print("Every shard holds exactly its keys' rows.", highlight=False)

    finish(as_json, result.to_dict(), human, status_of(result))


@adopt_group.command("cutover")
@shown_option(
    "--max-freeze",
    AsciiFloat(0.01, 3600),
    0.5,
    "Seconds writes to the adopted tables may be frozen; past it the attempt is rolled back.",
)
@shown_option("--attempts", AsciiInt(1, 100), 3, "Freezes to try before giving up.")
@flag_option("--abort", help="Make the old database authoritative again (until --cleanup).")
@flag_option("--cleanup", help="Drop the way back and the parents: the adoption is final.")
@json_option
@connect_timeout_option
def cutover_cmd(as_json: bool, abort: bool, cleanup: bool, **given: Any) -> None:
    """Switch the adopted tables to the fleet in a freeze bounded by --max-freeze (the old database
    refuses writes from then on); --abort switches back with the writes made since; --cleanup makes it final."""
    topo = settings().topology()
    from ..errors import BadInput

    if abort and cleanup:
        raise BadInput("--abort and --cleanup exclude each other")
    from ..ops.adopt import adopt_abort, adopt_cleanup, adopt_cutover
    from .move import move_progress
    from .options import finish

    with move_progress(not as_json) as progress:
        if cleanup:
            result = adopt_cleanup(
                topo, connect_timeout=given["connect_timeout"], progress=progress
            )
        else:
            run = adopt_abort if abort else adopt_cutover
            result = run(topo, progress=progress, **given)

    def human() -> None:
        what = {"cutover": "cut over", "abort": "aborted", "cleanup": "cleaned up"}[result.action]
        line = f"adopt {what}: phase {result.phase}, authoritative: {result.authoritative or '-'}"
        if result.freeze_seconds is not None:
            line += f"; writes frozen {result.freeze_seconds:.3f}s ({result.attempts} attempt(s))"
        stdout.print(line, highlight=False)
        for kind, names in result.dropped.items():
            if names:
                stdout.print(f"dropped {kind}: {', '.join(names)}", highlight=False)
        for note in result.notes:
            stdout.print(f"note: {note}", highlight=False)

    finish(as_json, result.to_dict(), human, None)
