"""``migrate``: apply pending versioned migrations to every shard on every host.

Per host, under the host's advisory lock:

1. one query reads every shard with its highest applied version (and how many
   versions it has, to spot holes): that alone answers "is anything pending?";
2. the integrity check compares the ledger's checksums with the rendered files,
   re-rendering only what the ledger's cache does not vouch for (``engine.ledger``);
3. pending shards are applied by the executor; shards being moved are left pending,
   with the command that unblocks them.

The result is a typed ``MigrateResult``; its ``raise_for_status`` tells "pending"
(``PendingWork``, with ``check``) apart from "failed" (``OperationFailed``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import psycopg

from ..engine import connections as db
from ..engine import host_ledger
from ..engine.defaults import DEFAULT_LOCK_RETRIES, DEFAULT_LOCK_WAIT
from ..engine.executor import RunOptions, ShardPlan
from ..engine.fanout import (
    ApplyOutcome,
    CtrlC,
    FleetReport,
    HostResult,
    ProgressFactory,
    apply_plans,
    fan_out,
    host_jobs,
    raise_unreachable,
    select_hosts,
    stop_on_ctrl_c,
)
from ..engine.ledger import (
    Drift,
    Integrity,
    check_integrity,
    find_drift,
    log_event,
    refresh_cache,
    repair,
)
from ..errors import BadInput, FleetIncomplete, OperationFailed, PendingWork, first_few
from ..model.ranges import format_shards, parse_shards
from ..model.topology import Host, Topology
from ..sql import session
from ..sql.catalog.control import ShardRow, control_exists, ledger_versions, open_moves, shard_list
from ..sql.host_migrations import HostLevelMigration, host_for_topology
from ..sql.migrations import Migration, for_topology, steps_for
from .health import FleetHealth, HostHealth, assess, from_results, read_host

__all__ = [
    "HostMigration",
    "MigrateResult",
    "find_drift",
    "host_versions",
    "migrate",
    "parse_shard_filter",
]


@dataclass
class HostMigration(ApplyOutcome):
    """What migrate found and did on one host."""

    pending: dict[int, int] = field(default_factory=dict)  # version → shards still to apply it
    versions: dict[int, int] = field(default_factory=dict)  # version → shards at it
    missing: list[int] = field(default_factory=list)  # shards in scope with no record (run init)
    drift: list[Drift] = field(default_factory=list)
    # version missing below the highest → shards
    gaps: dict[int, list[int]] = field(default_factory=dict)
    # applied version with no file → shards
    orphans: dict[int, list[int]] = field(default_factory=dict)
    # one line per group of shards left pending by a move
    held: list[str] = field(default_factory=list)
    held_shards: list[int] = field(default_factory=list)
    repaired: int = 0
    dry_run_sql: dict[str, str] = field(default_factory=dict)
    integrity: dict[str, int] = field(default_factory=dict)
    host_level: host_ledger.HostLevelState = field(default_factory=host_ledger.HostLevelState)
    host_repaired: int = 0
    health: HostHealth | None = field(default=None, repr=False)  # the host as ops.health read it

    @property
    def changed(self) -> bool:
        """Anything written: shards, host-level migrations, or checksums ``--repair`` recorded."""
        return super().changed or bool(self.repaired or self.host_repaired)

    def ledger_problems(self, files: dict[int, str] | None = None) -> list[str]:
        """Shards not created, applied files that changed, and versions missing from a shard's ledger:
        one line each (the caller names the host), naming the file (``files``: version → file name)."""
        lines = (
            [f"shards {format_shards(self.missing)} not created (run shardctl init)"]
            if self.missing
            else []
        )
        lines += [
            f"{dr.file} changed after it was applied (shards {format_shards(dr.shards)})"
            for dr in self.drift
        ]
        lines += [
            f"{file_of(files, v)} missing from the ledger of shards {format_shards(s)}"
            for v, s in self.gaps.items()
        ]
        return lines + self.host_level.problems()

    def detail(self) -> dict:
        """The per-host document of ``--json``'s ``details``."""
        return {
            "pending": self.pending,
            "versions": self.versions,
            "missing": format_shards(self.missing),
            "drift": [
                {"version": d.version, "file": d.file, "shards": format_shards(d.shards)}
                for d in self.drift
            ],
            "gaps": {v: format_shards(s) for v, s in self.gaps.items()},
            "orphans": {v: format_shards(s) for v, s in self.orphans.items()},
            "held": self.held,
            "repaired": self.repaired,
            "dry_run_sql": self.dry_run_sql,
            "integrity": self.integrity,
            "host_level": {
                "pending": self.host_level.pending,
                "drift": self.host_level.drift,
                "orphans": self.host_level.orphans,
                "applied": self.host_applied,
                "repaired": self.host_repaired,
            },
        }


def file_of(files: dict[int, str] | None, version: int | None) -> str:
    """A version's migration file name (``V3`` when the file is not known: gone, or no mapping)."""
    return (files or {}).get(version) or f"V{version}"


@dataclass
class MigrateResult(FleetReport):
    """The result of ``migrate`` (and ``plan``): one HostResult[HostMigration] per host."""

    target: int = 0
    latest_version: int = 0
    check: bool = False
    dry_run: bool = False
    files: dict[int, str] = field(default_factory=dict)  # version → migration file name
    host_files: dict[int, str] = field(default_factory=dict)  # version → host-level file name
    # with ``check``: the fleet's health (ops.health), what status, plan and verify report too
    health: FleetHealth | None = None

    def host(self, h: HostResult) -> HostMigration:
        return h.value if h.value is not None else HostMigration()

    @property
    def pending_total(self) -> int:
        return sum(sum(self.host(h).pending.values()) for h in self.hosts)

    @property
    def held(self) -> list[str]:
        return [f"{h.host}: {line}" for h in self.hosts for line in self.host(h).held]

    def findings(self) -> list[str]:
        """What keeps the fleet from being at the target: pending versions (with ``check``), shards
        not created, drift, gaps, and shards held by a move."""
        parts = []
        for h in self.hosts:
            d = self.host(h)
            if d.host_level.pending and self.check:
                parts.append(
                    f"{h.host}: host-level " + ", ".join(f"H{v}" for v in d.host_level.pending)
                )
            if d.pending and self.check:
                parts.append(
                    f"{h.host}: "
                    + ", ".join(
                        f"{file_of(self.files, v)} on {n} shards" for v, n in d.pending.items()
                    )
                )
            parts += [f"{h.host}: {line}" for line in d.ledger_problems(self.files)]
            if self.check:
                parts += [f"{h.host}: {line}" for line in d.held]
        return parts

    def to_dict(self) -> dict:
        read_only = self.check or self.dry_run
        return {
            **super().to_dict(),
            "target": self.target,
            "latest_version": self.latest_version,
            "check": self.check,
            "dry_run": self.dry_run,
            "pending_total": self.pending_total if read_only else 0,
            "hosts_with_missing_shards": sum(1 for h in self.hosts if self.host(h).missing),
            "held": self.held,
            "host_level": {
                "latest": len(self.host_files),
                "applied": {
                    h.host: self.host(h).host_applied
                    for h in self.hosts
                    if self.host(h).host_applied
                },
            },
            "details": {h.host: self.host(h).detail() for h in self.hosts},
            **({"health": self.health.to_dict()} if self.health is not None else {}),
        }

    def plan_dict(self) -> dict:
        """The ``plan`` document: per host, shards at each version and what is pending."""
        hosts = []
        for h in self.hosts:
            d = self.host(h).detail()
            hosts.append(
                {
                    "host": h.host,
                    "reachable": h.reachable,
                    "error": h.error,
                    "versions": d["versions"],
                    "pending": d["pending"],
                    "missing": d["missing"],
                    "drift": d["drift"],
                    "gaps": d["gaps"],
                    "orphans": d["orphans"],
                    "held": d["held"],
                    "host_level_pending": d["host_level"]["pending"],
                }
            )
        return {
            "command": "plan",
            "latest_version": self.latest_version,
            "target": self.target,
            "seconds": round(self.seconds, 3),
            "hosts": hosts,
            "pending_total": self.pending_total,
        }

    def raise_for_status(self) -> MigrateResult:
        """Exit 3 for an unreachable host (or one that cannot authenticate); with ``check``, 4
        (FleetIncomplete) for the fleet's health findings (shards missing, failed or lagging behind
        the others: ``ops.health``, as status, plan and verify say); 1 (OperationFailed) for failed
        shards or host errors, or a dry run that the real run would refuse; 1 (PendingWork) when
        ``check`` finds work pending; 4 (FleetIncomplete) when a run finished but shards in scope were
        never created. Every line names the migration file."""
        self.raise_for_interrupt()
        doc = self.to_dict()
        raise_unreachable(self.hosts, doc)
        if self.health is not None:
            self.health.raise_for("migrate", doc)
        if self.failed:
            text = first_few(
                self.failed,
                3,
                lambda f: (
                    f"shard {f['shard']} on {f['host']} at "
                    f"{f.get('file') or file_of(self.files, f['version'])}: {f['error']}"
                ),
            )
            note = (
                f"; {self.not_started} shard(s) not started (stopped after the first failure; re-run to "
                f"continue)"
                if self.not_started
                else ""
            )
            raise OperationFailed(
                f"migrate: {len(self.failed)} shard(s) failed: {text}{note}", report=doc
            )
        super().raise_for_status()
        missing = [
            f"{h.host}: shards {format_shards(self.host(h).missing)}"
            for h in self.hosts
            if self.host(h).missing
        ]
        if missing and not (self.check or self.dry_run):
            raise FleetIncomplete(
                f"migrate: shards missing, so not migrated: {'; '.join(missing)} (never created, "
                f"or their schema was dropped: run shardctl init)",
                report=doc,
            )
        parts = self.findings() if (self.check or self.dry_run) else []
        if parts and self.check:
            raise PendingWork("pending: " + "; ".join(parts))
        if parts and any(
            self.host(h).drift or self.host(h).gaps or self.host(h).host_level.problems()
            for h in self.hosts
        ):
            # The real run would refuse: say so with exit 1, so a CI dry run catches it too.
            raise OperationFailed(
                "dry run: migrate would refuse to run: "
                + "; ".join(p for p in parts if "not created" not in p),
                report=doc,
            )
        return self


def _scope(host: Host, shards: list[int] | None) -> list[int]:
    if shards is None:
        return list(host.shards)
    wanted = set(shards)
    return [n for n in host.shards if n in wanted]


def _target(migrations: list[Migration], target: int | None) -> int:
    latest = len(migrations)
    if target is None:
        return latest
    if target < 0 or target > latest:
        raise BadInput(f"--target {target}: versions run from 1 to {latest}")
    return target


def parse_shard_filter(spec: str | None, topo: Topology) -> list[int] | None:
    if not spec:
        return None
    try:
        return parse_shards(spec, limit=topo.shard_count)
    except ValueError as exc:
        raise BadInput(f"--shards: {exc}") from None


def version_counts(rows: dict[int, ShardRow], scope: list[int] | None = None) -> dict[int, int]:
    """Version → number of shards at that version (shards in ``scope``, default all)."""
    keys = rows.keys() if scope is None else (n for n in scope if n in rows)
    counts = Counter(rows[n].version for n in keys)
    return {v: counts[v] for v in sorted(counts)}


def host_versions(
    host: Host, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
) -> dict[int, int]:
    """Version → shard count on one host (for ``plan`` and library users)."""
    with db.connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="plan") as conn:
        return version_counts(shard_list(conn), list(host.shards))


def _gaps(
    conn: psycopg.Connection, rows: dict[int, ShardRow], scope: list[int]
) -> dict[int, list[int]]:
    """Versions missing below a shard's highest applied version (version → shards). Rare: only
    a hand-edited ledger or a removed-and-renumbered file leaves one, so this queries only then."""
    holed = [n for n in scope if n in rows and rows[n].has_gap]
    if not holed:
        return {}
    out: dict[int, list[int]] = {}
    for shard, versions in ledger_versions(conn, holed).items():
        for v in sorted(set(range(1, max(versions) + 1)) - set(versions)):
            out.setdefault(v, []).append(shard)
    return {v: sorted(s) for v, s in sorted(out.items())}


def held_by_moves(
    conn: psycopg.Connection, rows: dict[int, ShardRow], scope: list[int], goal: int
) -> tuple[list[int], list[str]]:
    """Shards in scope that a move holds (not 'active') and still need migrations, with one line per
    group naming the command that releases them."""
    held = [n for n in scope if n in rows and rows[n].state != "active" and rows[n].version < goal]
    if not held:
        return [], []
    moves = []
    for spec, _source, target, phase in open_moves(conn):
        try:
            moves.append((spec, set(parse_shards(spec)), target, phase))
        except ValueError:
            continue
    lines = []
    for state in sorted({rows[n].state for n in held}):
        shards = [n for n in held if rows[n].state == state]
        move = next((m for m in moves if m[1] & set(shards)), None)
        group = move[0] if move else format_shards(shards)
        if state == "moved_out":
            lines.append(
                f"shards {format_shards(shards)} were moved away: drop the old copies with "
                f"`shardctl move-shard {group} --cleanup`"
            )
        else:
            where = f" to {move[2]}, phase {move[3]}" if move else ""
            to = move[2] if move else "HOST"
            lines.append(
                f"shards {format_shards(shards)} are being moved{where}: finish the move with "
                f"`shardctl move-shard {group} --to {to}` (or roll it back with `shardctl move-shard "
                f"{group} --abort`), then run migrate again"
            )
    return held, lines


def explain_error(error: str, options: RunOptions) -> str:
    """Say in plain words what a statement timeout means for a shard's migration."""
    if "statement timeout" in error.lower() and "not applied" not in error:
        limit = session.duration(options.statement_timeout)
        return (
            f"statement timeout: a statement ran longer than --statement-timeout {limit} "
            f"({error}); the migration was not applied here"
        )
    return error


@dataclass(kw_only=True)
class _Run:
    """One migrate run's settings, shared by the host threads (named at the call: ten of them)."""

    topo: Topology
    migrations: list[Migration]
    goal: int
    shards: list[int] | None
    options: RunOptions
    check: bool
    dry_run: bool
    repair: bool
    progress: ProgressFactory | None
    host_migrations: list[HostLevelMigration] = field(default_factory=list)
    host_goal: int | None = None  # host-level versions to reach (None: all)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def read_only(self) -> bool:
        return self.check or self.dry_run


def _inspect(
    run: _Run, host: Host, conn: psycopg.Connection, out: HostMigration
) -> tuple[list[ShardPlan], dict[int, dict]]:
    """Read the host's versions and ledger, refuse drift and gaps, and plan the pending shards."""
    topo, scope = run.topo, _scope(host, run.shards)
    _inspect_host_level(run, host, conn, out)
    health = out.health = read_host(conn, topo, host)
    # a shard whose schema is gone is missing (ops.health), not pending
    present = {n: r for n, r in health.rows.items() if n in health.present}
    missing = set(health.missing)
    out.missing = [n for n in scope if n in missing]
    out.versions = version_counts(present, scope)
    integrity = check_integrity(conn, topo, run.migrations, scope) if present else Integrity()
    out.integrity = {"rendered": integrity.rendered, "cached_versions": integrity.cached}
    out.drift, out.orphans = integrity.drift, integrity.orphans
    out.gaps = _gaps(conn, present, scope)
    if out.drift and run.repair:
        out.repaired = repair(conn, topo, run.migrations, out.drift)
        out.drift = []
        integrity.clean = {}  # the ledger changed: verify again
    elif out.drift and not run.read_only:
        first = out.drift[0]
        raise OperationFailed(
            f"host {host.name}: migration {first.file} was changed after it was applied "
            f"(shards {format_shards(first.shards)}); restore the file, or accept it with "
            f"`shardctl migrate --repair --yes`"
        )
    if out.gaps and not run.read_only:
        v, where = next(iter(out.gaps.items()))
        raise OperationFailed(
            f"host {host.name}: the ledger has no V{v} for shards {format_shards(where)}, "
            f"though later versions are applied there; shardctl will not apply migrations "
            f"out of order"
        )
    out.held_shards, out.held = held_by_moves(conn, present, scope, run.goal)
    held = set(out.held_shards)
    pending: Counter[int] = Counter()
    plans = []
    for n in scope:
        row = present.get(n)
        if row is None or row.version >= run.goal:
            continue
        pending.update(range(row.version + 1, run.goal + 1))
        # --check only counts; it renders nothing it does not compare
        if not run.check and n not in held:
            plans.append(
                ShardPlan(
                    n,
                    topo.schema_name(n),
                    None,
                    render_steps=functools.partial(
                        steps_for, run.migrations, topo, n, row.version, run.goal
                    ),
                )
            )
    out.pending = {v: pending[v] for v in sorted(pending)}
    out.unchanged = sum(1 for n in scope if n in present and present[n].version >= run.goal)
    if run.dry_run and plans:
        sample = plans[0].materialize()
        out.dry_run_sql = {f"shard {sample.shard}, V{s.version}": s.sql for s in sample.steps}
    return plans, integrity.clean


def _inspect_host_level(
    run: _Run, host: Host, conn: psycopg.Connection, out: HostMigration
) -> None:
    """The host-level ledger against the H files: pending, drift (repaired with ``--repair``), orphans."""
    state = out.host_level = host_ledger.host_state(conn, run.host_migrations, run.host_goal)
    if state.drift and run.repair:
        out.host_repaired = host_ledger.repair(conn, run.host_migrations, state)
    elif state.drift and not run.read_only:
        raise OperationFailed(
            f"host {host.name}: host-level migration {state.drift[0]} was changed after it was "
            f"applied; restore the file, or accept it with `shardctl migrate --repair --yes`"
        )


def _apply(run: _Run, host: Host, conn: psycopg.Connection, out: HostMigration) -> None:
    """Apply the host's pending shards under its lock (``conn``), log the event, refresh the cache."""
    if not control_exists(conn):
        raise OperationFailed(
            f"host {host.name} has no shardctl control schema; run `shardctl init`"
        )
    plans, verified = _inspect(run, host, conn, out)
    if out.host_level.pending:  # before any shard: shard migrations may use what they create
        out.host_applied = host_ledger.apply(
            conn, run.topo, host, run.host_migrations, goal=run.host_goal
        )
        out.host_level.pending = []
    chosen = host_jobs(host, conn, run.options.jobs) if plans else None
    out.jobs_rule = chosen.rule if chosen else ""
    apply_plans(
        host, plans, run.options, run.stop, out, run.progress, jobs=chosen.count if chosen else 1
    )
    files = {m.version: m.name for m in run.migrations}
    failed_at: dict[int, list[int]] = {}
    for f in out.failed:
        f["error"] = explain_error(f["error"], run.options)
        f["file"] = file_of(files, f["version"])
        failed_at.setdefault(f["version"], []).append(f["shard"])
    if out.migrated or out.failed or out.repaired or out.host_repaired or out.host_applied:
        log_event(
            conn,
            "migrate",
            sorted(out.migrated),
            {
                "target": run.goal,
                "migrated": len(out.migrated),
                "failed": len(out.failed),
                # status reads this: a shard still below the version it failed at is reported as failed.
                "failed_versions": {
                    str(v): format_shards(s) for v, s in failed_at.items() if v is not None
                },
                "not_started": len(out.not_started),
                "repaired": out.repaired,
                "host_applied": out.host_applied,
                "retried": out.retried,
                "held": format_shards(out.held_shards),
            },
        )
    refresh_cache(conn, run.topo, run.migrations, verified)


def _render_one(run: _Run, hosts: list[Host]) -> list[tuple[str, str]]:
    """Render (and parse) every migration up to the goal for the first shard in scope: BadInput for a
    template that does not render or SQL PostgreSQL would refuse. Returns (file name, SQL) of each
    (host-level files first, rendered for the first host)."""
    out = [
        (m.name, m.sql(run.topo, hosts[0].name))
        for m in run.host_migrations
        if hosts and (run.host_goal is None or m.version <= run.host_goal)
    ]
    for host in hosts:
        scope = _scope(host, run.shards)
        if scope:
            names = {m.version: m.name for m in run.migrations}
            return out + [
                (names[s.version], s.sql)
                for s in steps_for(run.migrations, run.topo, scope[0], 0, run.goal)
            ]
    return out


def _run_options(
    options: RunOptions | None, *, repair: bool, check: bool, dry_run: bool
) -> RunOptions:
    """A copy of the caller's options with migrate's defaults; refuses modes that do not combine."""
    if repair and (check or dry_run):
        raise BadInput("--repair cannot be combined with --check or --dry-run")
    if check and dry_run:
        raise BadInput("--check and --dry-run are two different reports; choose one")
    options = replace(options or RunOptions())  # a copy: the caller's options are not changed
    options.purpose = options.purpose or "migrate"
    # never queue behind application traffic for long (0 disables it)
    if options.lock_timeout is None:
        options.lock_timeout = DEFAULT_LOCK_WAIT
    if options.lock_retries is None:
        options.lock_retries = DEFAULT_LOCK_RETRIES
    return options


def migrate(
    topo: Topology,
    *,
    target: int | None = None,
    hosts: list[str] | None = None,
    shards: list[int] | None = None,
    dry_run: bool = False,
    check: bool = False,
    repair: bool = False,
    options: RunOptions | None = None,
    progress: ProgressFactory | None = None,
    host_target: int | None = None,
) -> MigrateResult:
    """Apply (or with ``check``/``dry_run`` only report) pending migrations.

    Host-level migrations (``H`` files, up to ``host_target``; default all) run first on each host.
    Shards a move holds are left pending (``HostMigration.held`` says which command releases
    them). Call ``raise_for_status()`` on the result for the CLI's exit-code policy.
    """
    options = _run_options(options, repair=repair, check=check, dry_run=dry_run)
    migrations = for_topology(topo)  # a gap, a duplicate or a badly named file fails here
    run = _Run(
        topo=topo,
        migrations=migrations,
        goal=_target(migrations, target),
        shards=shards,
        options=options,
        check=check,
        dry_run=dry_run,
        repair=repair,
        progress=progress,
        host_migrations=host_for_topology(topo),
        host_goal=host_target,
    )
    selected = select_hosts(topo, hosts)
    rendered = []
    if not check:  # a template that does not render fails here, before any connection
        rendered = _render_one(run, selected)
    started = time.perf_counter()

    def inspect_only(host: Host, result: HostResult[HostMigration]) -> None:
        with db.connect(
            host,
            autocommit=True,
            connect_timeout=options.connect_timeout,
            purpose="migrate --check" if check else "migrate --dry-run",
        ) as conn:
            _inspect(run, host, conn, result.value)

    def apply(host: Host, result: HostResult[HostMigration]) -> None:
        with locks.use(host) as conn:
            _apply(run, host, conn, result.value)

    ctrl_c = CtrlC()  # a read-only run is not stopped at a shard boundary: it changes nothing
    if run.read_only:
        reports = fan_out(selected, inspect_only, lambda h: HostMigration())
        if check and any(h.value.pending for h in reports if h.value is not None):
            # Only now: with nothing pending, --check renders nothing the ledger's cache vouches for (and
            # does not even load the SQL parser: start-up, bench/startup.py).
            _render_one(run, selected)
    else:
        from .verify import check_applied  # the reference's code: only a run that changes shards

        with (
            stop_on_ctrl_c(run.stop) as ctrl_c,
            db.FleetLocks(
                selected,
                wait=options.wait,
                connect_timeout=options.connect_timeout,
                purpose=options.purpose,
            ) as locks,
        ):
            locks.refuse_untranslatable(rendered)
            reports = fan_out(selected, apply, lambda h: HostMigration())
            # what was migrated is what the migrations define, or migrate fails naming the shards
            check_applied(topo, reports, locks, connect_timeout=options.connect_timeout)
    files = {m.version: m.name for m in migrations}
    return MigrateResult(
        "migrate",
        reports,
        time.perf_counter() - started,
        interrupted=ctrl_c.pressed,
        target=run.goal,
        latest_version=len(migrations),
        check=check,
        dry_run=dry_run,
        files=files,
        host_files={m.version: m.name for m in run.host_migrations},
        health=assess(topo, from_results(reports), files, shards) if check else None,
    )
