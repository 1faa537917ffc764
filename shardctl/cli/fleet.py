"""Commands that work on the fleet: init, migrate, plan, verify, status.

Each command parses its options, calls one library function, and renders its typed result; the
library's ``raise_for_status`` decides the exit code. A command names the options it reads itself;
those it only hands on arrive in ``**given`` and reach the function by name (each option's parameter
is named as the function's: Python's own TypeError otherwise), the run options in ``**run``, passed
as ``RunOptions(**run)``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from ..engine.defaults import (
    DEFAULT_LOCK_RETRIES,
    DEFAULT_LOCK_WAIT,
    DEFAULT_MAX_LOCK_HOLD,
    DEFAULT_RETRY_BUDGET,
)
from ..errors import BadInput, ShardctlError
from ..model.ranges import format_shards
from . import cli, settings
from .options import finish, host_options, option_group, run_options, status_of
from .output import flagged, host_table, stdout, table
from .params import (
    ASCII_INT,
    AsciiFloat,
    AsciiInt,
    Duration,
    flag_option,
    show_duration,
    shown_option,
)
from .progress import host_progress

if TYPE_CHECKING:
    from ..engine.fanout import FleetReport, HostResult
    from ..ops.migrate import MigrateResult


def _state(h) -> str:
    return (
        "unreachable"
        if not h.reachable
        else ("error" if h.error else ("failed" if h.value.failed else "ok"))
    )


def _unsaid(text: str | None, error: ShardctlError | None) -> bool:
    """Whether ``text`` still needs printing: the one-line error on stderr does not already say it."""
    return bool(text) and (error is None or text not in str(error))


def _host_errors(hosts: list, error: ShardctlError | None) -> None:
    """Each host error the stderr line does not already carry, host named once."""
    from ..engine.fanout import host_error

    for h in hosts:
        if _unsaid(h.error, error):
            stdout.print(host_error(h), markup=False, highlight=False)


def _print_failed(
    report: FleetReport, with_version: bool, error: ShardctlError | None = None
) -> None:
    failed = [f for f in report.failed if _unsaid(f"shard {f['shard']} on {f['host']}", error)]
    for f in failed[:50]:
        version = (
            f" at {f.get('file') or 'V' + str(f['version'])}"
            if f.get("version") or with_version
            else ""
        )
        stdout.print(
            f"[red]failed[/red] shard {f['shard']} ({f['schema']}) on {f['host']}{version}: {f['error']}",
            markup=True,
            highlight=False,
        )
    if len(failed) > 50:
        stdout.print(f"… and {len(failed) - 50} more failed shards (see --json)")


def fleet_table(report: FleetReport, title: str, error: ShardctlError | None = None) -> None:
    def cells(h: HostResult) -> list:
        d = h.value
        sizes = [len(d.created), len(d.migrated), d.unchanged, len(d.failed), len(d.not_started)]
        return [_state(h), *sizes]

    columns = ["state", "created", "migrated", "unchanged", "failed", "not started"]
    stdout.print(host_table(title, columns, report.hosts, cells))
    _host_errors(report.hosts, error)
    _print_failed(report, with_version=False, error=error)


@cli.command("init")
@host_options
@run_options
def init_cmd(hosts: list[str] | None, as_json: bool, **run: Any) -> None:
    """Create the control schema and every shard (schema, sequence, next_id(), migrations) on every host."""
    topo = settings().topology()
    # each command imports its own operation once the topology has loaded (start-up of the others)
    from ..engine.executor import RunOptions
    from ..ops.provision import init

    with host_progress("init", not as_json) as progress:
        options = RunOptions(**run)
        report = init(topo, hosts=hosts, options=options, progress=progress)

    error = status_of(report)

    from ..engine.fanout import InitFigures  # loaded with init

    def human() -> None:
        fleet_table(report, f"init: {topo.shard_count} shards on {len(topo.hosts)} hosts", error)
        figures = report.extra or InitFigures()  # init always gives them
        for host, shards in figures.recreated.items():
            flagged(
                host,
                f"shards {shards} were recorded but their schemas had been dropped; built them again",
                "yellow",
            )
        if report.ok and not report.changed:
            stdout.print(
                f"Nothing to do: every shard exists and is at version {figures.latest_version}. "
                f"({report.seconds:.2f}s)"
            )
        elif report.ok:
            stdout.print(f"{init_summary(report)}, in {report.seconds:.2f}s.")

    finish(as_json, report.to_dict(), human, error)


def _versions(versions: set[int]) -> str:
    ordered = sorted(versions)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"V{ordered[0]}–V{ordered[-1]}"
    return ", ".join(f"V{v}" for v in ordered)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def init_summary(report: FleetReport) -> str:
    """What init did, in one sentence: shards created (each brought to the latest version, its
    migrations applied) and existing shards migrated, with the versions applied."""
    latest = report.extra.latest_version if report.extra is not None else 0
    created = report.total("created")
    migrated = [report.outcome(h).migrated for h in report.hosts]
    applied = {v for per_host in migrated for versions in per_host.values() for v in versions}
    parts = []
    if created:
        parts.append(
            f"Created {_count(created, 'shard')} at V{latest}"
            + (
                f" (migrations {_versions(set(range(1, latest + 1)))} applied to each)"
                if latest
                else ""
            )
        )
    moved = sum(len(m) for m in migrated)
    if moved:
        parts.append(
            f"migrated {_count(moved, 'existing shard')} to V{latest} (applied {_versions(applied)})"
        )
    hosts = [h.host for h in report.hosts if report.outcome(h).host_applied]
    if hosts:
        versions = {v for h in report.hosts for v in report.outcome(h).host_applied}
        listed = ", ".join(f"H{v}" for v in sorted(versions))
        parts.append(f"applied host-level {listed} on {', '.join(hosts)}")
    if not parts:
        return f"Created the control schema; every shard was already at V{latest}"
    text = "; ".join(parts)
    return text[0].upper() + text[1:]


def _migrate_notes(report: MigrateResult, error: ShardctlError | None) -> None:
    """Per host: errors, drift, gaps, orphans, repairs, shards held by moves, shards not started."""
    for h in report.hosts:
        d = report.host(h)
        _host_errors([h], error)
        for dr in d.drift:
            flagged(
                h.host,
                f"{dr.file} changed after it was applied (shards {format_shards(dr.shards)}); "
                f"restore it, or accept it with `shardctl migrate --repair --yes`",
            )
        for v, s in d.gaps.items():
            flagged(
                h.host,
                f"V{v} is missing from the ledger of shards {format_shards(s)}, "
                f"though later versions are applied there",
            )
        for v, s in d.orphans.items():
            flagged(
                h.host,
                f"V{v} is applied on shards {format_shards(s)} but its file is gone",
                "yellow",
            )
        for line in d.held:
            flagged(h.host, f"pending: {line}", "yellow")
        if d.host_applied:
            names = ", ".join(report.host_files.get(v, f"H{v}") for v in d.host_applied)
            stdout.print(f"{h.host}: applied host-level {names}", markup=False, highlight=False)
        if d.repaired:
            stdout.print(f"{h.host}: recorded new checksums for {d.repaired} ledger rows")
        if d.retried:
            stdout.print(
                f"{h.host}: {d.retried} shard(s) applied after waiting out another transaction's lock"
            )
        if d.not_started:
            stdout.print(
                f"{h.host}: not started: shards {format_shards(d.not_started)}", highlight=False
            )


def _check_passed_plainly(report: MigrateResult, error: ShardctlError | None) -> bool:
    """A passing ``migrate --check`` with nothing to note is printed as plain lines, one per host:
    the CI gate then never imports rich (its table costs ~40 ms of a ~0.3 s process)."""
    if not report.check or error is not None or report.failed or report.host_files:
        return False
    for h in report.hosts:
        d = report.host(h)
        if _state(h) != "ok" or h.error or d.pending or d.missing or d.not_started:
            return False
        if d.drift or d.gaps or d.orphans or d.held or d.repaired or d.retried:
            return False
    lines = [f"check to V{report.target}"]
    lines += [
        f"{h.host}: ok, {report.host(h).unchanged} up to date ({h.seconds:.2f}s)"
        for h in report.hosts
    ]
    lines.append(f"Nothing pending: every shard in scope is at V{report.target}.")
    lines.append(f"check took {report.seconds:.3f}s")
    click.echo("\n".join(lines))
    return True


def migrate_human(report: MigrateResult, error: ShardctlError | None) -> None:
    if _check_passed_plainly(report, error):
        return

    def cells(h: HostResult) -> list:
        d = report.host(h)
        pending = ", ".join(f"V{v}×{n}" for v, n in d.pending.items()) or "-"
        counts = [len(d.migrated), d.unchanged, len(d.failed), len(d.not_started)]
        host_level = []
        if report.host_files:
            done = [f"H{v}" for v in d.host_applied]
            due = [f"H{v} pending" for v in d.host_level.pending]
            host_level = [", ".join(done + due) or "-"]
        return [_state(h), pending, *host_level, *counts, format_shards(d.missing) or "-"]

    mode = "check" if report.check else ("dry run" if report.dry_run else "migrate")
    columns = ["state", "pending", "migrated", "up to date", "failed", "not started"]
    if (
        report.host_files
    ):  # host-level migrations: applied here (H versions), or pending with --check
        columns.insert(2, "host-level")
    title = f"{mode} to V{report.target}"
    stdout.print(host_table(title, [*columns, "missing shards"], report.hosts, cells))
    _migrate_notes(report, error)
    _print_failed(report, with_version=True, error=error)
    if report.dry_run:
        for h in report.hosts:
            for label, text in report.host(h).dry_run_sql.items():
                stdout.print(
                    f"-- {h.host}, {label} (first pending shard; others alike)", markup=False
                )
                stdout.print(text, markup=False, highlight=False)
    if report.check and error is None:
        stdout.print(f"Nothing pending: every shard in scope is at V{report.target}.")
    stdout.print(f"{mode} took {report.seconds:.3f}s")


# How migrate waits for, retries and holds its shards' table locks.
lock_options = option_group(
    shown_option(
        "--max-lock-hold",
        Duration("ms", 0.001, 600),
        show_duration(DEFAULT_MAX_LOCK_HOLD),
        "How long a batch may hold its shards' locks (milliseconds, or with a unit: 1s); "
        "batches are sized to stay under it.",
    ),
    shown_option(
        "--retry-budget",
        AsciiFloat(0, 86_400),
        DEFAULT_RETRY_BUDGET,
        "Seconds a blocked shard keeps being retried, in all.",
    ),
    shown_option(
        "--lock-retries",
        AsciiInt(0, 1000),
        DEFAULT_LOCK_RETRIES,
        "Retries of a shard whose lock wait timed out (0: fail at once).",
    ),
    shown_option(
        "--lock-timeout",
        Duration(),
        show_duration(DEFAULT_LOCK_WAIT),
        "How long one shard waits for a table lock before it is put back and retried "
        "(PostgreSQL interval).",
    ),
)


def _repair_confirmed() -> bool:
    """Ask on a terminal before ``--repair`` accepts edited migration files as applied."""
    return sys.stdin.isatty() and click.confirm(
        "--repair records the current checksum of every changed applied migration, "
        "accepting the edited files as applied. Continue?",
        default=False,
        err=True,
    )


@cli.command("migrate")
@host_options
@run_options
@lock_options
@click.option("--shards", "shard_spec", metavar="RANGE", help="Only these shards (e.g. 0-1023).")
@click.option("--target", type=ASCII_INT, help="Migrate up to this version (default: the latest).")
@flag_option("--dry-run", help="Render and show what would run; touch nothing.")
@flag_option("--check", help="Exit 1 if anything is pending, listing it (for CI); touch nothing.")
@flag_option(
    "--continue-on-error",
    help="Keep starting shards after a failure (default: finish the shards in flight, start no more).",
)
@click.option(
    "--statement-timeout",
    type=Duration(),
    default=None,
    help="Cancel any one statement that runs longer (interval).",
)
@flag_option("--repair", help="Accept changed applied migrations: record their new checksums.")
@flag_option("--yes", help="Confirm --repair.")
@click.option(
    "--base",
    metavar="DIR",
    help="With --check: the pull-request gate against the base branch's "
    "migrations folder (passes when the change only adds migrations after the base's head).",
)
def migrate_cmd(
    hosts: list[str] | None,
    as_json: bool,
    shard_spec: str | None,
    target: int | None,
    dry_run: bool,
    check: bool,
    repair: bool,
    yes: bool,
    base: str | None,
    **run: Any,
) -> None:
    """Apply pending versioned migrations to every shard on every host."""
    if base is not None:
        if not check or dry_run or repair or target is not None or shard_spec:
            raise BadInput(
                "--base is the pull-request gate: use it as `migrate --check --base DIR` "
                "(with --hosts at most)"
            )
        from .gate import run_gate

        return run_gate(base, hosts, run["connect_timeout"], as_json)
    if repair and not (check or dry_run or yes) and not _repair_confirmed():
        raise BadInput("--repair rewrites the ledger's checksums; confirm with --yes")
    topo = settings().topology()
    from ..engine.executor import RunOptions
    from ..ops.migrate import migrate, parse_shard_filter

    options = RunOptions(**run)
    with host_progress("migrate", not (as_json or check or dry_run)) as progress:
        report = migrate(
            topo,
            target=target,
            hosts=hosts,
            shards=parse_shard_filter(shard_spec, topo),
            dry_run=dry_run,
            check=check,
            repair=repair,
            options=options,
            progress=progress,
        )
    error = status_of(report)
    finish(as_json, report.to_dict(), lambda: migrate_human(report, error), error)


@cli.command("plan")
@host_options
@click.option("--target", type=ASCII_INT, help="Plan up to this version (default: the latest).")
def plan_cmd(as_json: bool, **given: Any) -> None:
    """Per host: pending versions and how many shards are at each version."""
    topo = settings().topology()
    from ..ops.plan import plan

    result = plan(topo, **given)
    doc = result.to_dict()

    def human() -> None:
        rows = []
        for h in doc["hosts"]:
            if not h["reachable"]:
                rows.append([h["host"], "unreachable", "-", "-"])
                continue
            at = ", ".join(f"V{v}: {n}" for v, n in h["versions"].items()) or "-"
            pend = ", ".join(f"V{v} on {n} shards" for v, n in h["pending"].items()) or "nothing"
            rows.append([h["host"], at, pend, h["missing"] or "-"])
        stdout.print(
            table(
                f"plan to V{doc['target']} (latest V{doc['latest_version']})",
                ["host", "shards at version", "pending", "shards missing"],
                rows,
            )
        )
        _host_errors(result.hosts, error)
        for h in doc["hosts"]:
            for dr in h["drift"]:
                flagged(
                    h["host"], f"{dr['file']} changed after it was applied (shards {dr['shards']})"
                )
            for v, s in h["gaps"].items():
                flagged(h["host"], f"V{v} missing from the ledger of shards {s}")
            for v, s in h["orphans"].items():
                flagged(h["host"], f"V{v} is applied on shards {s} but its file is gone", "yellow")
            for line in h["held"]:
                flagged(h["host"], line, "yellow")
        for line in result.templates.lines():
            stdout.print(line, markup=False, highlight=False)
        total = doc["pending_total"]
        stdout.print(f"{total} shard migration(s) pending." if total else "Nothing pending.")

    error = status_of(result)  # pending work is what plan shows, not an error
    finish(as_json, doc, human, error)


@cli.command("verify")
@host_options
@shown_option("--samples", AsciiInt(2, 100_000), 16, "next_id() calls per shard.")
@shown_option(
    "--tolerance-ms",
    AsciiInt(1, 86_400_000),
    5000,
    "Allowed gap between an ID's time and the host clock.",
)
@flag_option(
    "--full",
    help="Render and compare every shard's next_id() body and check every "
    "shard's IDs (default: every body's shape, IDs of 512 shards per host "
    "and of every shard whose body or sequence is off), and list every "
    "object a shard's schema differs in (default: the first 3).",
)
def verify_cmd(as_json: bool, **given: Any) -> None:
    """Check IDs, next_id() definitions, clocks and shard placement on every host."""
    topo = settings().topology()
    from ..ops.verify import verify

    report = verify(topo, **given)
    doc = report.to_dict()

    def cells(h: HostResult) -> list:
        v = h.value
        skew = "-" if v.clock_skew_ms is None else f"{v.clock_skew_ms:+.1f} ms"
        reachable = "yes" if h.reachable else "NO"
        checked = [v.shards_checked, v.ids_checked]
        return [reachable, *checked, skew, v.server_version or "-", len(v.violations)]

    def human() -> None:
        columns = ["reachable", "shards", "IDs checked", "clock skew", "server", "violations"]
        stdout.print(host_table("verify", columns, report.hosts, cells))
        lim = doc["layout"]
        stdout.print(
            f"Layout {lim['name']}: {lim['ids_per_ms_per_shard']} IDs/ms per shard; IDs overflow on "
            f"{lim['overflow_at']}"
            + (f", turn negative on {lim['negative_at']}" if lim["negative_at"] else "")
        )
        if report.schemas:
            counted = sum(len(g.shards) for g in report.schemas)
            right = sum(len(g.shards) for g in report.schemas if g.reference)
            stdout.print(
                f"Schemas: {right} of {counted} shards are what the migration files define "
                "(a reference built from them in a scratch database)",
                highlight=False,
            )
        for line in report.pending:
            stdout.print(f"[yellow]pending[/yellow] {line}", markup=True, highlight=False)
        for note in report.reference_notes:
            stdout.print(f"note: {note}", markup=False, highlight=False)
        _host_errors(report.hosts, error)
        for v in [
            v for v in report.violations if _unsaid(f"{v.host} shard {v.shard}: {v.reason}", error)
        ][:100]:
            where = f"shard {v.shard} ({v.schema})" if v.shard is not None else "host"
            stdout.print(
                f"[red]violation[/red] {v.host} {where}: {v.reason}", markup=True, highlight=False
            )
        if report.ok:
            stdout.print(f"verify passed in {report.seconds:.2f}s")

    error = status_of(report)
    finish(as_json, doc, human, error)


@cli.command("status")
@host_options
def status_cmd(as_json: bool, **given: Any) -> None:
    """Fleet table: reachability, shards expected vs present, versions, drift, moves, last event."""
    topo = settings().topology()
    from ..ops.status import status

    report = status(topo, **given)
    doc = report.to_dict()

    def human() -> None:
        rows = []
        for h in doc["hosts"]:
            versions = (
                "-"
                if h["min_version"] is None
                else (
                    f"V{h['min_version']}"
                    if h["min_version"] == h["max_version"]
                    else f"V{h['min_version']}–V{h['max_version']}"
                )
            )
            drift = []
            if h["missing"]:
                drift.append(f"missing {h['missing']}")
            if h["unexpected"]:
                drift.append(f"unexpected {h['unexpected']}")
            drift += [f"failed: {line}" for line in h["failed"]]
            if h["lagging"]:
                drift.append(f"behind: {h['lagging']}")
            rows.append(
                [
                    h["host"],
                    "yes" if h["reachable"] else "[red]NO[/red]",
                    h["server_version"] or "-",
                    f"{h['present']}/{h['expected']}",
                    versions,
                    "; ".join(drift) or "-",
                    h["moving"] or "-",
                    h["last_event"] or "-",
                ]
            )
        schemas = doc["distinct_schemas"]
        t = table(
            f"status (latest migration V{doc['latest_version']}; {schemas} distinct shard "
            f"schema{'' if schemas == 1 else 's'}"
            + ("" if schemas < 2 else ": run shardctl verify")
            + ")",
            ["host", "reachable", "server", "shards", "versions", "drift", "moving", "last event"],
            [],
        )
        for r in rows:
            t.add_row(*[str(x) for x in r])
        stdout.print(t)
        for h in doc["hosts"]:
            if h["error"]:
                stdout.print(f"{h['host']}: {h['error']}", markup=False)
            if h["orphan_versions"]:
                stdout.print(
                    f"{h['host']}: applied versions with no migration file: "
                    f"{', '.join(f'V{v}' for v in h['orphan_versions'])}",
                    markup=False,
                )
        for line in doc["pending_moves"]:
            stdout.print(line, markup=False)

    error = status_of(report)
    finish(as_json, doc, human, error)
