"""``move-shard``: move logical shards to another host online, losing no write (SPEC 7).

Phases, each resumable and recorded in ``shardctl.moves`` on both hosts:

``prepare``
    On the source (under the host lock): refuse tables that cannot be replicated, check the
    ledger against the migration files, mark the shards ``moving_out`` (migrate refuses from
    now on). On the target: create each schema, its sequence, ``next_id()`` and tables at the
    source's migration version, copy the ledger rows, mark the shards ``moving_in``. Then
    compare the tables and columns on both sides.
``sync``
    One publication ``FOR TABLES IN SCHEMA`` per batch of schemas on the source, its slot,
    and a subscription with the initial copy on the target; wait until every table is ready.
``cutover``
    One transaction on the source: ``LOCK TABLE … IN EXCLUSIVE MODE`` on every table (writes
    wait, reads go on), wait until the subscriptions have applied the source's WAL up to that
    point, compare row counts and a checksum per table, set every target sequence from the
    source sequence plus a margin, wait until the target's clock is past the source's, then a
    guard trigger on every table (SQLSTATE ``SCM01``, "shard N moved to HOST"), writes revoked,
    schemas renamed to ``{schema}_moved_{move id}``, shard rows ``moved_out``; commit. Then the
    target's rows become ``active``, the topology file is flipped, and the subscriptions,
    publications and slots are dropped (nothing is left to replicate, and a slot would keep
    WAL on the source).
``cleanup`` (``--cleanup``)
    Drop the renamed source schemas and their control rows.

``abort`` makes the source authoritative again at any point before cleanup. Before the
cutover it drops the target's copies and the replication objects; after it, it freezes the
target, copies its rows back into the source's (renamed back) schemas, checks them and flips
the topology back.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg import conninfo as pg_conninfo

from ...engine import connections as db
from ...sql import catalog as q
from ...errors import BadInput, HostUnreachable, LockBusy, OperationFailed, ShardctlError
from ...engine.fanout import ensure_control_schema, log_event, read_shards
from ...model.identifiers import MAX_IDENTIFIER_BYTES, quote_ident
from ...sql.migrations import for_topology
from ..provision import steps_for
from ...model.ranges import format_shards, parse_shards
from ...sql.render import render_shard
from ...model.topology import Host, Topology
from ...model.topology_file import TopologyFile

# pg_advisory_lock(classid, objid) = ('SM', shard): "this shard is being moved" (session-level).
MOVE_LOCK_CLASS = 0x534D
FORWARD = ("preparing", "prepared", "syncing", "synced", "cut_over", "cleaned")
FINISHED = ("cleaned", "aborted")
PHASE_NAMES = ("prepare", "sync", "cutover")
Progress = Callable[[str, int, int, str], None]


@dataclass
class MoveOptions:
    max_freeze: float = 5.0            # seconds writes may wait at cutover before it gives up (and retries)
    sequence_margin: int = 1024        # added to each source sequence's value on the target
    schemas_per_subscription: int = 64
    max_subscriptions: int = 4         # more schemas per publication rather than more subscriptions
    sync_timeout: float = 3600.0
    attempts: int = 3                  # cutover freezes tried before giving up
    wait: float = 0.0                  # seconds to wait for another run's locks
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
    batch_size: int = 16               # shards per transaction when creating or dropping schemas
    publisher_dsn: str | None = None   # how the target reaches the source, if not by the topology DSN
    allow_inline_password: bool = False


@dataclass
class Move:
    """A move as recorded on its hosts (``phases``: role → phase)."""

    move_id: str
    shards: list[int]
    source: str
    target: str
    phases: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    started_at: Any = None
    updated_at: Any = None

    @property
    def phase(self) -> str:
        src, tgt = self.phases.get("source"), self.phases.get("target")
        if "aborting" in (src, tgt):
            return "aborting"
        if src == "aborted" and tgt in (None, "aborted"):
            return "aborted"
        if src == "aborted" or tgt == "aborted":
            return "aborting"
        if src in ("cut_over", "cleaned"):
            return src if src == tgt or src == "cut_over" else "cut_over"
        known = [p for p in (src, tgt) if p in FORWARD]
        if not known:
            return "new"
        if tgt is None:
            return "preparing"
        return min(known, key=FORWARD.index)

    @property
    def active(self) -> bool:
        return self.phase not in FINISHED

    @property
    def names(self) -> list[str]:
        """Publication = slot = subscription name per batch."""
        return [f"shardctl_{self.move_id}_{k}" for k in range(len(self.detail.get("batches") or []))]

    def to_dict(self) -> dict:
        return {"move_id": self.move_id, "shards": format_shards(self.shards), "shard_count": len(self.shards),
                "source": self.source, "target": self.target, "phase": self.phase, "phases": dict(self.phases),
                "started_at": self.started_at, "updated_at": self.updated_at,
                **{k: v for k, v in self.detail.items() if k in ("freeze_seconds", "sync_seconds", "tables",
                                                                  "cutover_at", "sequences", "rows")}}


def new_move_id() -> str:
    return "mv" + secrets.token_hex(4)


def renamed_schema(schema: str, shard: int, move_id: str, kind: str = "moved") -> str:
    name = f"{schema}_{kind}_{move_id}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    return f"shardctl_{kind}_{move_id}_{shard}"


# ---- records -----------------------------------------------------------------------------

def _read_records(conn: psycopg.Connection) -> list[tuple]:
    if not q.moves_table_exists(conn):
        return []
    return conn.execute("SELECT move_id, shards, source, target, role, phase, detail, started_at, updated_at "
                        "FROM shardctl.moves ORDER BY started_at").fetchall()


def _merge(records: list[tuple], moves: dict[str, Move]) -> None:
    for move_id, shards, source, target, role, phase, detail, started, updated in records:
        move = moves.get(move_id)
        if move is None:
            move = moves[move_id] = Move(move_id, parse_shards(shards), source, target, started_at=started,
                                         updated_at=updated)
        move.phases[role] = phase
        # The source's record is authoritative for the cutover; merge the rest.
        if role == "source":
            move.detail = {**move.detail, **(detail or {})}
        else:
            move.detail = {**(detail or {}), **move.detail}
        move.updated_at = max(filter(None, [move.updated_at, updated]), default=None)


def find_moves(topo: Topology, hosts: list[Host] | None = None, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
               required: tuple[str, ...] = ()) -> tuple[dict[str, Move], dict[str, str]]:
    """Every move recorded on ``hosts`` (default: all), and the hosts that could not be read.
    Hosts named in ``required`` must answer."""
    moves: dict[str, Move] = {}
    errors: dict[str, str] = {}
    for host in hosts or topo.hosts:
        try:
            with db.connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="move-shard") as conn:
                _merge(_read_records(conn), moves)
        except HostUnreachable as exc:
            if host.name in required:
                raise
            errors[host.name] = exc.reason
        except psycopg.Error as exc:
            if host.name in required:
                raise OperationFailed(f"host {host.name}: cannot read moves: {db.first_line(exc)}") from None
            errors[host.name] = db.first_line(exc)
    return moves, errors


def _set_phase(conn: psycopg.Connection, move: Move, role: str, phase: str, detail: dict | None = None) -> None:
    """Insert or update this host's record of the move (in the caller's transaction, if any)."""
    conn.execute(
        """INSERT INTO shardctl.moves (move_id, shards, source, target, role, phase, detail)
           VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb)
           ON CONFLICT (move_id) DO UPDATE SET phase = EXCLUDED.phase,
                  detail = shardctl.moves.detail || EXCLUDED.detail, updated_at = clock_timestamp(),
                  finished_at = CASE WHEN EXCLUDED.phase IN ('cleaned', 'aborted') THEN clock_timestamp() END""",
        (move.move_id, format_shards(move.shards), move.source, move.target, role, phase,
         q.dumps(detail if detail is not None else move.detail)))
    move.phases[role] = phase
    if detail:
        move.detail.update(detail)


# ---- locks ---------------------------------------------------------------------------------

@contextmanager
def shard_locks(hosts: list[Host], shards: list[int], options: MoveOptions) -> Iterator[None]:
    """Hold session-level advisory locks on the moving shards on every host named, so two runs never
    work on the same shards at once (a killed run's locks go with its connections)."""
    conns: list[psycopg.Connection] = []
    try:
        for host in hosts:
            conn = db.connect(host, autocommit=True, connect_timeout=options.connect_timeout,
                              purpose="move-shard lock")
            conns.append(conn)
            deadline = time.monotonic() + max(0.0, options.wait)
            while True:
                got = conn.execute("SELECT count(*) FROM unnest(%s::int[]) AS s WHERE pg_try_advisory_lock(%s, s)",
                                   (shards, MOVE_LOCK_CLASS)).fetchone()[0]
                if got == len(shards):
                    break
                conn.execute("SELECT pg_advisory_unlock_all()")
                if time.monotonic() >= deadline:
                    holder = conn.execute(
                        """SELECT a.pid, a.application_name, a.backend_start FROM pg_locks l
                             JOIN pg_stat_activity a USING (pid)
                            WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = ANY(%s::oid[])
                              AND l.granted LIMIT 1""", (MOVE_LOCK_CLASS, shards)).fetchone()
                    who = (f"pid {holder[0]}, {holder[1] or 'unnamed client'}, connected "
                           f"{holder[2]:%Y-%m-%d %H:%M:%S}") if holder else "holder unknown"
                    raise LockBusy(f"host {host.name}: another shardctl run is moving some of shards "
                                   f"{format_shards(shards)} ({who}); waited {options.wait:g}s (use --wait)")
                time.sleep(0.2)
        yield
    finally:
        for conn in conns:
            conn.close()


@contextmanager
def topology_file_lock(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of the topology file between shardctl processes on this machine."""
    lock_path = path.parent / f".{path.name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def flip_topology(path: Path, shards: list[int], frm: str, to: str, allow_inline_password: bool = False) -> bool:
    """Give ``shards`` to host ``to`` in the topology file. False if the file already says so."""
    with topology_file_lock(path):
        edit = TopologyFile(path, allow_inline_password=allow_inline_password)
        src, dst, moving = set(edit.host_shards(frm)), set(edit.host_shards(to)), set(shards)
        if moving <= dst and not moving & src:
            return False
        stray = moving - src - dst
        if stray:
            raise OperationFailed(f"the topology file gives shards {format_shards(stray)} to neither {frm} nor "
                                  f"{to}; it was edited during the move: fix it by hand")
        edit.set_host_shards(frm, sorted(src - moving))
        edit.set_host_shards(to, sorted(dst | moving))
        edit.save()
        return True


# ---- the run ---------------------------------------------------------------------------------

class _FreezeTimeout(Exception):
    pass


class MoveRun:
    """One invocation on one move: holds the topology, options, progress and the report."""

    def __init__(self, topo: Topology, move: Move, options: MoveOptions, progress: Progress | None):
        if topo.path is None:
            raise BadInput("move-shard needs a topology loaded from a file (it rewrites the file at cutover)")
        self.topo = topo
        self.move = move
        self.options = options
        self.progress = progress or (lambda step, done, total, note: None)
        self.source = topo.host(move.source)
        self.target = topo.host(move.target)
        self.report: dict[str, Any] = {"move_id": move.move_id, "shards": format_shards(move.shards),
                                       "shard_count": len(move.shards), "source": move.source,
                                       "target": move.target, "phases_run": [], "messages": []}
        self.started = time.perf_counter()

    # ---- helpers ---------------------------------------------------------------------------
    def note(self, message: str) -> None:
        self.report["messages"].append(message)
        self.progress("note", 0, 0, message)

    def connect(self, host: Host, autocommit: bool = True) -> psycopg.Connection:
        return db.connect(host, autocommit=autocommit, connect_timeout=self.options.connect_timeout,
                          purpose="move-shard")

    def schema(self, shard: int) -> str:
        return self.topo.schema_name(shard)

    @property
    def schemas(self) -> list[str]:
        return [self.schema(n) for n in self.move.shards]

    def renamed(self, shard: int, kind: str = "moved") -> str:
        return renamed_schema(self.schema(shard), shard, self.move.move_id, kind)

    def both(self, phase: str, detail: dict | None = None) -> None:
        """Record a phase on the source, then the target."""
        for host, role in ((self.source, "source"), (self.target, "target")):
            with self.connect(host) as conn, conn.transaction():
                _set_phase(conn, self.move, role, phase, detail)

    def event(self, kind: str, detail: dict) -> None:
        for host in (self.source, self.target):
            try:
                with self.connect(host) as conn:
                    log_event(conn, kind, self.move.shards, {"move_id": self.move.move_id, **detail})
            except (HostUnreachable, psycopg.Error):
                pass

    def publisher_conninfo(self) -> str:
        kwargs = self.source.connect_kwargs()
        dsn = self.options.publisher_dsn or str(kwargs.pop("conninfo"))
        password = kwargs.get("password")
        return pg_conninfo.make_conninfo(dsn, password=password) if password else dsn

    # ---- prepare ---------------------------------------------------------------------------
    def prepare(self) -> None:
        move, shards = self.move, self.move.shards
        phase = move.phase
        if phase not in ("new", "preparing", "prepared"):
            self.note(f"prepare: already done (phase {phase})")
            return
        self.report["phases_run"].append("prepare")
        migrations = for_topology(self.topo)
        t0 = time.perf_counter()
        if move.phases.get("target") is None:
            self._check_target_free()  # before the source's shards are marked
        with db.host_lock(self.source, wait=self.options.wait, connect_timeout=self.options.connect_timeout,
                          purpose="move-shard") as conn:
            facts = q.server_facts(conn)
            if facts["version_num"] < 150000:
                raise OperationFailed(f"host {self.source.name} runs PostgreSQL {facts['version_num']}: moving "
                                      f"shards needs 15 or later (FOR TABLES IN SCHEMA)")
            if facts["wal_level"] != "logical":
                raise OperationFailed(f"host {self.source.name} has wal_level={facts['wal_level']}: moving shards "
                                      f"needs wal_level=logical (a server restart)")
            q.ensure_moves_table(conn)
            q.ensure_guard_function(conn)
            rows = read_shards(conn)
            missing = [n for n in shards if n not in rows]
            if missing:
                raise OperationFailed(f"host {self.source.name} has no record of shards {format_shards(missing)} "
                                      f"(run shardctl init)")
            new = move.phases.get("source") is None
            wrong = [n for n in shards if rows[n].state != ("active" if new else "moving_out")]
            if wrong:
                states = sorted({rows[n].state for n in wrong})
                raise OperationFailed(f"shards {format_shards(wrong)} on {self.source.name} are {', '.join(states)}, "
                                      f"not active: another move holds them (see move-shard --status)")
            present = q.present_schemas(conn, self.schemas)
            absent = [n for n in shards if self.schema(n) not in present]
            if absent:
                raise OperationFailed(f"host {self.source.name} lacks the schemas of shards {format_shards(absent)}")
            problems = q.unmovable(conn, self.schemas)
            if problems:
                more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
                raise OperationFailed("refusing to move: " + "; ".join(problems[:5]) + more +
                                      ". Add a primary key (or REPLICA IDENTITY) first")
            ledger = conn.execute(
                """SELECT shard_id, version, description, checksum, duration_ms, applied_at, applied_by
                     FROM shardctl.migrations WHERE shard_id = ANY(%s) ORDER BY shard_id, version""",
                (shards,)).fetchall()
            self.ledger: dict[int, list[tuple]] = {}
            for row in ledger:
                self.ledger.setdefault(row[0], []).append(row)
            self.plans = self._plans(migrations)
            if new:
                with conn.transaction():
                    _set_phase(conn, move, "source", "preparing", {"batches": None})
                    updated = conn.execute("UPDATE shardctl.shards SET state = 'moving_out' "
                                           "WHERE shard_id = ANY(%s) AND state = 'active'", (shards,)).rowcount
                    if updated != len(shards):
                        raise OperationFailed("the shards changed state while the move started; try again")
        with db.host_lock(self.target, wait=self.options.wait, connect_timeout=self.options.connect_timeout,
                          purpose="move-shard") as conn:
            facts = q.server_facts(conn)
            if facts["version_num"] < 150000:
                raise OperationFailed(f"host {self.target.name} runs PostgreSQL {facts['version_num']}: receiving "
                                      f"shards needs 15 or later")
            ensure_control_schema(conn, self.topo)
            q.ensure_moves_table(conn)
            q.ensure_guard_function(conn)
            records = {r[0]: r for r in _read_records(conn)}
            rows = read_shards(conn)
            present = q.present_schemas(conn, self.schemas)
            mine = move.move_id in records
            taken = [n for n in shards if n in rows and (rows[n].state != "moving_in" or not mine)]
            if taken:
                raise OperationFailed(f"host {self.target.name} already records shards {format_shards(taken)} "
                                      f"({', '.join(sorted({rows[n].state for n in taken}))}); clean up or abort "
                                      f"the move that left them")
            if not mine:
                if present:
                    found = sorted(present)
                    raise OperationFailed(f"host {self.target.name} already has schemas {', '.join(found[:5])}"
                                          f"{' …' if len(found) > 5 else ''}; refusing to overwrite them")
                with conn.transaction():
                    _set_phase(conn, move, "target", "preparing")
            todo = [p for p in self.plans if p[0] not in rows]
            half_built = [self.schema(n) for n, *_ in todo if self.schema(n) in present]
            if half_built:
                self.note(f"dropping {len(half_built)} half-built schema(s) on {self.target.name} from an "
                          f"interrupted prepare")
                for i in range(0, len(half_built), self.options.batch_size):
                    with conn.transaction():
                        conn.execute("".join(f"DROP SCHEMA IF EXISTS {quote_ident(s)} CASCADE;\n"
                                             for s in half_built[i:i + self.options.batch_size]))
            self._create_on_target(todo)
        self._compare_structure()
        self.both("prepared")
        self.report["prepare_seconds"] = round(time.perf_counter() - t0, 3)
        self.event("move-shard prepare", {"source": move.source, "target": move.target})

    def _check_target_free(self) -> None:
        with self.connect(self.target) as conn:
            facts = q.server_facts(conn)
            if facts["version_num"] < 150000:
                raise OperationFailed(f"host {self.target.name} runs PostgreSQL {facts['version_num']}: receiving "
                                      f"shards needs 15 or later")
            rows = read_shards(conn)
            taken = [n for n in self.move.shards if n in rows]
            if taken:
                raise OperationFailed(f"host {self.target.name} already records shards {format_shards(taken)} "
                                      f"({', '.join(sorted({rows[n].state for n in taken}))}); clean up or abort "
                                      f"the move that left them")
            present = sorted(q.present_schemas(conn, self.schemas))
            if present:
                raise OperationFailed(f"host {self.target.name} already has schemas {', '.join(present[:5])}"
                                      f"{' …' if len(present) > 5 else ''}; refusing to overwrite them")

    def _plans(self, migrations: list) -> list[tuple[int, str, list]]:
        """Per shard: (shard, creation SQL, steps up to its version), checked against the source's ledger."""
        by_version = {m.version: m for m in migrations}
        plans = []
        for n in self.move.shards:
            rows = self.ledger.get(n, [])
            versions = [r[1] for r in rows]
            if versions != list(range(1, len(versions) + 1)):
                raise OperationFailed(f"shard {n} on {self.source.name} has ledger versions {versions}: not "
                                      f"1..N without gaps; fix that before moving it")
            steps = steps_for(migrations, self.topo, n, 0, len(versions)) if versions else []
            for row, step in zip(rows, steps):
                if step.checksum != row[3]:
                    raise OperationFailed(
                        f"{by_version[step.version].name} changed after it was applied to shard {n}: the target "
                        f"would not match the source (restore the file, or migrate --repair first)")
            if len(steps) != len(versions):
                raise OperationFailed(f"shard {n} is at V{len(versions)} but the migrations directory stops at "
                                      f"V{len(steps)}")
            plans.append((n, render_shard(self.topo, n), steps))
        return plans

    def _create_on_target(self, plans: list[tuple[int, str, list]]) -> None:
        """Create schemas at the source's version with copied ledger rows, ``moving_in``, batch by batch."""
        total, done = len(plans), 0
        self.progress("prepare", 0, total, self.target.name)
        size = max(1, self.options.batch_size)
        conn = self.connect(self.target, autocommit=False)
        try:
            for i in range(0, total, size):
                batch = plans[i:i + size]
                if all(s.transactional for _, _, steps in batch for s in steps):
                    parts = []
                    for n, create, steps in batch:
                        parts.append(create.rstrip().rstrip(";") + ";\n")
                        for s in steps:
                            parts.append(f"SET LOCAL search_path TO {quote_ident(self.schema(n))}, public;\n"
                                         + s.sql.rstrip().rstrip(";") + ";\n")
                    conn.execute("".join(parts))
                    self._target_rows(conn, [n for n, _, _ in batch])
                    conn.commit()
                else:
                    for plan in batch:
                        self._create_one(conn, plan)
                done += len(batch)
                self.progress("prepare", done, total, self.target.name)
        except psycopg.Error as exc:
            if not conn.broken:
                conn.rollback()
            raise OperationFailed(f"prepare on {self.target.name}: {db.first_line(exc)}") from None
        finally:
            conn.close()

    def _create_one(self, conn: psycopg.Connection, plan: tuple[int, str, list]) -> None:
        n, create, steps = plan
        schema = quote_ident(self.schema(n))
        conn.execute(create)
        for s in steps:
            if s.transactional:
                conn.execute(f"SET LOCAL search_path TO {schema}, public;\n" + s.sql)
                continue
            conn.commit()
            conn.autocommit = True
            try:
                conn.execute(f"SET search_path TO {schema}, public")
                conn.execute(s.sql)
                conn.execute("RESET search_path")
            finally:
                conn.autocommit = False
        self._target_rows(conn, [n])
        conn.commit()

    def _target_rows(self, conn: psycopg.Connection, shards: list[int]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO shardctl.shards (shard_id, schema_name, state) VALUES (%s, %s, 'moving_in')",
                            [(n, self.schema(n)) for n in shards])
            rows = [r for n in shards for r in self.ledger.get(n, [])]
            if rows:
                cur.executemany(
                    """INSERT INTO shardctl.migrations (shard_id, version, description, checksum, duration_ms,
                                                       applied_at, applied_by) VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                    rows)

    def _compare_structure(self) -> None:
        with self.connect(self.source) as s, self.connect(self.target) as t:
            src, tgt = q.structure(s, self.schemas), q.structure(t, self.schemas)
        diffs = []
        for key in sorted(set(src) | set(tgt)):
            if key not in tgt:
                diffs.append(f"{key[0]}.{key[1]} exists only on {self.source.name} (created outside migrations?)")
            elif key not in src:
                diffs.append(f"{key[0]}.{key[1]} exists only on {self.target.name}")
            elif src[key] != tgt[key]:
                diffs.append(f"{key[0]}.{key[1]} has columns {src[key]} on {self.source.name} but {tgt[key]} on "
                             f"{self.target.name}")
        if diffs:
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise OperationFailed("prepare: the target's tables differ from the source's: " + "; ".join(diffs[:3]) +
                                  more + ". Abort the move (move-shard --abort) and bring the schemas in line")

    # ---- sync ------------------------------------------------------------------------------
    def batches(self) -> list[list[int]]:
        existing = self.move.detail.get("batches")
        if existing:
            return existing
        shards = self.move.shards
        per = max(1, self.options.schemas_per_subscription)
        if self.options.max_subscriptions > 0:
            per = max(per, -(-len(shards) // self.options.max_subscriptions))
        return [shards[i:i + per] for i in range(0, len(shards), per)]

    def sync(self, wait_only: bool = False) -> None:
        phase = self.move.phase
        if phase in ("preparing", "new"):
            raise OperationFailed(f"move {self.move.move_id} is not prepared yet (phase {phase}): run the prepare "
                                  f"phase first")
        if phase not in ("prepared", "syncing", "synced"):
            self.note(f"sync: nothing to do (phase {phase})")
            return
        if not wait_only:
            self.report["phases_run"].append("sync")
        t0 = time.perf_counter()
        batches = self.batches()
        if phase == "prepared":
            self.both("syncing", {"batches": batches})
        self.move.detail["batches"] = batches
        names = self.move.names
        with self.connect(self.source) as src, self.connect(self.target) as tgt:
            subs = q.subscriptions(tgt, names)
            missing = [k for k, name in enumerate(names) if name not in subs]
            if missing:
                facts = q.server_facts(src)
                slots_needed = sum(1 for k in missing if not q.slot_exists(src, names[k]))
                free = facts["max_replication_slots"] - facts["slots_used"]
                if slots_needed + 2 > free:
                    raise OperationFailed(f"host {self.source.name} has {free} free replication slots "
                                          f"(max_replication_slots={facts['max_replication_slots']}); this move needs "
                                          f"{slots_needed} plus 2 for the initial copy: raise it or use larger "
                                          f"batches (--schemas-per-subscription)")
                conninfo = self.publisher_conninfo()
                for k in missing:
                    name, schemas = names[k], [self.schema(n) for n in batches[k]]
                    try:
                        if not q.publication_exists(src, name):
                            q.create_publication(src, name, schemas)
                        if not q.slot_exists(src, name):
                            q.create_slot(src, name)
                        q.create_subscription(tgt, name, conninfo)
                    except psycopg.Error as exc:
                        raise OperationFailed(f"sync: setting up replication {name} from {self.source.name} to "
                                              f"{self.target.name}: {db.first_line(exc)}") from None
                subs = q.subscriptions(tgt, names)
                with tgt.transaction():
                    _set_phase(tgt, self.move, "target", "syncing", {"sub_oids": list(subs.values())})
                with src.transaction():
                    _set_phase(src, self.move, "source", "syncing", {"sub_oids": list(subs.values())})
            expected = len(q.tables(src, self.schemas, "r"))
            self._wait_ready(src, tgt, names, expected)
        seconds = round(time.perf_counter() - t0, 3)
        if self.move.phase != "synced":
            self.both("synced", {"tables": expected, "sync_seconds": seconds})
        self.report["sync_seconds"] = seconds
        self.report["tables"] = expected

    def _wait_ready(self, src: psycopg.Connection, tgt: psycopg.Connection, names: list[str], expected: int) -> None:
        deadline = time.monotonic() + self.options.sync_timeout
        progressed, ready = time.monotonic(), -1
        while True:
            state = q.sync_state(tgt, names)
            lag = q.slot_lag(src, names)
            note = f"lag {_bytes(lag)}" if lag is not None else ""
            errors = state["apply_errors"] + state["sync_errors"]
            if errors:
                note += f", {errors} replication errors (see the target's log)"
            self.progress("sync", state["ready"], expected, note)
            if state["ready"] >= expected and state["tables"] >= expected:
                self.report["lag_bytes"] = lag
                return
            if state["ready"] != ready:
                progressed, ready = time.monotonic(), state["ready"]
            elif errors and time.monotonic() - progressed > 120:
                raise OperationFailed(f"sync: stuck at {ready} of {expected} tables ready for 2 minutes with {errors} "
                                      f"replication errors on {self.target.name} (its server log says why); fix "
                                      f"the cause and run the command again, or abort the move")
            if time.monotonic() > deadline:
                raise OperationFailed(f"sync: {state['ready']} of {expected} tables ready after "
                                      f"{self.options.sync_timeout:g}s ({note or 'no errors reported'}); the "
                                      f"subscriptions keep copying: run the command again to keep waiting")
            time.sleep(0.5)

    # ---- cutover ---------------------------------------------------------------------------
    def cutover(self) -> None:
        phase = self.move.phase
        if phase == "cut_over":
            self.note("cutover: the source was already frozen and renamed; finishing the flip")
            self.report["phases_run"].append("cutover")
            self._finish_cutover()
            return
        if phase in ("syncing", "prepared"):
            self.sync(wait_only=True)
        elif phase != "synced":
            raise OperationFailed(f"move {self.move.move_id} cannot cut over from phase {phase}")
        self.report["phases_run"].append("cutover")
        names = self.move.names
        with self.connect(self.source) as src:
            tables_r = q.tables(src, self.schemas, "r")
            tables_rp = q.tables(src, self.schemas, "rp")
            self._wait_small_lag(src, names)
        last: Exception | None = None
        for attempt in range(1, max(1, self.options.attempts) + 1):
            try:
                self._freeze(tables_r, tables_rp, names)
                break
            except _FreezeTimeout as exc:
                last = exc
                self.note(f"cutover attempt {attempt}: {exc}; writes resumed on {self.source.name}")
                time.sleep(min(5.0, attempt * 1.0))
        else:
            raise OperationFailed(f"cutover: gave up after {self.options.attempts} attempts ({last}); the source "
                                  f"stays authoritative; run the cutover again or raise --max-freeze")
        self._finish_cutover()

    def _wait_small_lag(self, src: psycopg.Connection, names: list[str], limit: int = 4 << 20) -> None:
        """Before freezing, let the subscriptions catch up to a few MB, so the freeze stays short."""
        deadline = time.monotonic() + max(30.0, self.options.max_freeze * 6)
        while True:
            lag = q.slot_lag(src, names)
            if lag is None:
                raise OperationFailed(f"cutover: the move's replication slots are missing on {self.source.name}; "
                                      f"abort the move and start again")
            if lag <= limit or time.monotonic() > deadline:
                return
            self.progress("catch-up", 0, 0, f"lag {_bytes(lag)}")
            time.sleep(0.2)

    def _freeze(self, tables_r: list[tuple[str, str]], tables_rp: list[tuple[str, str]], names: list[str]) -> None:
        """The write freeze: one source transaction that ends with the schemas renamed and guarded."""
        opts, move = self.options, self.move
        src = self.connect(self.source, autocommit=False)
        tgt = self.connect(self.target)
        aux = self.connect(self.source)
        shard_of = {self.schema(n): n for n in move.shards}
        phases_before, detail_before = dict(move.phases), dict(move.detail)
        try:
            limit = f"{max(1, int(opts.max_freeze * 1000))}ms"
            # No statement of the freeze may outlast it; nor may the transaction outlive a stalled run.
            src.execute("SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
                        "set_config('idle_in_transaction_session_timeout', %s, true)",
                        (limit, limit, f"{int(opts.max_freeze * 2000) + 10000}ms"))
            tgt.execute("SELECT set_config('statement_timeout', %s, false)", (limit,))
            started_at = time.time()
            t0 = time.monotonic()
            deadline = t0 + opts.max_freeze
            self.progress("freeze", 0, 0, "locking")
            try:
                for i in range(0, len(tables_rp), 500):
                    src.execute("LOCK TABLE " + ", ".join(f"{quote_ident(s)}.{quote_ident(t)}"
                                                         for s, t in tables_rp[i:i + 500]) + " IN EXCLUSIVE MODE")
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected,
                    psycopg.errors.QueryCanceled) as exc:
                raise _FreezeTimeout(f"could not lock the tables within --max-freeze ({db.first_line(exc)})")
            locked = time.monotonic() - t0
            if time.monotonic() > deadline:
                raise _FreezeTimeout("taking the locks used up --max-freeze")
            lsn = src.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
            # Flush the WAL up to here now (sandbox-style servers run synchronous_commit=off).
            aux.execute("SET synchronous_commit = on")
            aux.execute("SELECT pg_current_xact_id()")
            self.progress("freeze", 0, 0, "waiting for lag 0")
            while not q.replayed(aux, names, lsn):
                if time.monotonic() > deadline:
                    raise _FreezeTimeout(f"the subscriptions did not apply the source's WAL up to {lsn} within "
                                         f"--max-freeze {opts.max_freeze:g}s")
                time.sleep(0.01)
            caught_up = time.monotonic() - t0
            self.progress("freeze", 0, 0, "comparing rows")
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardctl-checksum") as pool:
                on_target = pool.submit(q.checksums, tgt, tables_r)  # both hosts at once
                src_sums = q.checksums(src, tables_r)
                tgt_sums = on_target.result()
            while True:
                diff = [k for k in src_sums if src_sums[k] != tgt_sums.get(k)]
                if not diff:
                    break
                if time.monotonic() > deadline:
                    k = diff[0]
                    raise OperationFailed(
                        f"cutover: {len(diff)} table(s) differ after replication caught up, e.g. {k[0]}.{k[1]}: "
                        f"{src_sums[k][0]} rows on {self.source.name}, {tgt_sums.get(k, (0,))[0]} on "
                        f"{self.target.name}; nothing was switched (the source stays authoritative)")
                time.sleep(0.05)
                tgt_sums = q.checksums(tgt, tables_r)
            compared = time.monotonic() - t0
            seqs = q.sequences(src, self.schemas)
            values = []
            for (schema, name), info in seqs.items():
                if info["last_value"] is None:
                    continue
                values.append((schema, name, min(int(info["last_value"]) + opts.sequence_margin,
                                                 int(info["max_value"]))))
            q.set_sequences(tgt, values)
            source_ms = q.now_ms(src)
            while q.now_ms(tgt) <= source_ms:  # new IDs on the target sort after every ID minted on the source
                if time.monotonic() > deadline:
                    raise _FreezeTimeout("the target's clock is behind the source's by more than --max-freeze")
                time.sleep(0.001)
            grants = q.write_grants(src, self.schemas)
            parts = []
            for schema, table in tables_rp:
                parts.append(q.guard_sql(schema, table, f"shard {shard_of[schema]} moved to {self.target.name} "
                                                        f"(move {move.move_id})"))
            parts.append(q.grant_sql(grants, revoke=True))
            renamed = {}
            for n in move.shards:
                renamed[str(n)] = self.renamed(n)
                parts.append(f"ALTER SCHEMA {quote_ident(self.schema(n))} RENAME TO {quote_ident(renamed[str(n)])};\n")
            src.execute("".join(parts))
            src.execute("UPDATE shardctl.shards AS s SET state = 'moved_out', schema_name = r.name "
                        "FROM unnest(%s::int[], %s::text[]) AS r(id, name) WHERE s.shard_id = r.id",
                        ([int(k) for k in renamed], list(renamed.values())))
            rows = sum(v[0] for v in src_sums.values())
            detail = {"grants": grants, "renamed": renamed, "cutover_at": started_at, "rows": rows,
                      "sequences": len(values), "freeze_lock_seconds": round(locked, 3),
                      "freeze_caught_up_seconds": round(caught_up, 3),
                      "freeze_compared_seconds": round(compared, 3), "freeze_started": started_at}
            _set_phase(src, move, "source", "cut_over", detail)
            if time.monotonic() > deadline + 1.0:
                raise _FreezeTimeout(f"the freeze ran past --max-freeze {opts.max_freeze:g}s before its commit")
            src.commit()
            self.freeze_t0 = t0
            self.report.update({k: v for k, v in detail.items() if k.startswith("freeze_")})
            self.report.update({"freeze_started_at": started_at, "rows": rows, "sequences": len(values),
                                "freeze_commit_seconds": round(time.monotonic() - t0, 3)})
        except psycopg.errors.QueryCanceled as exc:
            move.phases, move.detail = phases_before, detail_before
            if not src.closed and not src.broken:
                src.rollback()
            raise _FreezeTimeout(f"a statement of the freeze ran past --max-freeze ({db.first_line(exc)})") from None
        except BaseException:
            move.phases, move.detail = phases_before, detail_before
            if not src.closed and not src.broken:
                try:
                    src.rollback()
                except psycopg.Error:
                    pass
            raise
        finally:
            for c in (src, tgt, aux):
                c.close()

    def _finish_cutover(self) -> None:
        """After the source committed: target active, topology flipped, replication dropped. Idempotent."""
        move = self.move
        with self.connect(self.target) as tgt, tgt.transaction():
            activated = tgt.execute("UPDATE shardctl.shards SET state = 'active' WHERE shard_id = ANY(%s) "
                                    "AND state = 'moving_in'", (move.shards,)).rowcount
            _set_phase(tgt, move, "target", "cut_over", {k: v for k, v in move.detail.items() if k != "grants"})
        flipped = flip_topology(self.topo.path, move.shards, move.source, move.target,
                                self.options.allow_inline_password)
        self.topo = Topology.load(self.topo.path, allow_inline_password=self.options.allow_inline_password)
        t0 = getattr(self, "freeze_t0", None)
        if t0 is not None:
            freeze = round(time.monotonic() - t0, 3)
            self.report["freeze_seconds"] = freeze
            self.report["freeze_ended_at"] = time.time()
            self.both("cut_over", {"freeze_seconds": freeze})
        self.report["topology_flipped"] = flipped
        self._drop_replication()
        if flipped or activated or t0 is not None:
            self.event("move-shard cutover", {"freeze_seconds": self.report.get("freeze_seconds"),
                                              "rows": self.report.get("rows")})

    def _drop_shards(self, conn: psycopg.Connection, shards: list[int], schema_of: Callable[[int], str],
                     state: str, phase: str, host_name: str) -> None:
        """Drop these shards' schemas and forget their control rows (rows in ``state``), batch by batch."""
        size = max(1, self.options.batch_size)
        self.progress(phase, 0, len(shards), host_name)
        for i in range(0, len(shards), size):
            batch = shards[i:i + size]
            conn.execute("".join(f"DROP SCHEMA IF EXISTS {quote_ident(schema_of(n))} CASCADE;\n" for n in batch))
            conn.execute("DELETE FROM shardctl.migrations WHERE shard_id = ANY(%s)", (batch,))
            conn.execute("DELETE FROM shardctl.shards WHERE shard_id = ANY(%s) AND state = %s", (batch, state))
            conn.commit()
            self.progress(phase, min(len(shards), i + size), len(shards), host_name)

    def _drop_replication(self) -> dict:
        """Subscriptions (target), publications and slots (source) of this move. Idempotent."""
        names = self.move.names  # empty before sync: no replication object was made
        sub_oids = list(self.move.detail.get("sub_oids") or [])
        out: dict[str, list] = {"subscriptions": [], "publications": [], "slots": []}
        try:
            with self.connect(self.target) as tgt:
                existing = q.subscriptions(tgt, names)
                sub_oids += [o for o in existing.values() if o not in sub_oids]
                for name in existing:
                    out["subscriptions"].append(f"{name} ({q.drop_subscription(tgt, name)})")
        except HostUnreachable as exc:
            self.note(f"target {self.target.name} unreachable ({exc.reason}): its subscriptions stay until the "
                      f"command is run again")
        with self.connect(self.source) as src:
            out["publications"] = q.drop_publications(src, names)
            out["slots"] = q.drop_slots(src, names, sub_oids)
        return out

    # ---- cleanup ---------------------------------------------------------------------------
    def cleanup(self) -> None:
        phase = self.move.phase
        if phase == "cleaned":
            self.note("cleanup: already done")
            return
        if phase != "cut_over":
            raise OperationFailed(f"move {self.move.move_id} is in phase {phase}: cleanup drops the source's old "
                                  f"schemas after the cutover; finish the move first, or abort it")
        self.report["phases_run"].append("cleanup")
        self._finish_cutover()  # a cutover interrupted after the source committed completes first
        renamed = self.move.detail.get("renamed") or {str(n): self.renamed(n) for n in self.move.shards}
        shards = self.move.shards
        with self.connect(self.source, autocommit=False) as src:
            self._drop_shards(src, shards, lambda n: renamed[str(n)], "moved_out", "cleanup", self.source.name)
        self._drop_replication()
        self.both("cleaned", {})
        self.event("move-shard cleanup", {})

    # ---- abort -----------------------------------------------------------------------------
    def abort(self) -> None:
        phase = self.move.phase
        if phase == "aborted":
            self.note("abort: already aborted")
            return
        if phase == "cleaned":
            raise OperationFailed(f"move {self.move.move_id} was cleaned up: the source's copies are gone, so it "
                                  f"cannot be rolled back (move the shards back instead)")
        self.report["phases_run"].append("abort")
        if self.move.phases.get("source") == "cut_over" or self.move.detail.get("copy_back"):
            self._abort_after_cutover()
        else:
            self._abort_before_cutover()
        self.event("move-shard abort", {})

    def _abort_before_cutover(self) -> None:
        move = self.move
        owned = [n for n in move.shards if self.topo.host_of(n).name == self.target.name]
        if owned:
            raise OperationFailed(f"the topology gives shards {format_shards(owned)} to {self.target.name} already; "
                                  f"refusing to drop its copies")
        for host, role in ((self.source, "source"), (self.target, "target")):
            if move.phases.get(role):
                with self.connect(host) as conn, conn.transaction():
                    _set_phase(conn, move, role, "aborting", {})
        dropped = self._drop_replication()
        self.report["dropped"] = dropped
        with self.connect(self.target, autocommit=False) as tgt:
            rows = read_shards(tgt)
            mine = [n for n in move.shards if n in rows and rows[n].state == "moving_in"]
            present = q.present_schemas(tgt, self.schemas)
            doomed = [n for n in move.shards if n in mine or (n not in rows and self.schema(n) in present)]
            tgt.commit()
            self._drop_shards(tgt, doomed, self.schema, "moving_in", "abort", self.target.name)
        with self.connect(self.source) as src, src.transaction():
            src.execute("UPDATE shardctl.shards SET state = 'active' WHERE shard_id = ANY(%s) AND state = 'moving_out'",
                        (move.shards,))
            _set_phase(src, move, "source", "aborted", {})
        with self.connect(self.target) as tgt, tgt.transaction():
            if q.moves_table_exists(tgt):
                _set_phase(tgt, move, "target", "aborted", {})

    def _abort_after_cutover(self) -> None:
        """Freeze the target, copy its rows back into the source's renamed-back schemas, flip back.

        Steps, each safe to repeat: (1) target schemas guarded and renamed aside; (2) on the source,
        one transaction renames the old schemas back, drops the guards, restores the write
        privileges, replaces the rows with the target's and checks them; (3) topology flipped back;
        (4) the target's copies dropped.
        """
        move, opts = self.move, self.options
        renamed = move.detail.get("renamed") or {str(n): self.renamed(n) for n in move.shards}
        aside = {str(n): self.renamed(n, "abort") for n in move.shards}
        source_done = move.phases.get("source") != "cut_over"
        t0 = time.monotonic()
        if not source_done:
            with self.connect(self.source) as src, self.connect(self.target) as tgt:
                src_rows, tgt_rows = read_shards(src), read_shards(tgt)
                frozen = set(aside.values()) <= q.present_schemas(tgt, list(aside.values()))
            behind = [n for n in move.shards if n in tgt_rows and n in src_rows and
                      tgt_rows[n].version != src_rows[n].version]
            if behind and not frozen:
                raise OperationFailed(
                    f"migrations ran on {self.target.name} after the cutover (shards {format_shards(behind)} are at "
                    f"V{tgt_rows[behind[0]].version} there, V{src_rows[behind[0]].version} on {self.source.name}): "
                    f"the old copies cannot take the new rows back; move the shards back instead")
            if not frozen:  # 1
                self._guard_and_rename(self.target, {str(n): self.schema(n) for n in move.shards}, aside,
                                       f"moved back to {self.source.name}", "aborting", {"copy_back": True})
            self._copy_back(renamed, aside)  # 2
        flip_topology(self.topo.path, move.shards, move.target, move.source, opts.allow_inline_password)  # 3
        self.topo = Topology.load(self.topo.path, allow_inline_password=opts.allow_inline_password)
        self.report["freeze_seconds"] = round(time.monotonic() - t0, 3)
        self._drop_replication()
        with self.connect(self.target, autocommit=False) as tgt:  # 4
            shards, size = move.shards, max(1, opts.batch_size)
            for i in range(0, len(shards), size):
                batch = shards[i:i + size]
                tgt.execute("".join(f"DROP SCHEMA IF EXISTS {quote_ident(aside[str(n)])} CASCADE;\n" for n in batch))
                tgt.execute("DELETE FROM shardctl.migrations WHERE shard_id = ANY(%s)", (batch,))
                tgt.execute("DELETE FROM shardctl.shards WHERE shard_id = ANY(%s) AND state = 'moved_out'", (batch,))
                tgt.commit()
            _set_phase(tgt, move, "target", "aborted", {})
            tgt.commit()
        with self.connect(self.source) as src, src.transaction():
            _set_phase(src, move, "source", "aborted", {})

    def _copy_back(self, renamed: dict[str, str], aside: dict[str, str]) -> None:
        move, opts = self.move, self.options
        with self.connect(self.source, autocommit=False) as src, self.connect(self.target) as tgt:
            present = q.present_schemas(src, list(renamed.values()))
            parts = [f"ALTER SCHEMA {quote_ident(renamed[str(n)])} RENAME TO {quote_ident(self.schema(n))};\n"
                     for n in move.shards if renamed[str(n)] in present]
            if parts:
                src.execute("".join(parts))
            tables_rp = q.tables(src, self.schemas, "rp")
            tables_r = q.tables(src, self.schemas, "r")
            if tables_rp:
                src.execute("".join(q.unguard_sql(s, t) for s, t in tables_rp))
            grants = q.grant_sql(move.detail.get("grants") or [], revoke=False)
            if grants:
                src.execute(grants)
            back = {self.schema(n): aside[str(n)] for n in move.shards}
            if tables_r:
                src.execute("TRUNCATE " + ", ".join(f"{quote_ident(s)}.{quote_ident(t)}" for s, t in tables_r))
            self.progress("copy back", 0, len(tables_r), self.source.name)
            for i, (schema, table) in enumerate(tables_r, 1):
                name_src = f"{quote_ident(schema)}.{quote_ident(table)}"
                name_tgt = f"{quote_ident(back[schema])}.{quote_ident(table)}"
                with tgt.cursor().copy(f"COPY {name_tgt} TO STDOUT (FORMAT binary)") as out, \
                        src.cursor().copy(f"COPY {name_src} FROM STDIN (FORMAT binary)") as into:
                    for data in out:
                        into.write(data)
                self.progress("copy back", i, len(tables_r), self.source.name)
            src_sums = q.checksums(src, tables_r)
            tgt_sums = q.checksums(tgt, [(back[s], t) for s, t in tables_r])
            diff = [(s, t) for s, t in tables_r if src_sums[(s, t)] != tgt_sums.get((back[s], t))]
            if diff:
                src.rollback()
                raise OperationFailed(f"abort: {len(diff)} table(s) differ after copying back, e.g. "
                                      f"{diff[0][0]}.{diff[0][1]}; the source was left as it was (rolled back)")
            seqs = q.sequences(tgt, list(back.values()))
            back_of = {v: k for k, v in back.items()}
            values = [(back_of[s], name, min(int(i["last_value"]) + opts.sequence_margin, int(i["max_value"])))
                      for (s, name), i in seqs.items() if i["last_value"] is not None]
            q.set_sequences(src, values)
            src.execute("UPDATE shardctl.shards AS s SET state = 'active', schema_name = r.name "
                        "FROM unnest(%s::int[], %s::text[]) AS r(id, name) WHERE s.shard_id = r.id",
                        (move.shards, [self.schema(n) for n in move.shards]))
            _set_phase(src, move, "source", "aborting", {"copy_back": True})
            src.commit()
            self.report["rows"] = sum(v[0] for v in src_sums.values())

    def _guard_and_rename(self, host: Host, current: dict[str, str], new: dict[str, str], message: str,
                          phase: str, detail: dict) -> None:
        """On ``host``: lock, guard and rename the move's schemas in one transaction."""
        role = "source" if host.name == self.move.source else "target"
        with self.connect(host, autocommit=False) as conn:
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(self.options.max_freeze * 1000)}ms",))
            schemas = list(current.values())
            tables_rp = q.tables(conn, schemas, "rp")
            shard_of = {v: k for k, v in current.items()}
            try:
                if tables_rp:
                    conn.execute("LOCK TABLE " + ", ".join(f"{quote_ident(s)}.{quote_ident(t)}" for s, t in tables_rp)
                                 + " IN EXCLUSIVE MODE")
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
                raise OperationFailed(f"could not freeze {host.name} within --max-freeze: {db.first_line(exc)}; "
                                      f"nothing changed, try again") from None
            parts = [q.guard_sql(s, t, f"shard {shard_of[s]} {message} (move {self.move.move_id})")
                     for s, t in tables_rp]
            parts += [f"ALTER SCHEMA {quote_ident(current[k])} RENAME TO {quote_ident(new[k])};\n" for k in current]
            conn.execute("".join(parts))
            conn.execute("UPDATE shardctl.shards AS s SET state = 'moved_out', schema_name = r.name "
                         "FROM unnest(%s::int[], %s::text[]) AS r(id, name) WHERE s.shard_id = r.id",
                         ([int(k) for k in new], list(new.values())))
            _set_phase(conn, self.move, role, phase, detail)
            conn.commit()


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---- the API -------------------------------------------------------------------------------------

def _resolve(topo: Topology, shards: list[int] | None, move_id: str | None, options: MoveOptions,
             active_only: bool = True) -> Move:
    moves, _ = find_moves(topo, connect_timeout=options.connect_timeout)
    candidates = [m for m in moves.values() if m.active or not active_only]
    if move_id:
        found = moves.get(move_id)
        if found is None:
            raise BadInput(f"no move {move_id} is recorded on any host (see move-shard --status)")
        return found
    if shards is not None:
        overlapping = [m for m in candidates if set(m.shards) & set(shards)]
        exact = [m for m in overlapping if set(m.shards) == set(shards)]
        if exact:
            return exact[0]
        if len(overlapping) == 1:
            return overlapping[0]
        if overlapping:
            raise BadInput(f"shards {format_shards(shards)} overlap several moves "
                           f"({', '.join(m.move_id for m in overlapping)}): name one with --move")
        raise BadInput(f"no move in progress holds shards {format_shards(shards)} (see move-shard --status)")
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise BadInput("no move is in progress")
    raise BadInput(f"{len(candidates)} moves are in progress ({', '.join(m.move_id for m in candidates)}): "
                   f"give the shard range or --move")


def _check_shards(topo: Topology, shards: list[int]) -> None:
    beyond = [n for n in shards if n >= topo.shard_count]
    if beyond:
        raise BadInput(f"shards {format_shards(beyond)} are not in this topology (0..{topo.shard_count - 1})")


def move_shards(topo: Topology, shards: list[int], target: str, *, phases: list[str] | None = None,
                options: MoveOptions | None = None, progress: Progress | None = None) -> dict:
    """Run the move's phases (default prepare, sync, cutover), starting or resuming the move of ``shards``
    to host ``target``. Returns the report (``freeze_seconds``, ``sync_seconds``, …)."""
    options = options or MoveOptions()
    phases = list(phases or PHASE_NAMES)
    unknown = [p for p in phases if p not in PHASE_NAMES]
    if unknown:
        raise BadInput(f"unknown phase {unknown[0]!r} (phases: {', '.join(PHASE_NAMES)})")
    if not shards:
        raise BadInput("no shards to move")
    _check_shards(topo, shards)
    target_host = topo.host(target)
    moves, _ = find_moves(topo, connect_timeout=options.connect_timeout)
    overlapping = [m for m in moves.values() if m.active and set(m.shards) & set(shards)]
    exact = [m for m in overlapping if set(m.shards) == set(shards) and m.target == target]
    if exact:
        move = exact[0]
        if move.phase == "aborting":
            raise OperationFailed(f"move {move.move_id} is being aborted: run move-shard --abort again to finish")
    elif overlapping:
        m = overlapping[0]
        raise OperationFailed(f"shards {format_shards(sorted(set(m.shards) & set(shards)))} are part of move "
                              f"{m.move_id} ({format_shards(m.shards)} from {m.source} to {m.target}, phase "
                              f"{m.phase}): finish it (or --abort it) first")
    else:
        owners = sorted({topo.host_of(n).name for n in shards})
        if owners == [target]:
            return {"command": "move-shard", "shards": format_shards(shards), "target": target, "phases_run": [],
                    "phase": "nothing to do", "messages": [f"shards {format_shards(shards)} are on {target} already"],
                    "seconds": 0.0}
        if len(owners) > 1:
            raise BadInput(f"shards {format_shards(shards)} live on {', '.join(owners)}: move the shards of one "
                           f"source host at a time")
        if phases[0] != "prepare":
            raise OperationFailed(f"no move of shards {format_shards(shards)} to {target} has been prepared: run "
                                  f"the prepare phase first")
        move = Move(new_move_id(), sorted(shards), owners[0], target_host.name)
    run = MoveRun(topo, move, options, progress)
    with shard_locks([run.source, run.target], move.shards, options):
        # Re-read under the locks: another run may have advanced the move meanwhile.
        if move.phases:
            fresh, _ = find_moves(topo, [run.source, run.target], options.connect_timeout,
                                  required=(run.source.name, run.target.name))
            if move.move_id in fresh:
                run.move = move = fresh[move.move_id]
        for phase in phases:
            try:
                _guarded(getattr(run, phase), phase)
            except ShardctlError as exc:
                if run.move.phases and run.move.phase not in FINISHED and exc.args:
                    exc.args = (f"{exc.args[0]} [move {move.move_id} is in phase {run.move.phase}: run the command "
                                f"again to resume, or roll it back with move-shard --abort]",) + exc.args[1:]
                raise
    return _finish_report(run)


def _finish_report(run: MoveRun) -> dict:
    run.report.update({"command": "move-shard", "phase": run.move.phase, "seconds":
                       round(time.perf_counter() - run.started, 3)})
    return run.report


def _locked(topo: Topology, shards: list[int] | None, move_id: str | None, options: MoveOptions,
            progress: Progress | None, action: str) -> dict:
    move = _resolve(topo, shards, move_id, options, active_only=True)
    run = MoveRun(topo, move, options, progress)
    with shard_locks([run.source, run.target], move.shards, options):
        fresh, _ = find_moves(topo, [run.source, run.target], options.connect_timeout,
                              required=(run.source.name, run.target.name))
        run.move = fresh.get(move.move_id, move)
        _guarded(getattr(run, action), action)
    return _finish_report(run)


def _guarded(step: Callable[[], None], name: str) -> None:
    """Run a phase; a database error nobody expected becomes a one-line, masked OperationFailed."""
    try:
        step()
    except psycopg.Error as exc:
        raise OperationFailed(f"{name}: {db.first_line(exc)}") from exc


def abort_move(topo: Topology, *, shards: list[int] | None = None, move_id: str | None = None,
               options: MoveOptions | None = None, progress: Progress | None = None) -> dict:
    """Roll a move back (any time before cleanup): the source is authoritative again."""
    return _locked(topo, shards, move_id, options or MoveOptions(), progress, "abort")


def cleanup_move(topo: Topology, *, shards: list[int] | None = None, move_id: str | None = None,
                 options: MoveOptions | None = None, progress: Progress | None = None) -> dict:
    """Drop the renamed source schemas (and any replication object) of a cut-over move."""
    return _locked(topo, shards, move_id, options or MoveOptions(), progress, "cleanup")


def move_status(topo: Topology, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
                include_finished: bool = True) -> dict:
    """Every recorded move, with live sync progress and lag for moves in flight."""
    started = time.perf_counter()
    moves, errors = find_moves(topo, connect_timeout=connect_timeout)
    out = []
    for move in sorted(moves.values(), key=lambda m: str(m.started_at)):
        if not include_finished and not move.active:
            continue
        doc = move.to_dict()
        if move.phase in ("syncing", "synced") and move.names:
            try:
                with db.connect(topo.host(move.target), autocommit=True, connect_timeout=connect_timeout,
                                purpose="move-shard status") as conn:
                    state = q.sync_state(conn, move.names)
                doc.update(tables_ready=state["ready"], tables=state["tables"],
                           replication_errors=state["apply_errors"] + state["sync_errors"])
                with db.connect(topo.host(move.source), autocommit=True, connect_timeout=connect_timeout,
                                purpose="move-shard status") as conn:
                    doc["lag_bytes"] = q.slot_lag(conn, move.names)
            except (HostUnreachable, psycopg.Error, BadInput) as exc:
                doc["error"] = getattr(exc, "reason", None) or db.first_line(exc)
        out.append(doc)
    return {"command": "move-shard --status", "moves": out,
            "in_flight": sum(1 for m in moves.values() if m.active),
            "unreachable": errors, "seconds": round(time.perf_counter() - started, 3)}


def parse_range(spec: str, topo: Topology) -> list[int]:
    try:
        return parse_shards(spec, limit=topo.shard_count)
    except ValueError as exc:
        raise BadInput(f"shard range {spec!r}: {exc}") from None


__all__ = ["MoveOptions", "Move", "move_shards", "abort_move", "cleanup_move", "move_status", "find_moves",
           "flip_topology", "MOVE_LOCK_CLASS", "parse_range"]
