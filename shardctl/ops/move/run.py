"""What every phase of a move shares: the move's record on its hosts, the per-shard locks, and
``MoveRun`` (one invocation: topology, options, progress, report) with the steps several phases use."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

from ...engine import connections as db
from ...engine.executor import ShardPlan
from ...engine.fanout import MIN_SHARDS_PER_STREAM, host_jobs, run_streams
from ...engine.ledger import log_event
from ...errors import BadInput, HostUnreachable, LockBusy, OperationFailed
from ...model.documents import result_doc
from ...model.dsn import CLIENT_FILE_KEYWORDS, remember_secret
from ...model.identifiers import MAX_IDENTIFIER_BYTES
from ...model.ranges import format_shards, parse_shards
from ...model.topology import Host, Topology
from ...sql.catalog import control, replication, stubs
from . import transfer
from .report import MoveReport
from .state import FINISHED, Phase, ShardState, check_transition, combined_phase

# pg_advisory_lock(classid, objid) = ('SM', shard): "this shard is being moved" (session-level).
MOVE_LOCK_CLASS = 0x534D
Progress = Callable[[str, int, int, str], None]
MIN_SERVER_VERSION = 150000  # FOR TABLES IN SCHEMA, pg_stat_subscription_stats


@dataclass
class MoveOptions:
    max_freeze: float = 5.0  # seconds writes may wait at cutover before it gives up (and retries)
    sequence_margin: int = 1024  # added to each source sequence's value on the target
    schemas_per_subscription: int = 64
    max_subscriptions: int = 4  # more schemas per publication rather than more subscriptions
    sync_timeout: float = 3600.0
    attempts: int = 3  # cutover freezes tried before giving up
    wait: float = 0.0  # seconds to wait for another run's locks
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
    batch_size: int = 16  # shards per transaction when creating or dropping schemas
    # how the target reaches the source, if not by the topology DSN
    publisher_dsn: str | None = None
    copy_workers: int = 4  # parallel table copies of the initial copy (0: the subscription copies)
    # the check before the freeze: "counts" (row counts) or "full" (checksums)
    verify_before: str = "counts"
    nice: float = 0.0  # seconds of rest per second of bulk work (copy, checks): see Pacer
    allow_inline_password: bool = False


# What a move's record keeps in its ``detail`` that its document shows
_REPORTED_DETAIL = ("freeze_seconds", "sync_seconds", "tables", "cutover_at", "sequences", "rows")


@dataclass
class Move:
    """A move as recorded on its hosts (``phases``: role → recorded phase)."""

    move_id: str
    shards: list[int]
    source: str
    target: str
    phases: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    started_at: Any = None
    updated_at: Any = None

    @property
    def phase(self) -> Phase:
        return combined_phase(self.phases.get("source"), self.phases.get("target"))

    @property
    def active(self) -> bool:
        return self.phase not in FINISHED

    @property
    def names(self) -> list[str]:
        """Publication = slot = subscription name per batch."""
        return [
            f"shardctl_{self.move_id}_{k}" for k in range(len(self.detail.get("batches") or []))
        ]

    def to_dict(self) -> dict:
        return {
            **result_doc(
                self,
                omit=("detail",),
                shards=format_shards(self.shards),
                shard_count=len(self.shards),
                phase=str(self.phase),
                phases=dict(self.phases),
            ),
            **{k: v for k, v in self.detail.items() if k in _REPORTED_DETAIL},
        }


def new_move_id() -> str:
    return "mv" + secrets.token_hex(4)


def renamed_schema(schema: str, shard: int, move_id: str, kind: str = "moved") -> str:
    name = f"{schema}_{kind}_{move_id}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    return f"shardctl_{kind}_{move_id}_{shard}"


# The test suite's fault injection: checkpoint name -> what to do there. Empty unless a test installs a
# hook (tests/support/crash_at.py kills the process at one), so a shipped move never acts on it.
HOOKS: dict[str, Callable[[], None]] = {}


def checkpoint(name: str) -> None:
    """A point of the move where a crash must leave a state one re-run finishes: runs the hook a test
    installed in ``HOOKS`` for ``name``, if any."""
    hook = HOOKS.get(name)
    if hook is not None:
        hook()


# ---- records -----------------------------------------------------------------------------


def merge_records(records: list[tuple], moves: dict[str, Move]) -> None:
    for move_id, shards, source, target, role, phase, detail, started, updated in records:
        move = moves.get(move_id)
        if move is None:
            move = moves[move_id] = Move(
                move_id,
                parse_shards(shards),
                source,
                target,
                started_at=started,
                updated_at=updated,
            )
        move.phases[role] = phase
        # The source's record is authoritative for the cutover; merge the rest.
        if role == "source":
            move.detail = {**move.detail, **(detail or {})}
        else:
            move.detail = {**(detail or {}), **move.detail}
        move.updated_at = max(filter(None, [move.updated_at, updated]), default=None)


def find_moves(
    topo: Topology,
    hosts: list[Host] | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    required: tuple[str, ...] = (),
) -> tuple[dict[str, Move], dict[str, str]]:
    """Every move recorded on ``hosts`` (default: all), and the hosts that could not be read.
    Hosts named in ``required`` must answer."""
    moves: dict[str, Move] = {}
    errors: dict[str, str] = {}
    for host in hosts or topo.hosts:
        try:
            with db.connect(
                host, autocommit=True, connect_timeout=connect_timeout, purpose="move-shard"
            ) as conn:
                merge_records(control.move_records(conn), moves)
        except HostUnreachable as exc:
            if host.name in required:
                raise
            errors[host.name] = exc.reason
        except psycopg.Error as exc:
            if host.name in required:
                raise OperationFailed(
                    f"host {host.name}: cannot read moves: {db.first_line(exc)}"
                ) from None
            errors[host.name] = db.first_line(exc)
    return moves, errors


def set_phase(
    conn: psycopg.Connection, move: Move, role: str, phase: Phase, detail: dict | None = None
) -> None:
    """Insert or update this host's record of the move (in the caller's transaction, if any)."""
    check_transition(role, move.phases.get(role), phase)
    control.record_move(
        conn,
        move.move_id,
        format_shards(move.shards),
        move.source,
        move.target,
        role,
        phase,
        detail if detail is not None else move.detail,
        list(FINISHED),
    )
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
            conn = db.connect(
                host,
                autocommit=True,
                connect_timeout=options.connect_timeout,
                purpose="move-shard lock",
            )
            conns.append(conn)
            db.require_direct(host, conn, options.connect_timeout)
            who = db.take_locks(
                conn, MOVE_LOCK_CLASS, shards, time.monotonic() + max(0.0, options.wait)
            )
            if who is not None:
                raise LockBusy(
                    f"host {host.name}: another shardctl run is moving some of shards "
                    f"{format_shards(shards)} ({who}); waited {options.wait:g}s (use --wait)"
                )
        yield
    finally:
        for conn in conns:
            db.close_releasing(conn)  # the next run may start at once


# ---- the run ---------------------------------------------------------------------------------


class Pacer:
    """``--nice``: after each second of bulk work on a connection (the copy, the checks), rest ``ratio``
    seconds, so the move keeps each of its connections busy at most 1/(1 + ratio) of the time and the
    hosts' CPU goes to the application's queries meanwhile (gh-ost's --nice-ratio). One per worker
    thread; the work calls :meth:`rest` between units (a MB copied, a few tables checked)."""

    def __init__(self, ratio: float, stop: threading.Event | None = None):
        """``stop``: an event that cuts a rest short (the caller then stops its work)."""
        self.ratio = ratio
        self.resumed = time.monotonic()
        self.rested = 0.0
        self.stop = stop

    def rest(self) -> None:
        pause = self.ratio * (time.monotonic() - self.resumed)
        if pause > 0:
            if self.stop is not None:
                self.stop.wait(pause)
            else:
                time.sleep(pause)
            self.rested += pause
        self.resumed = time.monotonic()


class MoveRun:
    """One invocation on one move: the topology, options, progress, the report, and what the
    phases hand to each other (the source's ledger and the creation plans, the freeze's start)."""

    def __init__(self, topo: Topology, move: Move, options: MoveOptions, progress: Progress | None):
        if topo.path is None:
            raise BadInput(
                "move-shard needs a topology loaded from a file (it rewrites the file at cutover)"
            )
        self.topo = topo
        self.move = move
        self.options = options
        self.progress: Progress = progress or (lambda step, done, total, note: None)
        self.source = topo.host(move.source)
        self.target = topo.host(move.target)
        self.report = MoveReport(
            move_id=move.move_id,
            shards=format_shards(move.shards),
            shard_count=len(move.shards),
            source=move.source,
            target=move.target,
        )
        self.started = time.perf_counter()
        self.ledger: dict[int, list[tuple]] = {}  # source's ledger rows per shard (prepare)
        self.plans: list[ShardPlan] = []  # what prepare creates on the target
        self.freeze_t0: float | None = None  # monotonic start of this run's committed freeze
        self.pacers: list[Pacer] = []  # --nice: one per worker of the bulk work

    # ---- helpers ---------------------------------------------------------------------------
    def pause(self) -> Callable[[], None] | None:
        """A new worker's pause between units of bulk work (a fresh :class:`Pacer`), or None without ``--nice``."""
        if self.options.nice <= 0:
            return None
        pacer = Pacer(self.options.nice)
        self.pacers.append(pacer)
        return pacer.rest

    def rested(self) -> float:
        """Seconds the workers have rested so far (``--nice``), summed over them."""
        return round(sum(p.rested for p in self.pacers), 3)

    def progress_factory(self, step: str) -> Callable[[str, int], Callable[[int], None]]:
        """A fan-out progress factory (host name, total → tick(n)) reporting as ``step`` of this move."""

        def factory(host_name: str, total: int) -> Callable[[int], None]:
            done = 0

            def tick(n: int) -> None:
                nonlocal done
                done += n
                self.progress(step, done, total, host_name)

            return tick

        return factory

    def note(self, message: str) -> None:
        self.report.messages.append(message)
        self.progress("note", 0, 0, message)

    def connect(self, host: Host, autocommit: bool = True) -> psycopg.Connection:
        return db.connect(
            host,
            autocommit=autocommit,
            connect_timeout=self.options.connect_timeout,
            purpose="move-shard",
        )

    def host_lock(self, host: Host) -> AbstractContextManager[psycopg.Connection]:
        """The host's shardctl lock for this move (waiting up to ``--wait``), on a connection of its own."""
        return db.host_lock(
            host,
            wait=self.options.wait,
            connect_timeout=self.options.connect_timeout,
            purpose="move-shard",
        )

    def schema(self, shard: int) -> str:
        return self.topo.schema_name(shard)

    @property
    def schemas(self) -> list[str]:
        return [self.schema(n) for n in self.move.shards]

    def renamed(self, shard: int, kind: str = "moved") -> str:
        return renamed_schema(self.schema(shard), shard, self.move.move_id, kind)

    def renamed_map(self) -> dict[str, str]:
        """Shard (as text) → the source's renamed schema, as recorded at the cutover."""
        return self.move.detail.get("renamed") or {
            str(n): self.renamed(n) for n in self.move.shards
        }

    def both(self, phase: Phase, detail: dict | None = None) -> None:
        """Record a phase on the source, then the target."""
        for host, role in ((self.source, "source"), (self.target, "target")):
            with self.connect(host) as conn, conn.transaction():
                set_phase(conn, self.move, role, phase, detail)

    def event(self, kind: str, detail: dict) -> None:
        for host in (self.source, self.target):
            try:
                with self.connect(host) as conn:
                    log_event(
                        conn, kind, self.move.shards, {"move_id": self.move.move_id, **detail}
                    )
            except (HostUnreachable, psycopg.Error):
                pass

    def publisher_conninfo(self) -> str:
        """The connection string the target's subscription uses to reach the source (its server opens it).

        ``--publisher-dsn`` and the source's ``peer_dsn`` are written for the target server's side and go
        as they are. Without them, the source's ``admin_dsn`` (or ``dsn``) is shardctl's own: its settings
        that name the client's files (``sslrootcert``, ``sslcert``, ``sslkey``, ``passfile``…) are left
        out, so the server's libpq uses its own (for ``sslmode=verify-full``, ``~/.postgresql/root.crt``
        of the server's OS user); everything else, ``sslmode`` included, stays."""
        return peer_conninfo(self.source, self.options.publisher_dsn)

    # ---- steps several phases share ------------------------------------------------------------
    def drop_shards(
        self,
        conn: psycopg.Connection,
        shards: list[int],
        schema_of: Callable[[int], str],
        state: ShardState,
        step: str,
        host_name: str,
        parallel: bool = False,
    ) -> None:
        """Drop these shards' schemas and forget their control rows (rows in ``state``), batch by batch,
        each batch one transaction (a re-run drops what is left: every statement is idempotent).

        ``parallel``: with many shards, drop in the host's parallel streams (``fanout.host_jobs``, as init
        creates), each on a connection of its own; otherwise on ``conn``."""
        size = max(1, self.options.batch_size)
        batches = [shards[i : i + size] for i in range(0, len(shards), size)]
        streams = 1
        if parallel and len(shards) >= 2 * MIN_SHARDS_PER_STREAM:
            streams = max(
                1,
                min(
                    host_jobs(self.topo.host(host_name), conn).count,
                    len(batches),
                    len(shards) // MIN_SHARDS_PER_STREAM,
                ),
            )
            conn.commit()  # host_jobs read the server's facts in a transaction of its own
        setattr(self.report, f"{step}_drop_streams", streams)  # prepare, abort or cleanup
        lock, done, stop = threading.Lock(), [0], threading.Event()
        self.progress(step, 0, len(shards), host_name)

        def drop(c: psycopg.Connection, batch: list[int]) -> None:
            control.drop_shard_schemas(c, [schema_of(n) for n in batch], batch, state)
            c.commit()
            with lock:
                done[0] += len(batch)
                self.progress(step, done[0], len(shards), host_name)

        if streams == 1:
            for batch in batches:
                drop(conn, batch)
            return

        def stream(k: int) -> None:
            with self.connect(self.topo.host(host_name), autocommit=False) as c:
                for batch in batches[k::streams]:
                    if stop.is_set():
                        return
                    drop(c, batch)

        errors = run_streams(host_name, streams, stream, stop)
        if errors:
            raise errors[0]

    def drop_replication(self) -> dict:
        """Subscriptions (target), publications and slots (source) of this move. Idempotent."""
        names = self.move.names  # empty before sync: no replication object was made
        sub_oids = list(self.move.detail.get("sub_oids") or [])
        out: dict[str, list] = {"subscriptions": [], "publications": [], "slots": []}
        try:
            with self.connect(self.target) as tgt:
                existing = replication.subscriptions(tgt, names)
                sub_oids += [o for o in existing.values() if o not in sub_oids]
                for name in existing:
                    out["subscriptions"].append(
                        f"{name} ({replication.drop_subscription(tgt, name)})"
                    )
        except HostUnreachable as exc:
            self.note(
                f"target {self.target.name} unreachable ({exc.reason}): its subscriptions stay until the "
                f"command is run again"
            )
        with self.connect(self.source) as src:
            out["publications"] = replication.drop_publications(src, names)
            out["slots"] = transfer.drop_slots(src, names, sub_oids)
        return out

    def retire(
        self,
        conn: psycopg.Connection,
        tables_rp: list[tuple[str, str]],
        current: dict[str, str],
        new: dict[str, str],
        message: str,
        grants: list[list[str]],
    ) -> None:
        """Guard every table, revoke ``grants`` and rename the schemas ``current`` → ``new`` (shard as text →
        schema), and mark the shards ``moved_out``: the statements that retire a copy, for one transaction."""
        shard_of = {v: k for k, v in current.items()}
        parts = [
            stubs.guard_sql(s, t, f"shard {shard_of[s]} {message} (move {self.move.move_id})")
            for s, t in tables_rp
        ]
        parts.append(stubs.grant_sql(grants, revoke=True))
        parts.append(stubs.rename_schemas_sql({current[k]: new[k] for k in current}))
        conn.execute("".join(parts))
        control.set_shard_states(
            conn, [int(k) for k in new], ShardState.MOVED_OUT, list(new.values())
        )


def require_version(host: Host, facts: dict, role: str) -> None:
    """Moving shards needs PostgreSQL 15 or later on both hosts."""
    if facts["version_num"] < MIN_SERVER_VERSION:
        raise OperationFailed(
            f"host {host.name} runs PostgreSQL {facts['version_num']}: {role} shards needs 15 or "
            f"later (FOR TABLES IN SCHEMA)"
        )


def check_target_free(
    host: Host, shards: list[int], rows: dict, present: set[str], mine: bool
) -> None:
    """The target must record none of the shards (but this move's own ``moving_in`` ones), and, for a new
    move, hold none of their schemas."""
    taken = [n for n in shards if n in rows and (rows[n].state != ShardState.MOVING_IN or not mine)]
    if taken:
        raise OperationFailed(
            f"host {host.name} already records shards {format_shards(taken)} "
            f"({', '.join(sorted({rows[n].state for n in taken}))}); clean up or abort "
            f"the move that left them"
        )
    if present and not mine:
        found = sorted(present)
        raise OperationFailed(
            f"host {host.name} already has schemas {', '.join(found[:5])}"
            f"{' …' if len(found) > 5 else ''}; refusing to overwrite them"
        )


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def peer_conninfo(host: Host, given: str | None = None) -> str:
    """How another server reaches ``host`` (a subscription's CONNECTION): ``given`` or the host's
    ``peer_dsn`` as they are, else shardctl's DSN without the client's files (``server_side``); with
    the password shardctl connects with (``password_env``, else ``PGPASSWORD``) unless it names
    one: a subscription owned by a non-superuser must carry it (``password_required``)."""
    kwargs = host.connect_kwargs(purpose="peer")
    dsn = str(kwargs.pop("conninfo"))
    if given:
        dsn = given
    elif not host.peer_dsn:
        dsn = server_side(dsn)
    password = kwargs.get("password") or os.environ.get("PGPASSWORD")
    if not password or "password" in pg_conninfo.conninfo_to_dict(dsn):
        return dsn
    remember_secret(str(password))
    return pg_conninfo.make_conninfo(dsn, password=password)


def server_side(dsn: str) -> str:
    """``dsn`` without the settings that name the client's own files (dsn.CLIENT_FILE_KEYWORDS); the same
    string when it has none. ``sslrootcert=system`` names no file and stays."""
    parts = pg_conninfo.conninfo_to_dict(dsn)
    drop = [
        k
        for k in CLIENT_FILE_KEYWORDS
        if k in parts and not (k == "sslrootcert" and parts[k] == "system")
    ]
    if not drop:
        return dsn
    for key in drop:
        del parts[key]
    return pg_conninfo.make_conninfo("", **parts)
