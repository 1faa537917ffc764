"""``migrate``: apply pending versioned migrations to every shard on every host (SPEC 5)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from . import db
from .apply import RunOptions, ShardPlan
from .errors import BadInput, OperationFailed
from .fleet import (FleetReport, HostReport, ProgressFactory, apply_plans, control_exists, for_each_host,
                    log_event, read_shards, run_on_host, select_hosts)
from .migrations import Migration, checksum, for_topology
from .provision import steps_for
from .ranges import format_shards, parse_shards
from .topology import Host, Topology

DEFAULT_LOCK_TIMEOUT = "5s"


@dataclass
class Drift:
    """An applied migration whose rendered SQL no longer matches the ledger."""

    version: int
    file: str
    shards: list[int] = field(default_factory=list)


def _scope(topo: Topology, host: Host, shards: list[int] | None) -> list[int]:
    return [n for n in host.shards if shards is None or n in shards]


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


def find_drift(conn: psycopg.Connection, topo: Topology, migrations: list[Migration],
               shards: list[int]) -> tuple[list[Drift], dict[int, list[int]]]:
    """Applied migrations whose checksum changed, and applied versions with no file (version → shards)."""
    wanted = set(shards)
    by_version = {m.version: m for m in migrations}
    drift: dict[int, Drift] = {}
    orphans: dict[int, list[int]] = {}
    rows = conn.execute("SELECT shard_id, version, checksum FROM shardctl.migrations").fetchall()
    for shard, version, stored in rows:
        if shard not in wanted:
            continue
        m = by_version.get(version)
        if m is None:
            orphans.setdefault(version, []).append(shard)
            continue
        if checksum(m.render(topo, shard)) != stored:
            drift.setdefault(version, Drift(version, m.name)).shards.append(shard)
    return sorted(drift.values(), key=lambda d: d.version), orphans


def moves_in_flight(conn: psycopg.Connection) -> list[int]:
    rows = conn.execute("SELECT shard_id FROM shardctl.shards WHERE state <> 'active' ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def migrate(topo: Topology, *, target: int | None = None, hosts: list[str] | None = None,
            shards: list[int] | None = None, dry_run: bool = False, check: bool = False,
            repair: bool = False, options: RunOptions | None = None, wait: float = 0,
            progress: ProgressFactory | None = None) -> FleetReport:
    """Apply (or with ``check``/``dry_run`` only report) pending migrations.

    The report's hosts carry ``pending`` (version → shard count) in ``extra``.
    """
    options = options or RunOptions(lock_timeout=DEFAULT_LOCK_TIMEOUT)
    options.purpose = options.purpose or "migrate"
    migrations = for_topology(topo)
    goal = _target(migrations, target)
    stop = threading.Event()
    started = time.perf_counter()
    details: dict[str, dict] = {}
    read_only = dry_run or check

    def work(host: Host) -> HostReport:
        report = HostReport(host.name)
        detail = details.setdefault(host.name, {"pending": {}, "missing": "", "drift": [], "orphans": {},
                                                "repaired": 0, "dry_run_sql": {}})

        def inspect(conn: psycopg.Connection) -> list[ShardPlan]:
            scope = _scope(topo, host, shards)
            present = read_shards(conn) if control_exists(conn) else {}
            missing = [n for n in scope if n not in present]
            detail["missing"] = format_shards(missing)
            drift, orphans = find_drift(conn, topo, migrations, scope) if present else ([], {})
            detail["orphans"] = {v: format_shards(s) for v, s in orphans.items()}
            detail["drift"] = [{"version": d.version, "file": d.file, "shards": format_shards(d.shards)}
                               for d in drift]
            if drift and repair and not read_only:
                detail["repaired"] = _repair(conn, topo, migrations, drift)
                detail["drift"] = []
            elif drift and not read_only:
                first = drift[0]
                raise OperationFailed(
                    f"host {host.name}: migration {first.file} was changed after it was applied "
                    f"(shards {format_shards(first.shards)}); restore the file, or accept it with "
                    f"`shardctl migrate --repair --yes`")
            in_flight = moves_in_flight(conn) if present else []
            if in_flight and not read_only:
                raise OperationFailed(f"host {host.name}: shards {format_shards(in_flight)} are being moved; "
                                      f"migrations wait until the move is finished or aborted")
            pending: Counter[int] = Counter()
            plans = []
            for n in scope:
                row = present.get(n)
                if row is None or row.version >= goal:
                    continue
                for v in range(row.version + 1, goal + 1):
                    pending[v] += 1
                plans.append(ShardPlan(n, topo.schema_name(n), None, steps_for(migrations, topo, n, row.version,
                                                                                goal)))
            detail["pending"] = {v: pending[v] for v in sorted(pending)}
            report.unchanged = len(scope) - len(plans) - len(missing)
            if dry_run and plans:
                sample = plans[0]
                detail["dry_run_sql"] = {f"shard {sample.shard}, V{s.version}": s.sql for s in sample.steps}
            return plans

        def body() -> None:
            if read_only:
                with db.connect(host, autocommit=True, connect_timeout=options.connect_timeout,
                                purpose="migrate --check") as conn:
                    inspect(conn)
                return
            with db.host_lock(host, wait=wait, connect_timeout=options.connect_timeout, purpose="migrate") as conn:
                if not control_exists(conn):
                    raise OperationFailed(f"host {host.name} has no shardctl control schema; run `shardctl init`")
                plans = inspect(conn)
                apply_plans(host, plans, options, stop, report, progress)
                if report.migrated or report.failed or detail["repaired"]:
                    log_event(conn, "migrate", sorted(report.migrated), {
                        "target": goal, "migrated": len(report.migrated), "failed": len(report.failed),
                        "repaired": detail["repaired"]})

        return run_on_host(host, report, body)

    reports = for_each_host(select_hosts(topo, hosts), work)
    pending_total = sum(sum(d["pending"].values()) for d in details.values())
    missing_total = sum(1 for d in details.values() if d["missing"])
    return FleetReport("migrate", reports, time.perf_counter() - started, extra={
        "target": goal, "latest_version": len(migrations), "check": check, "dry_run": dry_run,
        "pending_total": pending_total if read_only else 0,
        "hosts_with_missing_shards": missing_total,
        "details": details,
    })


def _repair(conn: psycopg.Connection, topo: Topology, migrations: list[Migration], drift: list[Drift]) -> int:
    """Record the current checksum of changed migrations. Returns the ledger rows updated."""
    by_version = {m.version: m for m in migrations}
    updated = 0
    with conn.transaction():
        for d in drift:
            m = by_version[d.version]
            for shard in d.shards:
                updated += conn.execute(
                    "UPDATE shardctl.migrations SET checksum = %s WHERE shard_id = %s AND version = %s",
                    (checksum(m.render(topo, shard)), shard, d.version)).rowcount
    log_event(conn, "repair", sorted({s for d in drift for s in d.shards}),
              {"versions": [d.version for d in drift], "rows": updated})
    return updated
