"""``shardctl adopt copy --from DSN --plan FILE``: the online copy of the database being adopted (the
*source*) into the fleet, with PostgreSQL's own logical replication; and ``adopt status``.

Per fleet host H (a host that owns shards, and the global host):

* on the source, each sharded table whose replica identity lacks its key gets ``REPLICA IDENTITY
  FULL`` (a row filter on the key needs the key in the identity for UPDATE and DELETE; without it the
  app's own UPDATEs would fail on the source once the table is published). The old identity is
  recorded first, so abort and cleanup can put it back;
* on H, in the source's schema name (``public``), a parent per sharded table, partitioned by its
  rows' shard as the Router places them (``key % modulus`` for a pre-adoption key, the shard bits of
  a ``next_id()`` one: the fleet's own new rows fit until the cleanup), whose partitions are H's
  shard tables (``ATTACH PARTITION insta7.posts FOR VALUES IN (7)``); the global tables, plainly,
  on the global host;
* on the source, publication ``shardctl_adopt_<H>_<tag>`` (``state.slot_name``: the run's tag, as
  slots are the server's and another adoption may use the same server): each sharded table with
  the row filter of H's shards, the global tables whole for the global host; a logical slot of the
  same name created with an exported snapshot; the rows as of that snapshot copied in binary into
  H's parents (they route each row to its shard), in parallel and paced (``--nice``), in one
  transaction per worker;
* on H, subscription ``shardctl_adopt_<H>_<tag>`` on that slot (``copy_data = false``): every
  change after the snapshot follows, an UPDATE that changes a row's key included (the publisher
  sends a DELETE to the old shard's host and an INSERT to the new one's).

The source holds one slot per fleet host, and the WAL the slowest of them has not confirmed
(``adopt status`` says how much). The run's state is on the source (:mod:`.state`); a re-run keeps
whatever exists and makes only what is missing; a host whose copy was cut short (SIGKILL, an error)
is copied again from scratch: its subscription and slot dropped, its partitions truncated.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, LockBusy, OperationFailed, WaitTimeout, first_few
from ...ids.old_ids import id_floor
from ...model.adoption import SOURCE_HOST, Adoption, IdMap, tables_from_plan
from ...model.documents import Result
from ...model.ranges import format_shards
from ...model.topology import Host, Topology, server_database
from ...model.topology_file import write_adoption
from ...sql import databases
from ...sql.catalog import adopt_copy as catalog
from ...sql.catalog import adopt_cutover as cut_catalog
from ...sql.catalog import adopt_verify as verify_catalog
from ...sql.catalog import inspect, replication
from ...sql.catalog.data import TABLES_PER_TRANSACTION, truncate_groups
from ..health import read_host
from ..move import transfer
from ..move.copy import MAX_COPY_WORKERS, in_new_slot
from ..move.preflight import publisher_problems, subscriber_problems
from ..move.run import Pacer, Progress, checkpoint, peer_conninfo
from .baseline import _compare
from .id_map import ensure_id_map, wait_id_map
from .plan import read_plan, read_plan_snapshot, read_source, source_host
from .state import Phase, Run, copy_tag, load_run, plan_hash, run_tag, slot_name, start_run

MIN_SOURCE_VERSION = 150000  # publication row filters
IDENTITY_ATTEMPTS = 5  # ALTER TABLE … REPLICA IDENTITY FULL tries, 2 s of lock wait each


@dataclass
class HostCopy:
    """One fleet host's part of the copy: its copy (rows, bytes) and its replication's lag, and the
    WAL its slot keeps on the source."""

    host: str
    shards: str
    state: str  # waiting | copying | copied | streaming
    tables: int = 0
    rows: int = 0
    bytes: int = 0
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    retained_bytes: int | None = None  # WAL the slot keeps on the source
    wal_status: str | None = None


@dataclass
class AdoptCopyResult(Result):
    command = "adopt copy"

    source: str
    phase: str
    hosts: list[HostCopy] = field(default_factory=list)
    replica_identity_full: list[str] = field(default_factory=list)  # set FULL for the copy
    # tables with a shard's own types (enums): held in a table of the source's schema name on each
    # host too, whose trigger writes every change into the row's shard (see sql.catalog.adopt_copy)
    routed: list[str] = field(default_factory=list)
    global_tables: list[str] = field(default_factory=list)
    global_host: str | None = None
    id_floor: int | None = None
    notes: list[str] = field(default_factory=list)
    copied_bytes: int = 0
    rested_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True  # a copy that cannot go on raises instead

    def raise_for_status(self) -> AdoptCopyResult:
        return self


@dataclass
class AdoptStatus(Result):
    command = "adopt status"

    source: str
    phase: str  # "none" when no run is recorded
    started_at: str | None = None
    updated_at: str | None = None
    hosts: list[HostCopy] = field(default_factory=list)
    replica_identity_full: list[str] = field(default_factory=list)
    held_bytes: int = 0  # WAL the source keeps for the copy: the largest a slot retains
    id_map_lag_bytes: int | None = None  # the id map's subscription, behind the source
    routed: list[str] = field(default_factory=list)  # see AdoptCopyResult.routed
    id_floor: int | None = None
    # the last adopt verify of this run (adopt_verify.last_run; None: none yet), and whether the
    # cutover takes it: finished, with no problem
    verification: dict[str, Any] | None = None
    verified: bool = False

    @property
    def ok(self) -> bool:
        return True

    def raise_for_status(self) -> AdoptStatus:
        return self


@dataclass
class Target:
    """A fleet host the copy writes to: its shards (owned), its sharded tables, its global tables."""

    host: Host
    shards: list[int]
    globals: list[str]
    tag: str = ""  # the run's (state.slot_name)

    @property
    def name(self) -> str:
        return slot_name(self.host.name, self.tag)


class Copy:
    """One invocation of ``adopt copy``: inputs, connections' settings, progress and the record."""

    def __init__(
        self,
        topo: Topology,
        source: Host,
        doc: dict[str, Any],
        options: dict[str, Any],
        progress: Progress | None,
    ):
        self.topo = topo
        self.source = source
        self.doc = doc
        self.schema: str = doc["schema"]
        self.sharded = [
            (t["name"], t["key"]) for t in doc["tables"] if t["kind"] in ("root", "column")
        ]
        self.globals = [t["name"] for t in doc["tables"] if t["kind"] == "global"]
        self.options = options
        self.progress: Progress = progress or (lambda step, done, total, note: None)
        self.pacers: list[Pacer] = []
        self.run: Run | None = None
        self.tag = ""  # of the replication objects' names (state.copy_tag), set before any is made
        self.routed: dict[str, list[tuple]] | None = None  # see _routed
        self.source_columns: dict[str, set[str]] = {}  # table → its columns on the source
        self.lock = threading.Lock()  # the run's record and result, written by the hosts' threads
        self.active: set[psycopg.Connection] = set()  # the COPYs' connections (cancel)
        self.stop = threading.Event()  # set by cancel
        self.workers = options.get("copy_workers", MAX_COPY_WORKERS)  # per host (_copy_hosts)
        self.result = AdoptCopyResult(source=source.masked_dsn, phase=str(Phase.NEW))
        self.global_host = topo.global_host or topo.hosts[0].name

    # ---- connections ------------------------------------------------------------------------
    def connect(self, host: Host, autocommit: bool = True, purpose: str = "adopt copy"):
        return db.connect(
            host,
            autocommit=autocommit,
            connect_timeout=self.options["connect_timeout"],
            purpose=purpose,
        )

    def pause(self) -> Callable[[], None]:
        """A COPY worker's pause between units (a MB): rests for ``--nice``, and stops the worker
        once the run is cancelled (Ctrl-C)."""
        pacer = Pacer(self.options["nice"], self.stop) if self.options["nice"] > 0 else None
        if pacer is not None:
            self.pacers.append(pacer)

        def pause() -> None:
            if pacer is not None:
                pacer.rest()
            if self.stop.is_set():
                raise OperationFailed("adopt copy: interrupted")

        return pause

    def key_shard(self, key: str) -> Any:
        """The shard of a row by its key column as SQL (``catalog.key_shard``: the Router's rule,
        with this run's ID floor), for the row filters and the partitioned parents."""
        assert self.run is not None
        return catalog.key_shard(
            key, self.topo.modulus, self.topo.layout, self.run.detail["id_floor"]
        )

    def publisher_conninfo(self) -> str:
        """How the fleet hosts' subscriptions reach the source: ``--publisher-dsn``, else ``--from``
        without the client's own files, with the password (``move.run.peer_conninfo``)."""
        return peer_conninfo(self.source, self.options.get("publisher_dsn"))

    def targets(self) -> list[Target]:
        out = []
        for host in self.topo.hosts:
            is_global = host.name == self.global_host and self.globals
            if host.shards or is_global:
                out.append(Target(host, list(host.shards), list(self.globals) if is_global else []))
        return out

    @contextmanager
    def tracked(self, *conns: psycopg.Connection) -> Iterator[None]:
        """The connections of a COPY under way, for :meth:`cancel`."""
        with self.lock:
            self.active.update(conns)
        try:
            yield
        finally:
            with self.lock:
                self.active.difference_update(conns)

    def cancel(self) -> None:
        """Stop every COPY under way (Ctrl-C): each worker stops at its next MB, or at once when
        its server-side statement is cancelled."""
        self.stop.set()
        with self.lock:
            conns = list(self.active)
        for conn in conns:
            conn.cancel_safe(timeout=2)

    def save(self, src: psycopg.Connection, phase: Phase | None = None) -> None:
        """Record the run (hosts copy in parallel threads: one save at a time)."""
        assert self.run is not None
        with self.lock:
            self.run.save(src, phase)
            self.result.phase = str(self.run.phase)


def adopt_copy(
    topo: Topology,
    dsn: str,
    plan_file: Path,
    *,
    nice: float = 0.0,
    copy_workers: int = MAX_COPY_WORKERS,
    sync_timeout: float = 3600.0,
    publisher_dsn: str | None = None,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    allow_inline_password: bool = False,
    progress: Progress | None = None,
) -> AdoptCopyResult:
    """Copy the database at ``dsn`` into ``topo``'s fleet as the plan file describes, online, and
    leave logical replication streaming every later change to the shards; returns once every host's
    subscription has caught up with the source (phase ``synced``). Re-running resumes."""
    started = time.perf_counter()
    doc = read_plan(Path(plan_file))
    options = {
        "nice": nice,
        "copy_workers": max(1, min(MAX_COPY_WORKERS, copy_workers)),
        "sync_timeout": sync_timeout,
        "publisher_dsn": publisher_dsn,
        "connect_timeout": connect_timeout,
        "allow_inline_password": allow_inline_password,
    }
    job = Copy(topo, source_host(dsn), doc, options, progress)
    _check_plan(job, Path(plan_file))
    targets = job.targets()
    _check_fleet(job, targets)
    with job.connect(job.source, purpose="adopt copy lock") as lock:
        if not catalog.try_run_lock(lock):
            raise LockBusy("another shardctl adopt copy is running on this database")
        with job.connect(job.source) as src:
            job.tag = copy_tag(load_run(src))
            for target in targets:
                target.tag = job.tag
            _check_source(job, src, targets)
            _begin(job, src, targets)
            if job.run.phase in (Phase.CUT_OVER, Phase.CLEANED):
                job.result.notes.append(f"adopt copy: nothing to do (phase {job.run.phase})")
            else:
                _copy_all(job, src, targets)
            job.result.hosts = host_figures(job.run, src, targets)
            job.result.routed = list(job.run.detail.get("routed") or [])
    job.result.rested_seconds = round(sum(p.rested for p in job.pacers), 3)
    job.result.seconds = round(time.perf_counter() - started, 3)
    return job.result


def _copy_all(job: Copy, src: psycopg.Connection, targets: list[Target]) -> None:
    if job.run.phase == Phase.NEW:
        job.save(src, Phase.COPYING)
    _write_adoption(job)
    _replica_identity(job, src)
    checkpoint("adopt-after-identity")
    for target in targets:
        _prepare_host(job, target)
        _publication(job, src, target)
    _ensure_id_map(job)  # its own initial copy runs on the servers meanwhile
    _copy_hosts(job, targets)
    _wait_caught_up(job, src, targets)
    if job.run.phase == Phase.COPYING:
        job.save(src, Phase.SYNCED)
    checkpoint("adopt-after-sync")


# A routed table's part (one COPY out of the source, then its shards' routing, one transaction)
# locks ~8 relations a shard (its partition and shard table, their indexes and TOAST): at most this
# many shards a part keeps it within data.TABLES_PER_TRANSACTION's reason; more parts read the
# source table once more each.
ROUTED_SHARDS_PER_PART = 128

# The share of a host's lock table the abort's freeze may need: the rest is for the app's sessions
# and the replication workers (PostgreSQL's table can grow somewhat past its nominal size).
LOCK_TABLE_SHARE = 0.8
# A routed table's partitions are made in one transaction, each with its primary key, TOAST table
# and TOAST index (catalog.create_routed_table): this many locks a shard.
ROUTED_PARTITION_LOCKS = 4

# ---- checks (nothing changed before they pass) --------------------------------------------------


def _check_plan(job: Copy, path: Path) -> None:
    """The plan must describe the database at ``--from`` now, without blockers, for this fleet."""
    if not job.topo.layout.has_time:
        raise BadInput(
            f"the topology's ID layout {job.topo.layout.name} has no time field: new IDs could not "
            f"sort after the old ones (adopt needs an ID floor)"
        )
    if job.doc.get("shard_count") not in (None, job.topo.shard_count):
        raise BadInput(
            f"--plan {path} was made for {job.doc['shard_count']} shards; the topology has "
            f"{job.topo.shard_count}: run adopt plan again"
        )
    conn = read_source(job.source, job.options["connect_timeout"], "adopt copy")
    try:
        try:
            fresh, tables = read_plan_snapshot(
                conn, job.topo, job.source, job.schema, job.doc["root"]
            )
        except BadInput as exc:
            raise BadInput(
                f"--plan {path} is not a plan of this database ({exc}): run adopt plan again"
            ) from None
        conn.rollback()
    finally:
        conn.close()
    _compare(job.doc, fresh, path)
    job.source_columns = {name: {c.name for c in t.columns} for name, t in tables.items()}
    if fresh.blockers:
        raise OperationFailed(
            f"adopt copy: the plan has {len(fresh.blockers)} blocker(s): "
            f"{first_few(fresh.blockers, 1, lambda b: b.message)}; fix them and plan again"
        )


def _check_fleet(job: Copy, targets: list[Target]) -> None:
    """Every shard created (``init``) with the baseline's tables; BadInput naming the first gap."""
    tables = [t for t, _ in job.sharded]
    for target in targets:
        with job.connect(target.host) as conn:
            health = read_host(conn, job.topo, target.host)
            if health.missing:
                raise BadInput(
                    f"host {target.host.name}: shards {format_shards(health.missing)} are not "
                    f"created: run shardctl init (with the baseline) first"
                )
            schemas = [job.topo.schema_name(n) for n in target.shards]
            have = set(inspect.tables(conn, schemas, "r"))
            # an aborted run's shard tables are out of their names until the restart puts them back
            name = {
                (s, t): t if (s, t) in have else cut_catalog.aborted_name(t)
                for s in schemas
                for t in tables
            }
            for schema in schemas:
                lacking = [t for t in tables if (schema, name[schema, t]) not in have]
                if lacking:
                    raise BadInput(
                        f"host {target.host.name}: shard schema {schema} has no table "
                        f"{', '.join(lacking[:3])}: the fleet is not at the baseline (run shardctl "
                        f"init with the baseline adopt baseline wrote)"
                    )
            for table in tables if schemas else []:
                now = name[schemas[0], table]
                extra = set(catalog.columns(conn, schemas[0], now)) - job.source_columns[table]
                if extra:
                    raise BadInput(
                        f"host {target.host.name}: {schemas[0]}.{table} has column "
                        f"{min(extra)}, which the old database has not: the fleet is past "
                        f"the baseline; adopt before migrating further"
                    )
            first = [(schemas[0], name[schemas[0], t]) for t in tables] if schemas else []
            now = {t: name[schemas[0], t] for t in tables} if schemas else {}
            _check_lock_table(
                job,
                target,
                inspect.server_facts(conn),
                catalog.lock_footprints(conn, first),
                bool(_routed(job, conn, target, now)),
            )


def _check_lock_table(
    job: Copy, target: Target, facts: dict, footprints: list[int], routed: bool
) -> None:
    """BadInput unless ``target``'s lock table, with room to spare for the app's locks, can hold the
    adoption's largest transactions there: ``--abort``'s freeze, which locks every adopted table of
    the host at once (it must be possible once the fleet takes writes, when a restart to raise the
    setting is no longer free), the copy's COPY of one table into its parent, which locks each
    partition it fills with its indexes and TOAST (``footprints``: one shard's tables'), and, when a
    table is ``routed`` (by its shard's own types), the making of its partitions."""
    shards = len(target.shards)
    sharded = len(job.sharded) if shards else 0
    abort = sharded * shards + sharded + 2 * len(target.globals)  # + parents, global mirrors
    copy = shards * max(footprints, default=0) + 1
    make = shards * ROUTED_PARTITION_LOCKS + 1 if routed else 0
    per, processes = facts["max_locks_per_transaction"], facts["lock_processes"]
    need = max(abort, copy, make)
    if need > LOCK_TABLE_SHARE * per * processes:
        least = math.ceil(need / LOCK_TABLE_SHARE / processes)
        if need == abort:
            what = f"adopt cutover --abort locks its {abort:,} adopted tables in one transaction"
        elif need == copy:
            what = (
                f"adopt copy fills the {shards:,} shard tables of a table in one COPY, with their "
                f"indexes: {copy:,} locks"
            )
        else:
            what = (
                f"adopt copy makes the {shards:,} partitions of a table routed by its shard's own "
                f"types in one transaction, with their indexes: {make:,} locks"
            )
        raise BadInput(
            f"host {target.host.name}: {what}, and its lock table holds about {per * processes:,} "
            f"locks (max_locks_per_transaction {per} x {processes} server processes): set "
            f"max_locks_per_transaction to at least {least} there (ALTER SYSTEM, then a restart); "
            f"nothing was changed"
        )


def _check_source(job: Copy, src: psycopg.Connection, targets: list[Target]) -> None:
    facts = inspect.server_facts(src)
    if facts["version_num"] < MIN_SOURCE_VERSION:
        raise BadInput(
            f"the source runs PostgreSQL {facts['version_num']}: adopt copy needs 15 or later "
            f"(publication row filters)"
        )
    if facts["wal_level"] != "logical":
        raise BadInput(
            f"the source has wal_level={facts['wal_level']}: adopt copy needs wal_level=logical "
            f"(ALTER SYSTEM SET wal_level = logical, then a restart)"
        )
    names = [t.name for t in targets] + [slot_name("ids", job.tag)]
    needed = sum(1 for name in names if not replication.slot_exists(src, name))
    free = facts["max_replication_slots"] - facts["slots_used"]
    if needed > free:
        raise BadInput(
            f"the source has {free} free replication slots (max_replication_slots="
            f"{facts['max_replication_slots']}); adopt copy needs {needed}: one per fleet host and "
            f"one for the id map"
        )
    senders = facts["max_wal_senders"] - facts["senders_used"]
    if needed > senders:
        raise BadInput(
            f"the source has {senders} free WAL senders (max_wal_senders={facts['max_wal_senders']}); "
            f"adopt copy needs {needed}: one per fleet host and one for the id map"
        )
    problems = _role_problems(job, src, facts, targets)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BadInput(f"adopt copy: {problems[0]}{more}")


def _role_problems(job: Copy, src: psycopg.Connection, facts: dict, targets: list[Target]):
    """What a role that is not superuser lacks (docs/adopting.md, on a managed service): on the
    source, to publish, to own the app's tables, and to subscribe (the cutover's way back); on
    each fleet host and the id map's, to subscribe."""
    role = inspect.role_facts(src, [job.schema])
    out = publisher_problems(SOURCE_HOST, role)
    out += subscriber_problems(SOURCE_HOST, role, facts["version_num"])
    if not role["superuser"] and role["tables_not_owned"]:
        out.append(
            f"host {SOURCE_HOST}: role {role['name']} does not own {role['tables_not_owned']} of "
            f"the tables in {job.schema} (their replica identity, publications and the cutover's "
            f"renaming need ownership)"
        )
    cycle = _a_cycle(_copied_references(job, src))
    copying = {t.host.name for t in targets if _tables(job, t)}
    place = job.topo.id_map_place()
    hosts = {t.host.name: t.host for t in targets}
    hosts.setdefault(place.host, job.topo.host(place.host))
    for host in hosts.values():
        with job.connect(host) as conn:
            version = inspect.server_facts(conn)["version_num"]
            host_role = inspect.role_facts(conn, [])
            out += subscriber_problems(host.name, host_role, version)
            may_create = host_role["superuser"] or host_role["createdb"]
            if (
                host.name == place.host
                and not may_create
                and not databases.database_exists(conn, place.dbname)
            ):
                out.append(
                    f"host {host.name}: role {host_role['name']} lacks CREATEDB to create the id "
                    f"map's database {place.dbname} (ALTER ROLE {host_role['name']} CREATEDB, or "
                    f"create it owned by {host_role['name']})"
                )
            if cycle and host.name in copying and not catalog.may_skip_triggers(conn):
                out.append(_cycle_problem(host.name, host_role["name"], cycle))
        if not host_role["superuser"] and not _has_password(job.publisher_conninfo()):
            out.append(_no_password(host.name, SOURCE_HOST))
        if not role["superuser"] and not _has_password(peer_conninfo(host)):
            out.append(_no_password(SOURCE_HOST, host.name))
    return out


def _copied_references(job: Copy, src: psycopg.Connection) -> list[tuple[str, str]]:
    """(table, the table it references) for each foreign key between two tables the copy copies."""
    copied = {t for t, _ in job.sharded} | set(job.globals)
    return [(t, f) for t, f in catalog.references(src, [job.schema]) if {t, f} <= copied]


def _cycle_problem(host: str, role: str, cycle: list[str]) -> str:
    """Tables whose foreign keys go round in a cycle cannot be copied one after the other with their
    foreign keys checked, which a role that may not skip them needs (``_run_copy``'s ``serial``)."""
    return (
        f"host {host}: tables {', '.join(cycle)} reference each other in a cycle, and role {role} "
        f"may not skip their foreign keys during the copy (GRANT SET ON PARAMETER "
        f"session_replication_role TO {role})"
    )


def _a_cycle(refs: list[tuple[str, str]]) -> list[str]:
    """The tables of one cycle of ``refs`` ((table, the table it references)), sorted; [] if none."""
    up: dict[str, set[str]] = {}
    for table, referenced in refs:
        up.setdefault(table, set()).add(referenced)
    done: set[str] = set()

    def walk(table: str, path: list[str]) -> list[str]:
        if table in path:
            return sorted(path[path.index(table) :])
        if table in done:
            return []
        for referenced in sorted(up.get(table, ())):
            found = walk(referenced, [*path, table])
            if found:
                return found
        done.add(table)
        return []

    for table in sorted(up):
        found = walk(table, [])
        if found:
            return found
    return []


def _has_password(conninfo: str) -> bool:
    return bool(pg_conninfo.conninfo_to_dict(conninfo).get("password"))


def _no_password(on: str, to: str) -> str:
    """A subscription owned by a role that is not superuser must carry a password."""
    return (
        f"host {on}: its subscription to {to} would carry no password, which a role that is "
        f"not superuser must give (PGPASSWORD or password_env: one in ~/.pgpass stays with shardctl)"
    )


def _begin(job: Copy, src: psycopg.Connection, targets: list[Target]) -> None:
    digest = plan_hash(job.doc)
    run = load_run(src)
    if run is not None and run.plan_hash != digest and run.phase != Phase.CLEANED:
        raise BadInput(
            f"the source records an adoption of another plan (phase {run.phase}): abort and clean "
            f"it up first, or give its plan file"
        )
    if run is not None and run.phase == Phase.ABORTED:
        run = _restart(job, src, run, digest)
    if run is None or run.phase == Phase.CLEANED:
        run = start_run(src, digest, str(job.topo.path) if job.topo.path else None, job.tag)
    job.run = run
    job.result.phase = str(run.phase)
    job.result.global_host = job.global_host if job.globals else None
    job.result.global_tables = list(job.globals)
    if "id_floor" not in run.detail:
        run.detail["id_floor"] = id_floor(job.topo.layout, inspect.now_ms(src))
        run.detail["globals"] = list(job.globals)
        for target in targets:
            run.host(target.host.name)
        job.save(src)
    job.result.id_floor = run.detail["id_floor"]


def _restart(job: Copy, src: psycopg.Connection, run: Run, digest: str) -> Run:
    """After an abort: the fleet emptied of the aborted run (``restart.py``), a new run with its
    ID floor."""
    from .restart import clear_aborted_run
    from .site import Site

    site = Site.of(job.topo, job.options["connect_timeout"], None, need_source=True)
    site.run_state(src)
    hosts = clear_aborted_run(site, src, run.detail)
    checkpoint("adopt-restart-cleared")
    floor = run.detail.get("id_floor")
    run = start_run(src, digest, str(job.topo.path) if job.topo.path else None, job.tag)
    run.detail.update({"id_floor": floor, "restarted_at": cut_catalog.source_now(src)})
    run.detail["globals"] = list(job.globals)
    run.save(src)
    job.result.notes.append(
        f"adopt copy: the aborted run's rows removed from {', '.join(hosts)}; a new run started "
        f"(adopt verify must pass again before the cutover)"
    )
    return run


# ---- the source: replica identity and publications ----------------------------------------------


def _replica_identity(job: Copy, src: psycopg.Connection) -> None:
    """``REPLICA IDENTITY FULL`` on each sharded table whose identity lacks its key, the old one
    recorded first (detail ``replica_identity``: table → [kind, index])."""
    keys = dict(job.sharded)
    found = catalog.replica_identities(src, job.schema, list(keys))
    recorded = job.run.detail.setdefault("replica_identity", {})
    for table, key in job.sharded:
        kind, index, cols = found[table]
        if kind == "f" or key in cols:
            continue
        if table not in recorded:
            recorded[table] = [kind, index]
            job.save(src)
        _locking(
            table,
            "REPLICA IDENTITY FULL",
            lambda table=table: catalog.set_replica_identity_full(src, job.schema, table),
        )
        job.progress("note", 0, 0, f"{table}: replica identity FULL (its key {key} is not in it)")
    job.result.replica_identity_full = sorted(recorded)
    _retoast(job, src)


def _retoast(job: Copy, src: psycopg.Connection) -> None:
    """The trigger that keeps a key-changing UPDATE's out-of-line values in the WAL
    (``catalog.RETOAST_FUNCTION``: a row moved to another host arrives there whole) on each sharded
    table, recorded (detail ``retoast``) so abort and cleanup drop it."""
    recorded = job.run.detail.setdefault("retoast", [])
    for table, key in job.sharded:
        if table not in recorded:
            recorded.append(table)
            job.save(src)
        _locking(
            table,
            "its trigger",
            lambda table=table, key=key: catalog.create_retoast_trigger(
                src, job.schema, table, key
            ),
        )


def _locking(table: str, purpose: str, ddl: Callable[[], object]) -> None:
    """``ddl`` on source table ``table`` (its session waits 2 s per try for the lock), retried."""
    transfer.retry_while_locked(
        ddl,
        IDENTITY_ATTEMPTS,
        lambda: OperationFailed(
            f"adopt copy: could not lock {table} on the source for {purpose} in "
            f"{IDENTITY_ATTEMPTS} tries of 2 s (a long transaction holds it); run the command again"
        ),
    )


def _publication(job: Copy, src: psycopg.Connection, target: Target) -> None:
    if replication.publication_exists(src, target.name):
        return
    try:
        _create_publication(job, src, target)
    except psycopg.Error as exc:
        raise OperationFailed(
            f"adopt copy: publication {target.name} on the source: {db.first_line(exc)}"
        ) from None


def _create_publication(job: Copy, src: psycopg.Connection, target: Target) -> None:
    catalog.create_filtered_publication(
        src,
        target.name,
        job.schema,
        [(t, job.key_shard(k)) for t, k in job.sharded] if target.shards else [],
        _ranges(target.shards),
        target.globals,
    )


def _ranges(shards: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in sorted(shards):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


# ---- the fleet host: parents, the copy, the subscription -----------------------------------------


def _prepare_host(job: Copy, target: Target) -> None:
    """The partitioned parents with every shard table of the host attached (a routed table instead
    where the shard's own types make a parent impossible), and the global tables; what exists is
    kept. The attaches commit a batch at a time (each locks its table and indexes until the commit:
    all of a host's at once could overflow its lock table); a re-run attaches what is missing."""
    try:
        with job.connect(target.host, autocommit=False) as conn:
            _parents(job, conn, target)
    except psycopg.Error as exc:
        raise OperationFailed(
            f"adopt copy: preparing {target.host.name}'s tables: {db.first_line(exc)}"
        ) from None


def _parents(job: Copy, conn: psycopg.Connection, target: Target) -> None:
    """See :func:`_prepare_host` (``conn`` not in autocommit; everything committed at the end)."""
    from .globals import create_global_tables

    attached = catalog.partitions(conn, job.schema)
    routed = _routed(job, conn, target)
    pending = 0  # attaches not yet committed
    for table, key in job.sharded if target.shards else []:
        first = (job.topo.schema_name(target.shards[0]), table)
        if table in routed:
            if not catalog.table_exists(conn, job.schema, table):
                schemas = {n: job.topo.schema_name(n) for n in target.shards}
                pk = catalog.primary_key(conn, first)
                # A transaction of its own (the lock check counts it alone): the attaches before it
                # commit first.
                conn.commit()
                pending = 0
                catalog.create_routed_table(
                    conn, job.schema, table, routed[table], pk, job.key_shard(key), schemas
                )
                conn.commit()
            continue
        if table not in attached:
            catalog.create_parent(conn, job.schema, table, first, job.key_shard(key))
        for shard in target.shards:
            schema = job.topo.schema_name(shard)
            if schema not in attached.get(table, set()):
                catalog.attach_shard(conn, (job.schema, table), (schema, table), shard)
                pending += 1
                if pending == TABLES_PER_TRANSACTION:
                    conn.commit()
                    pending = 0
    if target.globals:
        create_global_tables(job, conn, target.globals)
    conn.commit()


def _routed(
    job: Copy, conn: psycopg.Connection, target: Target, now: dict[str, str] | None = None
) -> dict[str, list[tuple]]:
    """The sharded tables with a column of the shard's own types (enums), with their columns: the
    same on every host (the baseline's), read once from this host's first shard (``now``: a
    table's name there when an abort left it under another)."""
    if job.routed is None and target.shards:
        first = job.topo.schema_name(target.shards[0])
        job.routed = {}
        for table, _ in job.sharded:
            cols = catalog.shard_typed_columns(conn, (first, (now or {}).get(table, table)))
            if any(c[2] for c in cols):
                job.routed[table] = cols
    return job.routed or {}


def _tables(job: Copy, target: Target) -> list[str]:
    return [t for t, _ in job.sharded if target.shards] + target.globals


def _copy_host(job: Copy, src: psycopg.Connection, target: Target) -> None:
    """The host's rows as of its slot's snapshot, unless recorded as copied; a copy cut short before
    is thrown away first (its subscription, slot and rows)."""
    state = job.run.host(target.host.name)
    if state.get("copied"):
        return
    with job.connect(target.host) as tgt:
        if replication.subscriptions(tgt, [target.name]):
            replication.drop_subscription(tgt, target.name)
        if replication.slot_exists(src, target.name):
            transfer.drop_slots(src, [target.name], [])
        routed = _routed(job, tgt, target)
        routed_here = [t for t in routed if target.shards]
        # each shard's tables (partitions, and routed tables' partitions: no trigger fires), never
        # the parents: a parent's TRUNCATE locks every shard table of the host at once
        truncate_groups(
            tgt,
            [
                [(job.topo.schema_name(n), t) for t, _ in job.sharded]
                + [catalog.routed_partition(t, n) for t in routed_here]
                for n in target.shards
            ]
            + [[(job.schema, t) for t in target.globals]],
        )
        # the routing triggers off while the copy routes the rows itself, set-based; on again
        # below, before the subscription exists (a copy cut short meanwhile starts over here)
        for table in routed_here:
            tgt.execute(catalog.route_trigger(job.schema, table, enable=False))
        pairs = _copy_pairs(job, tgt, target)
        serial = not catalog.may_skip_triggers(tgt)
        if serial:  # foreign keys checked: one COPY at a time, referenced tables first
            schemas = [job.schema] + [job.topo.schema_name(n) for n in target.shards[:1]]
            pairs = _referenced_first(pairs, catalog.references(tgt, schemas))
    with job.lock:
        state.update(copied=False, rows=0, bytes=0, tables=0)
        job.run.detail["routed"] = job.result.routed = sorted(job.routed or {})
    job.save(src)
    done = _run_copy(job, target, [p[1:] for p in pairs], serial)
    with job.connect(target.host) as tgt:
        for table in routed_here:
            tgt.execute(catalog.route_trigger(job.schema, table, enable=True))
    with job.lock:
        state.update(
            copied=True,
            rows=sum(r for r, _ in done),
            bytes=sum(b for _, b in done),
            tables=len(_tables(job, target)),
        )
        job.result.copied_bytes += state["bytes"]
    job.save(src)
    checkpoint("adopt-after-copy")


def _copy_hosts(job: Copy, targets: list[Target]) -> None:
    """Copy and subscribe every host, the hosts in parallel: ``--copy-workers`` COPY streams from the
    source in all, spread over the hosts still to copy (the source's load stays the same; the hosts
    write at once)."""
    todo = [t for t in targets if not job.run.host(t.host.name).get("copied")]
    job.workers = max(1, job.options["copy_workers"] // max(1, len(todo)))

    def one(target: Target) -> None:
        with job.connect(job.source) as src:
            _copy_host(job, src, target)
        _subscribe(job, target)

    # Even one host in a thread of its own: this thread stays free to hear Ctrl-C, and to cancel
    # the COPYs then (their hosts are copied again by the next run), rather than wait for them.
    pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="shardctl-host")
    try:
        for future in [pool.submit(one, t) for t in targets]:
            future.result()
    except KeyboardInterrupt:
        job.cancel()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _copy_pairs(job: Copy, tgt: psycopg.Connection, target: Target) -> list[tuple]:
    """(table, COPY out of the source, COPY into the host) per table, columns named as on the host (a
    routed table's per-shard-typed columns read as text); a routed table in parts (:func:`_parts`):
    one per COPY worker, more when a part would exceed ROUTED_SHARDS_PER_PART shards, each followed
    by its shards' routing in the same transaction; the parts first (they are the most work)."""
    keys = dict(job.sharded)
    routed = {t: {c[0]: c[3] for c in cols if c[2]} for t, cols in (job.routed or {}).items()}
    first, pairs = [], []
    for table in _tables(job, target):
        cols = catalog.columns(tgt, job.schema, table)
        as_text = routed.get(table, {})
        out = [catalog.text_cast(c, as_text[c]) if c in as_text else c for c in cols]
        into = catalog.copy_in_columns(job.schema, table, cols)
        if table not in keys:
            pairs.append((table, catalog.copy_out_rows(job.schema, table, out, None), into))
            continue
        shard = job.key_shard(keys[table])
        if not as_text:
            where = catalog.shard_filter(shard, _ranges(target.shards))
            pairs.append((table, catalog.copy_out_rows(job.schema, table, out, where), into))
            continue
        parts = max(job.workers, math.ceil(len(target.shards) / ROUTED_SHARDS_PER_PART))
        for part in _parts(target.shards, parts):
            where = catalog.shard_filter(shard, _ranges(part))
            route = [
                catalog.route_rows(table, job.topo.schema_name(n), n, job.routed[table])
                for n in part
            ]
            first.append(
                (table, catalog.copy_out_rows(job.schema, table, out, where), into, [], route)
            )
    return first + pairs


def _parts(shards: list[int], count: int) -> list[list[int]]:
    """``shards`` in at most ``count`` runs of neighbours, as even as can be."""
    ordered = sorted(shards)
    size, extra = divmod(len(ordered), max(1, min(count, len(ordered))))
    out, at = [], 0
    while at < len(ordered):
        step = size + (1 if len(out) < extra else 0)
        out.append(ordered[at : at + step])
        at += step
    return out


def _referenced_first(pairs: list[tuple], refs: list[tuple[str, str]]) -> list[tuple]:
    """``pairs`` (each led by its table's name) with every table after the tables it references
    (a cycle keeps its order: its foreign keys fail the copy, with their own message)."""
    depth: dict[str, int] = {}

    def level(table: str, seen: frozenset[str] = frozenset()) -> int:
        if table not in depth:
            up = [f for t, f in refs if t == table and f not in seen]
            depth[table] = 1 + max((level(f, seen | {table}) for f in up), default=-1)
        return depth[table]

    return sorted(pairs, key=lambda p: level(p[0]))


def _run_copy(
    job: Copy, target: Target, pairs: list[tuple], serial: bool = False
) -> list[tuple[int, int]]:
    """Create the host's slot with a snapshot and run the COPYs as of it, in parallel workers
    (``serial``: in one, foreign keys checked, for a role that may not skip them)."""
    kwargs = job.source.connect_kwargs(
        purpose="admin",
        connect_timeout=job.options["connect_timeout"],
        application_name=f"shardctl adopt copy {target.host.name}",
    )
    lock, done = threading.Lock(), [0]

    def tick(n: int) -> None:
        with lock:
            done[0] += n
            job.progress(f"copy {target.host.name}", done[0], len(pairs), "tables")
        checkpoint("adopt-mid-copy")

    def one(snapshot: str, chunk: list[tuple]) -> list[tuple[int, int]]:
        purpose = f"adopt copy {target.host.name}"
        with (
            job.connect(job.source, purpose=purpose) as s,
            job.connect(target.host, autocommit=False, purpose=purpose) as t,
        ):
            if not serial:
                catalog.without_triggers(t)
            t.commit()
            pause, out = job.pause(), []
            with job.tracked(s, t):
                # a transaction a table: a COPY into a parent locks each partition it fills, with
                # its indexes, until the commit (a copy cut short is thrown away whole anyway)
                for pair in chunk:
                    out += transfer.copy_statements_in_snapshot(s, t, snapshot, [pair], tick, pause)
            return out

    job.progress(f"copy {target.host.name}", 0, len(pairs), "tables")
    workers = 1 if serial else min(job.workers, len(pairs))
    try:
        return [x for part in in_new_slot(kwargs, target.name, pairs, workers, one) for x in part]
    except psycopg.Error as exc:
        raise OperationFailed(
            f"adopt copy: copying to {target.host.name}: {db.first_line(exc)}; run the command "
            f"again (that host's copy starts over)"
        ) from None


def _subscribe(job: Copy, target: Target) -> None:
    """The host's subscription on its slot, started without a copy of its own (the tables locked
    from before ENABLE until REFRESH: ``replication.start_subscription``)."""
    tables = [(job.schema, t) for t in _tables(job, target)]
    with job.connect(target.host) as tgt:
        if not replication.subscriptions(tgt, [target.name]):
            replication.create_subscription(
                tgt, target.name, job.publisher_conninfo(), copy_data=False, start=False
            )
        elif replication.started_without_tables(tgt, target.name):
            # stopped between ENABLE and REFRESH: the worker may have skipped changes; copy again
            transfer.disable_subscription(tgt, target.name)
            with job.connect(job.source) as src:
                with job.lock:
                    job.run.host(target.host.name)["copied"] = False
                job.save(src)
                _copy_host(job, src, target)
            return _subscribe(job, target)
        checkpoint("adopt-after-subscription")
        with job.connect(target.host, autocommit=False) as hold:
            replication.start_subscription(
                tgt, target.name, copy_data=False, hold=hold, tables=tables
            )
    job.progress("note", 0, 0, f"{target.host.name}: replication started ({target.name})")
    return None


def _wait_caught_up(job: Copy, src: psycopg.Connection, targets: list[Target]) -> None:
    """Until every host's subscription has applied the source's WAL as of now."""
    names = [t.name for t in targets]
    lsn = replication.wal_insert_lsn(src)

    def ready() -> bool:
        lag = replication.slot_lag(src, names)
        job.progress("catch up", 0, 0, f"lag {lag or 0} bytes")
        return replication.replayed(src, names, lsn)

    timeout = job.options["sync_timeout"]
    wait_id_map(
        job.topo, job.source, timeout=timeout, connect_timeout=job.options["connect_timeout"]
    )
    transfer.wait_for(
        ready,
        time.monotonic() + timeout,
        lambda: WaitTimeout(
            f"adopt copy: the fleet's subscriptions did not catch up within {timeout:g}s; run "
            f"the command again to keep waiting (adopt status shows the lag)"
        ),
    )


# ---- what other helpers own ---------------------------------------------------------------------


def _ensure_id_map(job: Copy) -> None:
    """The old ID -> key lookup database (:mod:`.id_map`; idempotent)."""
    made = ensure_id_map(
        job.topo, job.source, job.doc, connect_timeout=job.options["connect_timeout"]
    )
    job.result.notes += made.notes
    for index in made.identity_indexes:
        job.result.notes.append(f"replica identity: index {index} (the id map's column list)")


def _write_adoption(job: Copy) -> None:
    """The topology's ``adoption:`` section, ``authoritative: source`` (``model.adoption``), unless
    the file already says as much, or the cutover has made the fleet authoritative. A ``source``
    the file already names is kept as it is."""
    current = job.topo.adoption
    if job.topo.path is None or (current is not None and not current.on_source):
        return
    tables, globals_ = tables_from_plan(job.doc)
    # The apps may already route by this section (through their pooler, with their password
    # variable): keep their way to the old database; --from is only how the copy reaches it.
    kept = current.source if current is not None and current.source is not None else None
    wanted = Adoption(
        source=kept or Host(name=SOURCE_HOST, dsn=job.source.dsn, shards=[], pooler="none"),
        schema=job.schema,
        authoritative="source",
        id_floor=job.run.detail["id_floor"],
        tables=tables,
        globals=globals_,
        id_map=current.id_map if current is not None and current.id_map else _id_map(job.topo),
    )
    if current is not None and current.document() == wanted.document():
        return
    job.topo = write_adoption(
        job.topo.path, wanted, allow_inline_password=job.options["allow_inline_password"]
    )
    job.result.notes.append(f"wrote the adoption: section of {job.topo.path}")


def _id_map(topo: Topology) -> IdMap:
    """Where the id map goes unless the topology says: beside the fleet's database on the global
    host, named after it (two fleets on one server never share one)."""
    place = topo.id_map_place()
    found = server_database(topo.host(place.host).dsn_for("admin"))
    return IdMap(place.host, f"{found[2]}_adopt_ids"[:63]) if found else place


# ---- status -------------------------------------------------------------------------------------


def host_figures(run: Run, src: psycopg.Connection, targets: list[Target]) -> list[HostCopy]:
    """Each host's recorded copy, the COPYs running now, and its slot's lag and retained WAL."""
    slots = catalog.slot_figures(src, [t.name for t in targets])
    live = catalog.copy_progress(src, "shardctl adopt copy ")
    out = []
    for target in targets:
        state = run.host(target.host.name)
        slot = slots.get(target.name, {})
        figures = HostCopy(
            host=target.host.name,
            shards=format_shards(target.shards) if target.shards else "-",
            state="waiting",
            tables=state.get("tables", 0),
            rows=state.get("rows", 0),
            bytes=state.get("bytes", 0),
            lag_bytes=slot.get("lag_bytes"),
            lag_seconds=slot.get("lag_seconds"),
            retained_bytes=slot.get("retained_bytes"),
            wal_status=slot.get("wal_status"),
        )
        now = live.get(f"shardctl adopt copy {target.host.name}")
        if state.get("copied"):
            figures.state = "streaming" if slot.get("active") else "copied"
        elif now:
            figures.state, figures.rows, figures.bytes = "copying", now[0], now[1]
        out.append(figures)
    return out


def adopt_status(
    topo: Topology, dsn: str | None = None, *, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
) -> AdoptStatus:
    """The adoption as recorded on the database at ``dsn`` (default: the topology's
    ``adoption.source``): phase, per-host copy and lag, and the WAL the source holds for it
    (read-only)."""
    if dsn is None:
        if topo.adoption is None or topo.adoption.source is None:
            raise BadInput("the topology has no adoption.source: give --from DSN")
        source = topo.adoption.source
    else:
        source = source_host(dsn)
    result = AdoptStatus(source=source.masked_dsn, phase="none")
    with db.connect(
        source, autocommit=True, connect_timeout=connect_timeout, purpose="adopt status"
    ) as src:
        run = load_run(src)
        if run is None:
            return result
        tag = run_tag(run)
        targets = [
            Target(h, list(h.shards), [], tag) for h in topo.hosts if h.name in run.detail["hosts"]
        ]
        result.phase = str(run.phase)
        result.started_at = str(run.started_at)
        result.updated_at = str(run.updated_at)
        result.hosts = host_figures(run, src, targets)
        result.replica_identity_full = sorted(run.detail.get("replica_identity") or {})
        ids_name = slot_name("ids", tag)
        ids = catalog.slot_figures(src, [ids_name]).get(ids_name, {})
        held = [h.retained_bytes or 0 for h in result.hosts] + [ids.get("retained_bytes") or 0]
        result.held_bytes = max(held)
        result.id_map_lag_bytes = ids.get("lag_bytes")
        result.routed = list(run.detail.get("routed") or [])
        result.id_floor = run.detail.get("id_floor")
        # since the run last started, as the cutover asks for it
        result.verification = verify_catalog.last_run(src, run.detail.get("restarted_at"))
        result.verified = verify_catalog.passed(result.verification)
    return result
