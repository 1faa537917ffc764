"""The one per-host executor: applies per-shard SQL on one host.

Each shard's work (its creation and/or migrations, plus the matching rows in the
control schema) commits together or not at all. Shards go in batches: one
transaction per batch. When a batch fails, it is rolled back and replayed one shard
per transaction, so exactly the failing shards are named and every other shard ends
complete. Migrations marked ``-- shardctl:no-transaction`` run alone, outside a
transaction, and are recorded only after they succeed.

Under live traffic (``lock_retries`` set, as ``migrate`` does) a batch runs each shard
under its own SAVEPOINT with a short lock wait. A shard whose lock wait times out is
rolled back to its savepoint and the batch goes on without it, so no shard waits long
while holding other shards' locks; blocked shards are retried alone (holding nothing
else) with backoff and jitter, and only then reported, naming the blocking backend.
Batch sizes adapt to the measured time per shard, so a batch holds its locks for at
most about ``max_lock_hold``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from ..errors import ConnectionLost
from ..model.topology import Host
from ..sql import session
from ..sql.catalog import ledger as ledger_q
from ..sql.locks import lock_holders
from ..sql.migrations import Step
from . import connections as db
from .defaults import (
    DEFAULT_BATCH,
    DEFAULT_MAX_LOCK_HOLD,
    DEFAULT_RECYCLE,
    DEFAULT_RETRY_BUDGET,
)

# Ctrl-C asked the fleet run in progress to stop (``fanout.stop_on_ctrl_c`` sets and clears it): every
# runner stops at its next batch boundary, ``--continue-on-error`` or not; what it did not start is
# reported not started.
INTERRUPTED = threading.Event()

# a shard after the first of its batch (holding theirs) waits only this long
IN_BATCH_LOCK_WAIT = 0.02  # seconds
FIRST_BATCH = 8  # shards in a host's first batch under traffic, before the time per shard is known


@dataclass
class ShardPlan:
    shard: int
    schema: str
    create_sql: str | None = None  # None: the shard exists already
    steps: list[Step] = field(default_factory=list)
    # Deferred rendering: resolved just before the shard's batch runs, so a host's first batch starts
    # at once and rendering overlaps the servers' work instead of preceding it.
    render_steps: Callable[[], list[Step]] | None = None
    # Ledger mode. None: write new ledger rows (applied now, by this run). Otherwise copy these rows
    # (version → the source host's row: description, checksum, duration_ms, applied_at, applied_by),
    # as move-shard does when it recreates a shard on another host at the source's version.
    copy_ledger: dict[int, tuple] | None = None
    state: str | None = None  # the new shard row's state (None: the table's default, 'active')
    # Deferred rendering of ``create_sql`` (as ``render_steps``): a plan never started costs nothing
    # to report (Ctrl-C leaves thousands of them).
    render_create: Callable[[], str] | None = None

    def materialize(self) -> ShardPlan:
        if self.render_create is not None:
            self.create_sql, self.render_create = self.render_create(), None
        if self.render_steps is not None:
            self.steps, self.render_steps = self.render_steps(), None
        return self

    def done(self) -> ShardOutcome:
        """The outcome of this plan run to its end: created if it had to be, every step applied."""
        return ShardOutcome(
            self.shard,
            self.schema,
            created=self.create_sql is not None,
            applied=[s.version for s in self.steps],
        )

    @property
    def all_transactional(self) -> bool:
        return all(s.transactional for s in self.steps)


@dataclass
class ShardOutcome:
    shard: int
    schema: str
    created: bool = False
    applied: list[int] = field(default_factory=list)
    error: str | None = None
    failed_version: int | None = None
    started: bool = True
    retries: int = 0  # times the shard was put back after a lock wait timed out

    @property
    def ok(self) -> bool:
        return self.error is None and self.started


@dataclass
class RunOptions:
    batch_size: int = DEFAULT_BATCH
    recycle_after: int = DEFAULT_RECYCLE
    # Times are in seconds; None: no limit of shardctl's own (migrate's lock wait: DEFAULT_LOCK_WAIT)
    lock_timeout: float | None = None
    statement_timeout: float | None = None
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
    continue_on_error: bool = False
    purpose: str = ""
    # None: the old whole-batch path (init, add-shard); see module doc
    lock_retries: int | None = None
    retry_budget: float = DEFAULT_RETRY_BUDGET
    max_lock_hold: float = DEFAULT_MAX_LOCK_HOLD
    jobs: int | None = None  # streams (connections) per host; None: ``fanout.host_jobs`` decides
    wait: float = 0.0  # seconds to wait for another run's locks on the hosts


def plan_ledger_sql(plan: ShardPlan, step: Step, elapsed_sql: str = ledger_q.ELAPSED) -> str:
    """The ledger row for ``step`` in the plan's ledger mode: a new row, or the copied one."""
    if plan.copy_ledger is None:
        return ledger_q.ledger_row(
            plan.shard, step.version, step.description, step.checksum, elapsed_sql
        )
    return ledger_q.copied_ledger_row(plan.shard, step.version, plan.copy_ledger[step.version])


def transactional_sql(plan: ShardPlan, steps: list[Step]) -> str:
    """One shard's creation and its transactional steps, with their control rows."""
    parts: list[str] = []
    if plan.create_sql is not None:
        parts += [
            plan.create_sql.rstrip().rstrip(";") + ";\n",
            ledger_q.shard_row(plan.shard, plan.schema, plan.state),
        ]
    # One statement starts the step's clock and sets search_path (fewer round trips through the parser).
    start = ledger_q.step_start(session.search_path(plan.schema))
    for step in steps:
        parts += [start, step.sql.rstrip().rstrip(";") + ";\n", plan_ledger_sql(plan, step)]
    return "".join(parts)


class _LiveMode:
    """HostRunner's mode for migrations under traffic (``RunOptions.lock_retries`` set): batches sized
    to ``max_lock_hold``, short lock waits, blocked shards retried alone (see the module doc)."""

    options: RunOptions
    stop: threading.Event
    conn: psycopg.Connection | None
    progress: Callable[[int], None]
    _since_recycle: int
    _live_size: int

    def _stopped(self) -> bool:
        return INTERRUPTED.is_set() or (self.stop.is_set() and not self.options.continue_on_error)

    def _run_live(self, plans: list[ShardPlan], keep_open: bool = False) -> list[ShardOutcome]:
        outcomes: list[ShardOutcome] = []
        retries = _Retries(self.options)
        # The batch size carries over from the runner's previous chunk (a stream's chunks are one run).
        size, i = self._live_size or min(FIRST_BATCH, max(1, self.options.batch_size)), 0
        try:
            while (i < len(plans) or retries) and not self._stopped():
                entry = retries.due()
                if entry is not None:
                    done = self._retry(entry, retries)
                elif i >= len(plans):
                    done = []
                    retries.sleep()
                else:
                    batch = [p.materialize() for p in plans[i : i + size]]
                    i += len(batch)
                    done, hold = self._live_batch(batch, retries)
                    self._since_recycle += len(batch)
                    self.progress(len(done))
                    size = self._live_size = self._next_size(size, hold, len(batch))
                outcomes += done
                if any(not o.ok for o in done) and not self.options.continue_on_error:
                    self.stop.set()
        finally:
            if not keep_open:
                self.close()
        waiting = [e.plan for e in retries.entries]
        return outcomes + [
            ShardOutcome(p.shard, p.schema, started=False) for p in plans[i:] + waiting
        ]

    def _next_size(self, size: int, hold: float, shards: int) -> int:
        """The next batch's size: as many shards as fit in ~70% of ``max_lock_hold`` at the measured
        time per shard, growing at most twofold a batch, never above ``batch_size``."""
        if hold <= 0 or shards <= 0:
            return min(size * 2, self.options.batch_size)
        fit = int(self.options.max_lock_hold * 0.7 / (hold / shards))
        return max(1, min(self.options.batch_size, size * 2, fit))

    def _live_batch(
        self, batch: list[ShardPlan], retries: _Retries
    ) -> tuple[list[ShardOutcome], float]:
        """One transaction, one SAVEPOINT per shard. Returns the outcomes of the shards that are finished
        (applied, or failed and named) and how long the batch held locks (seconds)."""
        conn = self._connection()
        if len(batch) > 1 and all(p.all_transactional for p in batch):
            # The common case first: the whole batch in one round trip. Any error (a lock wait that
            # timed out included) rolls it back, and the batch runs again shard by shard below.
            started = time.perf_counter()
            try:
                conn.execute(
                    "".join(
                        _lock_wait_sql(self.options.lock_timeout if k == 0 else IN_BATCH_LOCK_WAIT)
                        + transactional_sql(p, p.steps)
                        for k, p in enumerate(batch)
                    )
                )
                conn.commit()
                return [p.done() for p in batch], time.perf_counter() - started
            except psycopg.Error as exc:
                self._rollback_or_lost(exc)
        applied: list[ShardPlan] = []
        alone: list[ShardPlan] = []
        held_since: float | None = None
        for plan in batch:
            if not plan.all_transactional:
                alone.append(plan)
                continue
            wait = self.options.lock_timeout if held_since is None else IN_BATCH_LOCK_WAIT
            started = time.perf_counter()
            try:
                conn.execute(
                    session.SAVEPOINT
                    + _lock_wait_sql(wait)
                    + transactional_sql(plan, plan.steps)
                    + session.RELEASE
                )
            except psycopg.Error as exc:
                self._to_savepoint(exc)
                if isinstance(exc, psycopg.errors.LockNotAvailable):
                    retries.add(plan)
                else:
                    alone.append(plan)  # replayed alone below, to name the failing version
                continue
            held_since = started if held_since is None else held_since
            applied.append(plan)
        try:
            conn.commit()
        except psycopg.Error as exc:
            self._rollback_or_lost(exc)
            alone, applied = alone + applied, []
        hold = time.perf_counter() - held_since if held_since is not None else 0.0
        outcomes = [
            ShardOutcome(
                p.shard,
                p.schema,
                created=p.create_sql is not None,
                applied=[s.version for s in p.steps],
            )
            for p in applied
        ]
        return outcomes + [self._one(p) for p in alone], hold

    def _to_savepoint(self, exc: psycopg.Error) -> None:
        conn = self.conn
        if conn is None or conn.broken or conn.closed:
            self._lost(exc)
        try:
            conn.execute(session.UNDO_SAVEPOINT)
        except psycopg.Error:
            self._lost(exc)

    def _retry(self, entry: _Retry, retries: _Retries) -> list[ShardOutcome]:
        """A blocked shard alone (holding no other shard's locks), with the full lock wait."""
        plan = entry.plan
        conn = self._connection()
        try:
            conn.execute(
                _lock_wait_sql(self.options.lock_timeout) + transactional_sql(plan, plan.steps)
            )
            conn.commit()
            out = ShardOutcome(
                plan.shard,
                plan.schema,
                created=plan.create_sql is not None,
                applied=[s.version for s in plan.steps],
            )
        except psycopg.errors.LockNotAvailable as exc:
            self._rollback_or_lost(exc)
            if retries.put_back(entry):
                return []
            out = ShardOutcome(
                plan.shard,
                plan.schema,
                error=self._blocked_message(entry, exc),
                failed_version=plan.steps[0].version if plan.steps else None,
            )
        except psycopg.Error as exc:
            self._rollback_or_lost(exc)
            out = self._one(plan)
        out.retries = entry.attempts + 1  # its lock waits that timed out: in its batch, then alone
        self.progress(1)
        return [out]

    def _blocked_message(self, entry: _Retry, exc: psycopg.Error) -> str:
        holders = lock_holders(self._connection(), entry.plan.schema)
        conn = self.conn
        if conn is not None and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        who = "; ".join(holders) if holders else "the blocking transaction had ended"
        return (
            f"lock timeout: waited for a lock on {entry.plan.schema}'s tables once in its batch and "
            f"{entry.attempts} times alone ({session.duration(self.options.lock_timeout)} each) over "
            f"{time.monotonic() - entry.first:.1f}s ({db.first_line(exc)}); "
            f"blocked by {who}; the migration was not applied here. Re-run when that transaction is "
            f"gone, or raise --lock-retries / --retry-budget"
        )


class HostRunner(_LiveMode):
    """Applies a list of shard plans on one host, batch by batch."""

    def __init__(
        self,
        host: Host,
        options: RunOptions,
        stop: threading.Event,
        progress: Callable[[int], None] | None = None,
    ):
        self.host = host
        self.options = options
        self.stop = stop
        self.progress = progress or (lambda n: None)
        self.conn: psycopg.Connection | None = None
        self._since_recycle = 0
        self._live_size = 0  # live mode's current batch size (0: not measured yet)

    def _connection(self) -> psycopg.Connection:
        if self.conn is not None and self._since_recycle >= self.options.recycle_after:
            self.conn.close()
            self.conn = None
        if self.conn is None or self.conn.closed:
            self.conn = db.connect(
                self.host,
                connect_timeout=self.options.connect_timeout,
                purpose=self.options.purpose,
            )
            db.set_timeouts(self.conn, self.options.lock_timeout, self.options.statement_timeout)
            self._since_recycle = 0
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def run(self, plans: list[ShardPlan], keep_open: bool = False) -> list[ShardOutcome]:
        """Apply ``plans`` in order; one outcome per plan (``started=False`` for those never tried).
        ``keep_open``: leave the connection open for the next call (a stream's next chunk; the caller
        closes it), instead of closing it at the end."""
        if self.options.lock_retries is not None:
            return self._run_live(plans, keep_open)
        outcomes: list[ShardOutcome] = []
        size = max(1, self.options.batch_size)
        i = 0
        try:
            while i < len(plans):
                if self._stopped():
                    break
                batch = [p.materialize() for p in plans[i : i + size]]
                outcomes += self._batch(batch)
                i += len(batch)
                self._since_recycle += len(batch)
                self.progress(len(batch))
                if (
                    any(not o.ok for o in outcomes[-len(batch) :])
                    and not self.options.continue_on_error
                ):
                    self.stop.set()
        finally:
            if not keep_open:
                self.close()
        outcomes += [ShardOutcome(p.shard, p.schema, started=False) for p in plans[i:]]
        return outcomes

    # ---- one batch ---------------------------------------------------------------
    def _batch(self, batch: list[ShardPlan]) -> list[ShardOutcome]:
        if len(batch) > 1 and all(p.all_transactional for p in batch):
            conn = self._connection()
            sql_text = "".join(transactional_sql(p, p.steps) for p in batch)
            try:
                conn.execute(sql_text)
                conn.commit()
                return [p.done() for p in batch]
            except psycopg.Error as exc:
                self._rollback_or_lost(exc)
        return [self._one(p) for p in batch]

    def _one(self, plan: ShardPlan) -> ShardOutcome:
        """One shard alone: creation and transactional steps in one transaction (statement by
        statement, to name the failing version), then any no-transaction step on its own."""
        out = ShardOutcome(plan.shard, plan.schema)
        conn = self._connection()
        pending = list(plan.steps)
        creating = plan.create_sql is not None
        while creating or pending:
            group: list[Step] = []
            while pending and pending[0].transactional:
                group.append(pending.pop(0))
            current: int | None = None
            try:
                if creating:
                    conn.execute(
                        transactional_sql(
                            ShardPlan(plan.shard, plan.schema, plan.create_sql, state=plan.state),
                            [],
                        )
                    )
                for step in group:
                    current = step.version
                    conn.execute(
                        transactional_sql(
                            ShardPlan(plan.shard, plan.schema, copy_ledger=plan.copy_ledger), [step]
                        )
                    )
                conn.commit()
            except psycopg.Error as exc:
                self._rollback_or_lost(exc)
                out.error, out.failed_version = db.first_line(exc), current
                return out
            out.created = out.created or creating
            out.applied += [s.version for s in group]
            creating = False
            if pending:  # a no-transaction step
                step = pending.pop(0)
                try:
                    self._no_transaction(conn, plan, step)
                except psycopg.Error as exc:
                    self._rollback_or_lost(exc)
                    out.error, out.failed_version = db.first_line(exc), step.version
                    return out
                out.applied.append(step.version)
        return out

    def _no_transaction(self, conn: psycopg.Connection, plan: ShardPlan, step: Step) -> None:
        conn.autocommit = True
        try:
            conn.execute(session.set_search_path(plan.schema))
            started = time.perf_counter()
            try:
                conn.execute(step.sql)
            finally:
                if not conn.broken:
                    conn.execute(session.RESET_PATH)
            elapsed = (time.perf_counter() - started) * 1000
        finally:
            if not conn.broken:
                conn.autocommit = False
        conn.execute(plan_ledger_sql(plan, step, f"{elapsed:.3f}"))
        conn.commit()

    def _rollback_or_lost(self, exc: psycopg.Error) -> None:
        """After an error: roll back, or raise ConnectionLost when the connection is gone."""
        conn = self.conn
        if conn is None or conn.broken or conn.closed:
            self._lost(exc)
        try:
            if not conn.autocommit:
                conn.rollback()
            conn.autocommit = False
        except psycopg.Error:
            self._lost(exc)

    def _lost(self, exc: psycopg.Error) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001, S110 - the connection is already broken
                pass
            self.conn = None
        raise ConnectionLost(db.first_line(exc))


def _lock_wait_sql(wait: float | None) -> str:
    """Set the transaction's lock wait for the statements that follow (to the end of the transaction)."""
    return session.settings_text({"lock_timeout": session.duration(wait)}) + ";\n"


@dataclass
class _Retry:
    plan: ShardPlan
    first: float  # time.monotonic() when the shard was first blocked
    due: float
    attempts: int = 0  # waits alone that timed out


class _Retries:
    """Blocked shards waiting for their next try: exponential backoff with jitter, up to
    ``lock_retries`` tries alone or ``retry_budget`` seconds, whichever comes first."""

    def __init__(self, options: RunOptions):
        self.options = options
        self.entries: list[_Retry] = []

    def __bool__(self) -> bool:
        return bool(self.entries)

    def add(self, plan: ShardPlan) -> None:
        now = time.monotonic()
        # first try alone: at once, after the batch commits
        self.entries.append(_Retry(plan, now, now))

    def due(self) -> _Retry | None:
        now = time.monotonic()
        for entry in self.entries:
            if entry.due <= now:
                self.entries.remove(entry)
                return entry
        return None

    def sleep(self) -> None:
        if self.entries:
            time.sleep(max(0.0, min(e.due for e in self.entries) - time.monotonic()))

    def put_back(self, entry: _Retry) -> bool:
        """Schedule the next try; False when the retries or the budget are used up."""
        entry.attempts += 1
        now = time.monotonic()
        if (
            entry.attempts > (self.options.lock_retries or 0)
            or now - entry.first >= self.options.retry_budget
        ):
            return False
        backoff = min(0.05 * 2**entry.attempts, 1.0) * random.uniform(0.5, 1.5)
        entry.due = min(now + backoff, entry.first + self.options.retry_budget)
        self.entries.append(entry)
        return True
