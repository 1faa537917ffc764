"""``migrate``: apply pending versioned migrations to every shard on every host (SPEC 5).

Per host, under the host's advisory lock:

1. one query reads every shard with its highest applied version (and how many
   versions it has, to spot holes): that alone answers "is anything pending?";
2. the integrity check compares the ledger's checksums with the rendered files.
   Rendering every applied migration for every shard costs ~15 µs a time, which
   adds up (4096 shards × 100 versions ≈ 6 s), so each host keeps in
   ``shardctl.meta`` the versions it has already verified, keyed by the file's
   source hash, the topology's rendering context and a digest of that version's
   ledger rows. A version whose three keys still match is known good without
   rendering; any change to the file, the topology or the ledger re-renders it;
3. pending shards are applied by the batch engine (``apply.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from .. import __version__
from ..engine import connections as db
from ..engine.executor import RunOptions, ShardPlan
from ..errors import BadInput, OperationFailed
from ..engine.fanout import (FleetReport, HostReport, ProgressFactory, apply_plans, control_exists, for_each_host,
                    log_event, run_on_host, select_hosts)
from ..sql.migrations import Migration, for_topology
from .provision import steps_for
from ..model.ranges import format_shards, parse_shards
from ..sql.render import layout_context, shard_context
from ..model.topology import Host, Topology

DEFAULT_LOCK_TIMEOUT = "5s"
CACHE_KEY = "migrate.verified"


@dataclass
class Drift:
    """An applied migration whose rendered SQL no longer matches the ledger."""

    version: int
    file: str
    shards: list[int] = field(default_factory=list)


@dataclass
class ShardVersion:
    shard: int
    state: str
    version: int  # highest applied version (0: none)
    applied: int  # how many versions the ledger holds for the shard

    @property
    def has_gap(self) -> bool:
        return self.applied != self.version


@dataclass
class Integrity:
    """Result of comparing a host's ledger with the migration files."""

    drift: list[Drift] = field(default_factory=list)
    orphans: dict[int, list[int]] = field(default_factory=dict)  # applied version with no file → shards
    clean: dict[int, dict] = field(default_factory=dict)  # version → cache entry, every row on the host verified
    rendered: int = 0  # renders this check needed
    cached: int = 0  # versions known good from the cache


def _scope(topo: Topology, host: Host, shards: list[int] | None) -> list[int]:
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


# ---- one query per host: versions --------------------------------------------------------

def shard_versions(conn: psycopg.Connection) -> dict[int, ShardVersion]:
    """Every shard recorded on the host with its highest applied version: one query."""
    rows = conn.execute(
        """SELECT s.shard_id, s.state, coalesce(max(m.version), 0), count(m.version)
             FROM shardctl.shards s LEFT JOIN shardctl.migrations m USING (shard_id)
            GROUP BY 1, 2""").fetchall()
    return {r[0]: ShardVersion(r[0], r[1], r[2], r[3]) for r in rows}


def version_counts(rows: dict[int, ShardVersion], scope: list[int] | None = None) -> dict[int, int]:
    """Version → number of shards at that version (shards in ``scope``, default all)."""
    keys = rows.keys() if scope is None else (n for n in scope if n in rows)
    counts = Counter(rows[n].version for n in keys)
    return {v: counts[v] for v in sorted(counts)}


def host_versions(host: Host, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT) -> dict[int, int]:
    """Version → shard count on one host (for ``plan`` and library users)."""
    with db.connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="plan") as conn:
        if not control_exists(conn):
            return {}
        return version_counts(shard_versions(conn), list(host.shards))


def _gaps(conn: psycopg.Connection, rows: dict[int, ShardVersion], scope: list[int]) -> dict[int, list[int]]:
    """Versions missing below a shard's highest applied version (version → shards). Rare: only
    a hand-edited ledger or a removed-and-renumbered file leaves one, so this queries only then."""
    holed = [n for n in scope if n in rows and rows[n].has_gap]
    if not holed:
        return {}
    out: dict[int, list[int]] = {}
    for shard, versions in conn.execute(
            "SELECT shard_id, array_agg(version) FROM shardctl.migrations WHERE shard_id = ANY(%s) GROUP BY 1",
            (holed,)).fetchall():
        for v in sorted(set(range(1, max(versions) + 1)) - set(versions)):
            out.setdefault(v, []).append(shard)
    return {v: sorted(s) for v, s in sorted(out.items())}


# ---- integrity: checksums of applied migrations ----------------------------------------------

@functools.cache
def _renderer_digest() -> str:
    """The code that turns a migration file into SQL: any change to it re-verifies every version."""
    from ..model import identifiers
    from ..sql import migrations, render

    digest = hashlib.sha256(__version__.encode())
    for module in (identifiers, migrations, render):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def context_digest(topo: Topology) -> str:
    """What, besides the file, a migration's rendering depends on."""
    doc = {"renderer": _renderer_digest(), "schema": topo.schema_format, "count": topo.shard_count,
           "function": topo.function, "layout": layout_context(topo.layout),
           "first": shard_context(topo, 0), "last": shard_context(topo, max(0, topo.shard_count - 1))}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def source_digest(m: Migration) -> str:
    return hashlib.sha256(m.source.encode()).hexdigest()


def ledger_digests(conn: psycopg.Connection) -> dict[int, str]:
    """Per version, a digest of its ledger rows (shard, checksum): one query, no sort."""
    rows = conn.execute(
        """SELECT version, count(*),
                  sum(('x' || substr(md5(shard_id::text || ':' || checksum), 1, 15))::bit(60)::bigint::numeric)
             FROM shardctl.migrations GROUP BY version""").fetchall()
    return {v: f"{n}:{total}" for v, n, total in rows}


def _meta_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl.meta') IS NOT NULL").fetchone()[0]


def read_cache(conn: psycopg.Connection) -> dict:
    if not _meta_exists(conn):
        return {}
    row = conn.execute("SELECT value FROM shardctl.meta WHERE key = %s", (CACHE_KEY,)).fetchone()
    return row[0] if row and isinstance(row[0], dict) else {}


def write_cache(conn: psycopg.Connection, topo: Topology, clean: dict[int, dict]) -> None:
    if not _meta_exists(conn):
        return
    value = {"context": context_digest(topo), "versions": {str(v): e for v, e in sorted(clean.items())}}
    with conn.transaction():
        conn.execute("INSERT INTO shardctl.meta (key, value) VALUES (%s, %s::jsonb) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (CACHE_KEY, json.dumps(value)))


def check_integrity(conn: psycopg.Connection, topo: Topology, migrations: list[Migration],
                    shards: list[int] | None, *, use_cache: bool = True,
                    verified: dict[int, dict] | None = None) -> Integrity:
    """Applied migrations whose checksum changed (drift) and applied versions with no file (orphans).

    ``shards``: report only these (None: every shard on the host). Versions whose every ledger row on
    the host matches come back in ``clean`` (for the cache); versions the cache vouches for are not
    rendered again, nor are those in ``verified`` (a ``clean`` of this run) whose rows are unchanged.
    """
    result = Integrity()
    by_version = {m.version: m for m in migrations}
    digests = ledger_digests(conn)
    cache = read_cache(conn) if use_cache else {}
    known = cache.get("versions", {}) if cache.get("context") == context_digest(topo) else {}
    to_read: list[int] = []
    for v, digest in digests.items():
        m = by_version.get(v)
        entry = {"source": source_digest(m), "ledger": digest} if m else None
        if entry is not None and (known.get(str(v)) == entry or (verified or {}).get(v) == entry):
            result.clean[v] = entry
            result.cached += 1
        else:
            to_read.append(v)
    if not to_read:
        return result
    wanted = None if shards is None else set(shards)
    bad: set[int] = set()
    drift: dict[int, Drift] = {}
    rows = conn.execute("SELECT shard_id, version, checksum FROM shardctl.migrations WHERE version = ANY(%s) "
                        "ORDER BY shard_id", (to_read,)).fetchall()
    context_of, context = -1, None  # one context per shard, shared by its versions
    for shard, version, stored in rows:
        m = by_version.get(version)
        in_scope = wanted is None or shard in wanted
        if m is None:
            if in_scope:
                result.orphans.setdefault(version, []).append(shard)
            continue
        if not 0 <= shard < topo.shard_count:
            bad.add(version)  # a shard this topology cannot render: never vouch for the version
            continue
        result.rendered += 1
        if shard != context_of:
            context_of, context = shard, shard_context(topo, shard)
        if not m.matches(topo, shard, stored, context):
            bad.add(version)
            if in_scope:
                drift.setdefault(version, Drift(version, m.name)).shards.append(shard)
    for v in to_read:
        if v in by_version and v not in bad:
            result.clean[v] = {"source": source_digest(by_version[v]), "ledger": digests[v]}
    for d in drift.values():
        d.shards.sort()
    result.drift = sorted(drift.values(), key=lambda d: d.version)
    result.orphans = {v: sorted(s) for v, s in sorted(result.orphans.items())}
    return result


def find_drift(conn: psycopg.Connection, topo: Topology, migrations: list[Migration],
               shards: list[int]) -> tuple[list[Drift], dict[int, list[int]]]:
    """Applied migrations whose checksum changed, and applied versions with no file (version → shards)."""
    result = check_integrity(conn, topo, migrations, shards)
    return result.drift, result.orphans


def refresh_cache(conn: psycopg.Connection, topo: Topology, migrations: list[Migration],
                  verified: dict[int, dict] | None = None) -> Integrity:
    """Verify every ledger row on the host (re-rendering only what changed) and record the clean versions."""
    cache = read_cache(conn)
    result = check_integrity(conn, topo, migrations, None, verified=verified)
    value = {"context": context_digest(topo), "versions": {str(v): e for v, e in sorted(result.clean.items())}}
    if value != cache:
        write_cache(conn, topo, result.clean)
    return result


def moves_in_flight(conn: psycopg.Connection) -> list[int]:
    rows = conn.execute("SELECT shard_id FROM shardctl.shards WHERE state <> 'active' ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def explain_error(error: str, options: RunOptions) -> str:
    """Say in plain words what a timeout means for a shard's migration."""
    low = error.lower()
    if "lock timeout" in low:
        return (f"lock timeout: waited {options.lock_timeout or 'the lock timeout'} for a lock another "
                f"transaction holds on this shard's tables ({error}); the migration was not applied here. "
                f"Re-run when that transaction is gone, or raise --lock-timeout")
    if "statement timeout" in low:
        return (f"statement timeout: a statement ran longer than --statement-timeout {options.statement_timeout} "
                f"({error}); the migration was not applied here")
    return error


def migrate(topo: Topology, *, target: int | None = None, hosts: list[str] | None = None,
            shards: list[int] | None = None, dry_run: bool = False, check: bool = False,
            repair: bool = False, options: RunOptions | None = None, wait: float = 0,
            progress: ProgressFactory | None = None) -> FleetReport:
    """Apply (or with ``check``/``dry_run`` only report) pending migrations.

    ``extra["details"][host]`` holds ``pending`` (version → shard count), ``versions`` (version →
    shards at it), ``missing`` shards, ``drift``, ``gaps``, ``orphans``, ``repaired`` rows and, for a
    dry run, ``dry_run_sql``.
    """
    if repair and (check or dry_run):
        raise BadInput("--repair cannot be combined with --check or --dry-run")
    options = options or RunOptions()
    if options.lock_timeout is None:  # never queue behind application traffic by default ("0" disables it)
        options.lock_timeout = DEFAULT_LOCK_TIMEOUT
    options.purpose = options.purpose or "migrate"
    migrations = for_topology(topo)  # a gap, a duplicate or a badly named file fails here
    goal = _target(migrations, target)
    selected = select_hosts(topo, hosts)
    for host in selected:  # a template that does not render fails here, before any connection
        scope = _scope(topo, host, shards)
        if scope:
            steps_for(migrations, topo, scope[0], 0, goal)
            break
    stop = threading.Event()
    started = time.perf_counter()
    details: dict[str, dict] = {}
    read_only = dry_run or check

    def work(host: Host) -> HostReport:
        report = HostReport(host.name)
        detail = details.setdefault(host.name, {"pending": {}, "versions": {}, "missing": "", "drift": [],
                                                "gaps": {}, "orphans": {}, "repaired": 0, "dry_run_sql": {},
                                                "integrity": {}})

        def inspect(conn: psycopg.Connection) -> tuple[list[ShardPlan], dict[int, dict]]:
            scope = _scope(topo, host, shards)
            present = shard_versions(conn) if control_exists(conn) else {}
            missing = [n for n in scope if n not in present]
            detail["missing"] = format_shards(missing)
            detail["versions"] = version_counts(present, scope)
            integrity = check_integrity(conn, topo, migrations, scope) if present else Integrity()
            detail["integrity"] = {"rendered": integrity.rendered, "cached_versions": integrity.cached}
            drift = integrity.drift
            detail["orphans"] = {v: format_shards(s) for v, s in integrity.orphans.items()}
            detail["drift"] = [{"version": d.version, "file": d.file, "shards": format_shards(d.shards)}
                               for d in drift]
            gaps = _gaps(conn, present, scope)
            detail["gaps"] = {v: format_shards(s) for v, s in gaps.items()}
            if drift and repair:
                detail["repaired"] = _repair(conn, topo, migrations, drift)
                detail["drift"] = []
                integrity.clean = {}  # the ledger changed: verify again
            elif drift and not read_only:
                first = drift[0]
                raise OperationFailed(
                    f"host {host.name}: migration {first.file} was changed after it was applied "
                    f"(shards {format_shards(first.shards)}); restore the file, or accept it with "
                    f"`shardctl migrate --repair --yes`")
            if gaps and not read_only:
                v, where = next(iter(gaps.items()))
                raise OperationFailed(
                    f"host {host.name}: the ledger has no V{v} for shards {format_shards(where)}, though later "
                    f"versions are applied there; shardctl will not apply migrations out of order")
            in_flight = [n for n, row in sorted(present.items()) if row.state != "active"]
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
                if not check:  # --check only counts; it renders nothing it does not compare
                    plans.append(ShardPlan(n, topo.schema_name(n), None, render_steps=functools.partial(
                        steps_for, migrations, topo, n, row.version, goal)))
            detail["pending"] = {v: pending[v] for v in sorted(pending)}
            pending_shards = sum(1 for n in scope if n in present and present[n].version < goal)
            report.unchanged = len(scope) - pending_shards - len(missing)
            if dry_run and plans:
                sample = plans[0].materialize()
                detail["dry_run_sql"] = {f"shard {sample.shard}, V{s.version}": s.sql for s in sample.steps}
            return plans, integrity.clean

        def body() -> None:
            if read_only:
                with db.connect(host, autocommit=True, connect_timeout=options.connect_timeout,
                                purpose="migrate --check" if check else "migrate --dry-run") as conn:
                    inspect(conn)
                return
            with locks.use(host) as conn:
                if not control_exists(conn):
                    raise OperationFailed(f"host {host.name} has no shardctl control schema; run `shardctl init`")
                plans, verified = inspect(conn)
                apply_plans(host, plans, options, stop, report, progress)
                for f in report.failed:
                    f["error"] = explain_error(f["error"], options)
                if report.migrated or report.failed or detail["repaired"]:
                    log_event(conn, "migrate", sorted(report.migrated), {
                        "target": goal, "migrated": len(report.migrated), "failed": len(report.failed),
                        "not_started": len(report.not_started), "repaired": detail["repaired"]})
                refresh_cache(conn, topo, migrations, verified)

        return run_on_host(host, report, body)

    if read_only:
        reports = for_each_host(selected, work)
    else:
        with db.FleetLocks(selected, wait=wait, connect_timeout=options.connect_timeout,
                           purpose=options.purpose) as locks:
            reports = for_each_host(selected, work)
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
                    (m.checksum_for(topo, shard), shard, d.version)).rowcount
    log_event(conn, "repair", sorted({s for d in drift for s in d.shards}),
              {"versions": [d.version for d in drift], "files": [d.file for d in drift], "rows": updated})
    return updated
