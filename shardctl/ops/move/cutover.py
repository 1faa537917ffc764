"""Cutover: the write freeze and the switch, with the data verified outside the freeze.

Before the freeze (writes go on): wait until the subscriptions' lag is small, and compare each
table's row count (``--verify-before full``: its checksum) on both hosts at moments of lag 0,
re-checking the tables that differed (they were being written); a table that differs while
unchanged fails the move here, with the source still authoritative.

The freeze, whose length does not depend on the data: one transaction on the source,
``LOCK TABLE … IN EXCLUSIVE MODE`` on every table (writes wait, reads go on), wait until the
subscriptions have applied the source's WAL up to that point, take a read-only snapshot on the
target (it now holds exactly the source's rows), set every target sequence from the source
sequence plus a margin, wait until the target's clock is past the source's, then a guard
trigger on every table (SQLSTATE ``SCM01``, "shard N moved to HOST"), writes revoked, schemas
renamed to ``{schema}_moved_{move id}``, shard rows ``moved_out``, a redirect recorded, and a stub put
under each old schema name (views whose reads and writes raise ``SCM01`` naming the new host, for direct
clients; made before the freeze under ``{schema}_stub_{move id}``, only renamed in it; ``--cleanup``
and ``--abort`` drop it); commit. Every statement is
bounded by what is left of ``--max-freeze``, so no attempt, failed or not, holds writes longer.

Then the target's rows become ``active``, the topology file is flipped, the subscriptions,
publications and slots are dropped, and every row of the now read-only source is compared with
the target's snapshot. A difference fails the command loudly (the target is authoritative;
``--abort`` goes back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg

from ...engine import connections as db
from ...engine.fanout import host_jobs, run_streams
from ...errors import FreezeTimeout, OperationFailed, WaitTimeout
from ...model.dsn import mask
from ...model.topology import Topology
from ...model.topology_file import flip_topology
from ...sql import session
from ...sql.catalog import control, data, inspect, replication, stubs
from . import transfer
from .run import MoveRun, checkpoint, human_bytes, set_phase
from .state import Phase, ShardState
from .sync import sync

LOCKS_PER_STATEMENT = 500
MAX_CHECK_STREAMS = 4  # parallel checksum streams per host before the freeze
CATCH_UP_BYTES = 4 << 20  # before freezing, the subscriptions' lag must be below this


def cutover(run: MoveRun) -> None:
    """The cutover phase: freeze (retried up to --attempts times), then finish the switch."""
    phase = run.move.phase
    if phase == Phase.CUT_OVER:
        run.note("cutover: the source was already frozen and renamed; finishing the flip")
        run.report.phases_run.append("cutover")
        finish_cutover(run)
        return
    if phase in (Phase.SYNCING, Phase.PREPARED):
        sync(run, wait_only=True)
    elif phase != Phase.SYNCED:
        raise OperationFailed(f"move {run.move.move_id} cannot cut over from phase {phase}")
    run.report.phases_run.append("cutover")
    names = run.move.names
    with run.connect(run.source) as src, run.connect(run.target) as tgt:
        # a move prepared by an older shardctl may lack the redirects table
        control.ensure_move_objects(src)
        control.ensure_move_objects(tgt)
        tables_r = inspect.tables(src, run.schemas, "r")
        tables_rp = inspect.tables(src, run.schemas, "rp")
        # The stubs for direct clients are made now, under other names; the freeze only renames them.
        stubs.create_moved_stubs(
            src, {stub_name(run, n): (run.schema(n), stub_message(run, n)) for n in run.move.shards}
        )
    verify_before(run, tables_r)
    last: Exception | None = None
    for attempt in range(1, max(1, run.options.attempts) + 1):
        with run.connect(run.source) as src:
            _wait_small_lag(run, src, names)  # never start a freeze the subscriptions cannot finish
        freeze = Freeze(run, tables_r, tables_rp)
        try:
            freeze.attempt()
            break
        except FreezeTimeout as exc:
            last = exc
            run.note(f"cutover attempt {attempt}: {exc}; writes resumed on {run.source.name}")
            if attempt < run.options.attempts:  # a pause before the next try, none after the last
                time.sleep(min(5.0, attempt * 1.0))
    else:
        raise OperationFailed(
            f"cutover: gave up after {run.options.attempts} attempts ({last}); the source "
            f"stays authoritative; run the cutover again or raise --max-freeze"
        )
    try:
        finish_cutover(run)
        verify_after(run, freeze.snapshot, tables_r)
    finally:
        freeze.close_snapshot()


def _wait_small_lag(
    run: MoveRun, src: psycopg.Connection, names: list[str], limit: int = CATCH_UP_BYTES
) -> None:
    """Before freezing, let the subscriptions catch up to a few MB, so the freeze can finish in time;
    refuse to freeze while they cannot."""
    lag: int | None = None

    def caught_up() -> bool:
        nonlocal lag
        lag = replication.slot_lag(src, names)
        if lag is None:
            raise OperationFailed(
                f"cutover: the move's replication slots are missing on {run.source.name}; "
                f"abort the move and start again"
            )
        if lag > limit:
            run.progress("catch-up", 0, 0, f"lag {human_bytes(lag)}")
        return lag <= limit

    transfer.wait_for(
        caught_up,
        time.monotonic() + max(30.0, run.options.max_freeze * 6),
        lambda: WaitTimeout(
            f"cutover: the subscriptions stay {human_bytes(lag or 0)} behind {run.source.name} "
            f"(more than {human_bytes(limit)}): a freeze now could not finish within "
            f"--max-freeze; nothing was frozen, try again when the write load is lower"
        ),
    )


def _sums_at_lag_zero(
    run: MoveRun,
    src: psycopg.Connection,
    tgt: psycopg.Connection,
    items: list[tuple[str, str]],
    rows_only: bool,
    timeout: float = 20.0,
) -> tuple[dict, dict]:
    """Checksums of ``items``: on the source first (one snapshot), then on the target once it has applied
    the source's WAL up to past that snapshot. The target then holds at least the source's rows: with
    no write meanwhile, exactly them."""
    pause = run.pause()

    def timed_out(lsn: str) -> WaitTimeout:
        why = (
            "; ".join(replication.subscription_problems(tgt, run.move.names))
            or "no problem reported by the target"
        )
        return WaitTimeout(
            f"cutover: the subscriptions did not apply {run.source.name}'s WAL up to {lsn} "
            f"within {timeout:g}s ({why}); nothing was frozen"
        )

    return transfer.at_lag_zero(
        src,
        run.move.names,
        lambda conn: transfer.checksums(conn, items, rows_only=rows_only, pause=pause),
        lambda: transfer.checksums(tgt, items, rows_only=rows_only, pause=pause),
        timeout,
        timed_out,
    )


def _sums_in_streams(
    run: MoveRun, items: list[tuple[str, str]], streams: int, rows_only: bool
) -> tuple[dict, dict]:
    """:func:`_sums_at_lag_zero` over ``items`` split into ``streams`` parts, each on a connection pair of
    its own (the hosts hash in parallel; each part is consistent on its own, which is all a table needs)."""
    parts = [p for p in (items[k::streams] for k in range(streams)) if p]
    src_all: dict = {}
    tgt_all: dict = {}
    lock = threading.Lock()

    def work(k: int) -> None:
        with run.connect(run.source) as src, run.connect(run.target) as tgt:
            src_sums, tgt_sums = _sums_at_lag_zero(run, src, tgt, parts[k], rows_only)
        with lock:
            src_all.update(src_sums)
            tgt_all.update(tgt_sums)

    errors = (
        run_streams(f"{run.source.name}-check", len(parts), work, threading.Event())
        if parts
        else []
    )
    if errors:
        raise errors[0]
    return src_all, tgt_all


def verify_before(run: MoveRun, tables_r: list[tuple[str, str]]) -> None:
    """Compare every table on both hosts before the freeze (writes go on): by row counts
    (``--verify-before counts``, the default: every row is compared after the cutover anyway, and
    hashing every row twice would take the CPU the application's writes need) or by checksums
    (``full``). A table that differs is checked again while its source stays unchanged (the same count,
    or checksum): one that differs in two more rounds so fails the move now. A table whose source
    changed meanwhile is being written: the check after the cutover compares it."""
    t0 = time.perf_counter()
    pending, previous, unchanged_rounds, busy = list(tables_r), {}, {}, 0
    rows_only = run.options.verify_before == "counts"
    with run.connect(run.source) as src, run.connect(run.target) as tgt:
        streams = max(
            1,
            min(
                MAX_CHECK_STREAMS,
                host_jobs(run.source, src).count,
                host_jobs(run.target, tgt).count,
            ),
        )
        for round_no in range(3):
            run.progress("verify", len(tables_r) - len(pending), len(tables_r), "before the freeze")
            src_sums, tgt_sums = _sums_in_streams(run, pending, streams, rows_only)
            differ = [k for k in pending if src_sums[k] != tgt_sums.get(k)]
            if round_no:
                unchanged = [k for k in differ if previous[k] == src_sums[k]]
                busy += len(differ) - len(unchanged)
                differ = unchanged
                unchanged_rounds = {k: unchanged_rounds.get(k, 0) + 1 for k in differ}
            stuck = [k for k, n in unchanged_rounds.items() if n >= 2]
            if stuck:
                k = stuck[0]
                raise OperationFailed(
                    f"cutover: {len(stuck)} table(s) differ between the hosts though unchanged on the source, e.g. "
                    f"{k[0]}.{k[1]}: {src_sums[k][0]} rows on {run.source.name}, {tgt_sums.get(k, (0,))[0]} on "
                    f"{run.target.name}; nothing was switched (abort the move and look at the target's log)"
                )
            previous = {k: src_sums[k] for k in differ}
            pending = differ
            if not pending:
                break
            time.sleep(transfer.POLL)  # a round's writes reach the target
    run.report.verify_before = run.options.verify_before
    run.report.verify_before_seconds = round(time.perf_counter() - t0, 3)
    run.report.verify_before_busy_tables = busy
    if busy:
        run.note(
            f"{busy} table(s) were being written during the check before the freeze; the check "
            f"after the cutover compares them"
        )


def verify_after(
    run: MoveRun, snapshot: psycopg.Connection | None, tables_r: list[tuple[str, str]]
) -> None:
    """Compare every row of the (now read-only) source with the target's snapshot taken in the freeze."""
    if snapshot is None:
        return
    t0 = time.perf_counter()
    renamed = run.renamed_map()
    old = {run.schema(n): renamed[str(n)] for n in run.move.shards}
    run.progress("verify", 0, 0, "after the cutover")
    with (
        run.connect(run.source) as src,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardctl-checksum") as pool,
    ):
        on_target = pool.submit(transfer.checksums, snapshot, tables_r, pause=run.pause())
        src_sums = transfer.checksums(src, [(old[s], t) for s, t in tables_r], pause=run.pause())
        tgt_sums = on_target.result()
    diff = [(s, t) for s, t in tables_r if src_sums[(old[s], t)] != tgt_sums.get((s, t))]
    rows = sum(v[0] for v in tgt_sums.values())
    run.report.rows = rows
    run.report.verify_after_seconds = round(time.perf_counter() - t0, 3)
    run.report.verified = not diff
    with run.connect(run.source) as conn, conn.transaction():
        set_phase(conn, run.move, "source", Phase.CUT_OVER, {"rows": rows, "verified": not diff})
    if diff:
        s, t = diff[0]
        raise OperationFailed(
            f"verify after the cutover: {len(diff)} table(s) differ between {run.source.name} (frozen) and "
            f"{run.target.name} as of the cutover, e.g. {s}.{t}: {src_sums[(old[s], t)][0]} rows on "
            f"{run.source.name}, {tgt_sums.get((s, t), (0,))[0]} on {run.target.name}; the target serves the "
            f"shards now: move-shard --abort copies its rows back and makes the source authoritative again"
        )


def lagging(conn: psycopg.Connection, names: list[str], lsn: str) -> str:
    """Which subscriptions have not applied up to ``lsn`` and why, for a message (never raises)."""
    try:
        return "; ".join(replication.behind(conn, names, lsn)) or "all caught up just now"
    except psycopg.Error as exc:
        return f"their state could not be read ({db.first_line(exc)})"


# The share of the server's deadlock_timeout the freeze may spend waiting on locks (BoundedFreeze).
LOCK_WINDOW_SHARE = 0.8
COMMIT_RESERVE = 0.1  # of --max-freeze, left for the freeze's commit (BoundedFreeze._before_commit)


class BoundedFreeze:
    """What every freeze shares (a move's cutover, an adoption's): one source transaction whose every
    statement is bounded by what is left of ``max_freeze``: the timeouts, the table locks, the wait
    until subscriptions have applied the source's WAL, the time marks. Subclasses open ``src`` (not
    autocommit: the freeze's transaction), ``aux`` (autocommit, the same server) and ``subscribers``
    and drive it."""

    def __init__(self, max_freeze: float, progress: Callable[[str, int, int, str], None]):
        self.max_freeze = max_freeze
        self.progress = progress
        self.t0 = 0.0
        self.deadline = 0.0
        self.lock_window = (
            max_freeze  # seconds the freeze may wait on locks after its first (below)
        )
        self.locks_until: float | None = None
        self.marks: dict[str, float] = {}
        self.src: psycopg.Connection | None = None
        self.aux: psycopg.Connection | None = None
        # autocommit, to the servers whose subscriptions _wait_applied waits for (FeedbackPrompt)
        self.subscribers: list[psycopg.Connection] = []

    def start_clock(self) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.max_freeze

    def _budget(self) -> None:
        """Bound the next statements by what is left of --max-freeze."""
        left = self.deadline - time.monotonic()
        if left < 0.001:
            raise FreezeTimeout(f"the freeze used up --max-freeze {self.max_freeze:g}s")
        now = time.monotonic()
        if self.locks_until is None:  # the first lock: from here the app's writers queue behind us
            self.locks_until = now + self.lock_window
        lock_left = min(left, max(0.001, self.locks_until - now))
        session.set_settings(
            self.src,
            {
                "lock_timeout": session.duration(lock_left),
                "statement_timeout": session.duration(left),
            },
        )

    def _before_commit(self) -> None:
        """FreezeTimeout unless the commit has time left: the freeze is measured to its commit's end,
        and the commit takes time of its own (a WAL flush, a busy machine's scheduling), so
        COMMIT_RESERVE of --max-freeze is kept for it."""
        if time.monotonic() > self.deadline - COMMIT_RESERVE * self.max_freeze:
            raise FreezeTimeout(
                f"the freeze ran past --max-freeze {self.max_freeze:g}s before its commit"
            )

    def _rollback(self) -> None:
        if self.src is not None and not self.src.closed and not self.src.broken:
            try:
                self.src.rollback()
            except psycopg.Error:
                pass

    def _mark(self, name: str) -> None:
        self.marks[name] = round(time.monotonic() - self.t0, 3)

    def _timeouts(self) -> None:
        """Bound the freeze's statements on ``src`` (a new connection: its lock window starts over).

        A writer queued behind the freeze's locks that holds a lock the freeze then waits for makes a
        deadlock; PostgreSQL's check (after ``deadlock_timeout`` of waiting) aborts whichever process
        runs it, which may be the app's. So the freeze stops waiting on locks before any writer
        queued behind it can have waited ``deadlock_timeout``: within LOCK_WINDOW_SHARE of it after
        its first lock. A cycle then ends in the freeze's lock timeout (a retry), never in an app's
        error, whatever ``--max-freeze`` is."""
        self.lock_window = min(
            self.max_freeze, LOCK_WINDOW_SHARE * session.deadlock_timeout(self.src)
        )
        self.locks_until = None
        limit = session.duration(self.max_freeze)
        # No statement of the freeze may outlast it; nor may the transaction outlive a stalled run.
        session.set_settings(
            self.src,
            {
                "lock_timeout": limit,
                "statement_timeout": limit,
                "idle_in_transaction_session_timeout": session.duration(self.max_freeze * 2 + 10),
            },
        )

    def _watch(self, subscribers: list[psycopg.Connection]) -> None:
        """The servers whose subscriptions ``_wait_applied`` waits for (autocommit connections, prompted
        there to report): none of their statements may outlast the freeze either."""
        for conn in subscribers:
            session.set_settings(
                conn, {"statement_timeout": session.duration(self.max_freeze)}, local=False
            )
        self.subscribers = subscribers

    def _lock(self, tables: list[tuple[str, str]]) -> None:
        self.progress("freeze", 0, 0, "locking")
        try:
            self._budget()
            data.lock_tables(self.src, tables, LOCKS_PER_STATEMENT)
        except (
            psycopg.errors.LockNotAvailable,
            psycopg.errors.DeadlockDetected,
            psycopg.errors.QueryCanceled,
        ) as exc:
            raise FreezeTimeout(
                f"could not lock the tables within --max-freeze ({db.first_line(exc)})"
            ) from None
        self._mark("lock")
        if time.monotonic() > self.deadline:
            raise FreezeTimeout("taking the locks used up --max-freeze")

    def _wait_applied(self, names: list[str]) -> None:
        """Wait (within the budget) until the subscriptions of the slots ``names`` on the source have
        applied its WAL up to now."""
        # Why replay_lsn >= lsn means the target holds every row the locked source holds: each writer
        # committed before the LOCK was granted, so its commit record ends before ``lsn``; a walsender
        # sends transactions in commit order and a keepalive's position only after everything before
        # it; the apply worker handles its messages in order and reports a position only between them,
        # after committing what it received (worker.c send_feedback; streamed transactions too: the
        # leader waits for the parallel worker at STREAM COMMIT). That holds only if the worker applies,
        # not skips, what it receives: every table was registered before it streamed (see
        # replication.start_subscription; rows written while it was not were the lost rows once seen here).
        lsn = replication.wal_insert_lsn(self.src)
        prompt = replication.FeedbackPrompt(self.aux, self.subscribers)
        self.progress("freeze", 0, 0, "waiting for lag 0")

        def applied() -> bool:
            if replication.replayed(self.aux, names, lsn):
                return True
            prompt()  # the walsender sends only flushed WAL: the first prompt flushes up to lsn
            return False

        transfer.wait_for(
            applied,
            self.deadline,
            lambda: FreezeTimeout(
                f"the subscriptions did not apply the source's WAL up to {lsn} within "
                f"--max-freeze {self.max_freeze:g}s: {lagging(self.aux, names, lsn)}"
            ),
            cap=transfer.FREEZE_POLL,
        )
        self._mark("caught_up")


class Freeze(BoundedFreeze):
    """One freeze attempt: one source transaction that ends with the schemas renamed and guarded."""

    def __init__(
        self, run: MoveRun, tables_r: list[tuple[str, str]], tables_rp: list[tuple[str, str]]
    ):
        super().__init__(run.options.max_freeze, run.progress)
        self.run = run
        self.move = run.move
        self.options = run.options
        self.tables_r = tables_r
        self.tables_rp = tables_rp
        self.names = run.move.names
        self.tgt: psycopg.Connection | None = None
        # target, REPEATABLE READ as of lag 0 in the freeze
        self.snapshot: psycopg.Connection | None = None

    def attempt(self) -> None:
        run, move = self.run, self.move
        phases_before, detail_before = dict(move.phases), dict(move.detail)
        self.src = src = run.connect(run.source, autocommit=False)
        self.tgt = run.connect(run.target)
        self.aux = run.connect(run.source)
        try:
            self._timeouts()
            self._watch([self.tgt])
            started_at = time.time()
            self.start_clock()
            self._lock(self.tables_rp)
            checkpoint("in-freeze")
            self._wait_applied(self.names)
            self._take_snapshot()
            values = self._sequences()
            self._wait_clock()
            self._budget()
            detail = self._retire(started_at, len(values))
            self._before_commit()
            src.commit()
            checkpoint("after-source-commit")
            run.freeze_t0 = self.t0
            report = run.report
            report.freeze_lock_seconds = detail["freeze_lock_seconds"]
            report.freeze_caught_up_seconds = detail["freeze_caught_up_seconds"]
            report.freeze_snapshot_seconds = detail["freeze_snapshot_seconds"]
            report.freeze_retired_seconds = detail["freeze_retired_seconds"]
            report.freeze_stubs_seconds = detail["freeze_stubs_seconds"]
            report.freeze_started = detail["freeze_started"]
            report.freeze_started_at = started_at
            report.sequences = len(values)
            report.freeze_commit_seconds = round(time.monotonic() - self.t0, 3)
        except psycopg.errors.QueryCanceled as exc:
            move.phases, move.detail = phases_before, detail_before
            self._rollback()
            self.close_snapshot()
            raise FreezeTimeout(
                f"a statement of the freeze ran past --max-freeze ({db.first_line(exc)})"
            ) from None
        except BaseException:
            move.phases, move.detail = phases_before, detail_before
            self._rollback()
            self.close_snapshot()
            raise
        finally:
            for c in (self.src, self.tgt, self.aux):
                c.close()

    def close_snapshot(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None

    def _take_snapshot(self) -> None:
        """The target's rows as of now, for the comparison after the cutover: lag is 0 and the source is
        locked, so this snapshot holds exactly the source's rows."""
        self.snapshot = self.run.connect(self.run.target, autocommit=False)
        self.snapshot.execute(session.REPEATABLE_READ_ONLY)
        self.snapshot.execute(session.PING)  # the snapshot is taken by the first query
        self._mark("snapshot")

    def _sequences(self) -> list[tuple[str, str, int]]:
        seqs = inspect.sequences(self.src, self.run.schemas)
        values = [
            (
                schema,
                name,
                min(int(info["last_value"]) + self.options.sequence_margin, int(info["max_value"])),
            )
            for (schema, name), info in seqs.items()
            if info["last_value"] is not None
        ]
        inspect.set_sequences(self.tgt, values)
        return values

    def _wait_clock(self) -> None:
        source_ms = inspect.now_ms(self.src)
        # new IDs on the target sort after every ID minted on the source
        transfer.wait_for(
            lambda: inspect.now_ms(self.tgt) > source_ms,
            self.deadline,
            lambda: FreezeTimeout(
                "the target's clock is behind the source's by more than --max-freeze"
            ),
            cap=transfer.FREEZE_POLL,
        )

    def _retire(self, started_at: float, sequences: int) -> dict:
        run = self.run
        grants = stubs.write_grants(self.src, run.schemas)
        current = {str(n): run.schema(n) for n in self.move.shards}
        renamed = {str(n): run.renamed(n) for n in self.move.shards}
        run.retire(
            self.src, self.tables_rp, current, renamed, f"moved to {run.target.name}", grants
        )
        self._mark("retired")
        control.write_redirects(
            self.src,
            self.move.shards,
            [run.schema(n) for n in self.move.shards],
            run.target.name,
            run.target.dsn,
            self.move.move_id,
        )
        # Direct clients that still use the old schema name get an error naming the new host.
        stubs.place_moved_stubs(
            self.src, {stub_name(run, n): run.schema(n) for n in self.move.shards}
        )
        self._mark("stubs")
        detail = {
            "grants": grants,
            "renamed": renamed,
            "cutover_at": started_at,
            "sequences": sequences,
            "freeze_lock_seconds": self.marks.get("lock"),
            "freeze_caught_up_seconds": self.marks.get("caught_up"),
            "freeze_snapshot_seconds": self.marks.get("snapshot"),
            "freeze_retired_seconds": self.marks.get("retired"),
            "freeze_stubs_seconds": self.marks.get("stubs"),
            "freeze_compared_seconds": None,  # rows are compared after the freeze now
            "freeze_started": started_at,
        }
        set_phase(self.src, self.move, "source", Phase.CUT_OVER, detail)
        return detail


def stub_name(run: MoveRun, shard: int) -> str:
    """The name a shard's stub has until the cutover gives it the shard's old name."""
    return run.renamed(shard, "stub")


def stub_names(run: MoveRun) -> list[str]:
    """Every name this move's stubs may have: the shards' old names, and the ones before the cutover."""
    return run.schemas + [stub_name(run, n) for n in run.move.shards]


def stub_message(run: MoveRun, shard: int) -> str:
    """What a direct client reading or writing a moved shard's old schema is told (no password)."""
    return (
        f"shard {shard} moved to {run.target.name} (move {run.move.move_id}): connect to "
        f"{mask(control.dsn_without_password(run.target.dsn))}"
    )


def finish_cutover(run: MoveRun) -> None:
    """After the source committed: target active, topology flipped, replication dropped. Idempotent."""
    move = run.move
    with run.connect(run.target) as tgt, tgt.transaction():
        activated = control.change_shard_states(
            tgt, move.shards, ShardState.MOVING_IN, ShardState.ACTIVE
        )
        control.clear_redirects(tgt, move.shards)
        set_phase(
            tgt,
            move,
            "target",
            Phase.CUT_OVER,
            {k: v for k, v in move.detail.items() if k != "grants"},
        )
    checkpoint("after-activate")
    flipped = flip_topology(
        run.topo.path, move.shards, move.source, move.target, run.options.allow_inline_password
    )
    checkpoint("after-flip")
    run.topo = Topology.load(run.topo.path, allow_inline_password=run.options.allow_inline_password)
    done: dict = {"switched": True}  # the switch is complete: nothing left to finish but cleanup
    if run.freeze_t0 is not None:
        done["freeze_seconds"] = run.report.freeze_seconds = round(
            time.monotonic() - run.freeze_t0, 3
        )
        run.report.freeze_ended_at = time.time()
    run.report.topology_flipped = flipped
    run.progress("switch", 0, 0, "dropping the replication")
    run.drop_replication()
    run.both(Phase.CUT_OVER, done)
    if flipped or activated or run.freeze_t0 is not None:
        run.event(
            "move-shard cutover",
            {"freeze_seconds": run.report.freeze_seconds, "rows": run.report.rows},
        )
