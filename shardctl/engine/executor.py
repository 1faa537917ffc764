"""The engine that applies per-shard SQL on one host.

Each shard's work (its creation and/or migrations, plus the matching rows in the
control schema) commits together or not at all. Shards go in batches: one
transaction and one round trip per batch. When a batch fails, it is rolled back
and replayed one shard per transaction, so exactly the failing shards are named
and every other shard ends complete. Migrations marked ``-- shardctl:no-transaction``
run alone, outside a transaction, and are recorded only after they succeed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import psycopg

from . import connections as db
from ..model.identifiers import quote_ident, quote_literal
from ..model.topology import Host

DEFAULT_BATCH = 64
DEFAULT_RECYCLE = 1024  # shards per connection: a backend caches every schema it touches


@dataclass(frozen=True)
class Step:
    version: int
    description: str
    sql: str
    checksum: str
    transactional: bool = True


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

    def materialize(self) -> "ShardPlan":
        if self.render_steps is not None:
            self.steps, self.render_steps = self.render_steps(), None
        return self

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

    @property
    def ok(self) -> bool:
        return self.error is None and self.started


@dataclass
class RunOptions:
    batch_size: int = DEFAULT_BATCH
    recycle_after: int = DEFAULT_RECYCLE
    lock_timeout: str | None = None
    statement_timeout: str | None = None
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
    continue_on_error: bool = False
    purpose: str = ""


class ConnectionLost(Exception):
    """The host went away mid-run; shards not yet committed are untouched."""


_ELAPSED = "extract(epoch FROM clock_timestamp() - current_setting('shardctl.t0')::timestamptz) * 1000"


def shard_row_sql(shard: int, schema: str, state: str | None = None) -> str:
    if state is not None:
        return (f"INSERT INTO shardctl.shards (shard_id, schema_name, state) VALUES ({int(shard)}, "
                f"{quote_literal(schema)}, {quote_literal(state)});\n")
    return f"INSERT INTO shardctl.shards (shard_id, schema_name) VALUES ({int(shard)}, {quote_literal(schema)});\n"


def ledger_sql(shard: int, step: Step, elapsed_sql: str = _ELAPSED) -> str:
    return ("INSERT INTO shardctl.migrations (shard_id, version, description, checksum, duration_ms) VALUES "
            f"({int(shard)}, {int(step.version)}, {quote_literal(step.description)}, "
            f"{quote_literal(step.checksum)}, {elapsed_sql});\n")


def copied_ledger_sql(shard: int, version: int, row: tuple) -> str:
    """A ledger row copied from another host: (description, checksum, duration_ms, applied_at, applied_by)."""
    description, checksum, duration_ms, applied_at, applied_by = row
    return ("INSERT INTO shardctl.migrations (shard_id, version, description, checksum, duration_ms, applied_at, "
            f"applied_by) VALUES ({int(shard)}, {int(version)}, {quote_literal(description)}, "
            f"{quote_literal(checksum)}, {float(duration_ms)!r}, {quote_literal(str(applied_at))}::timestamptz, "
            f"{quote_literal(applied_by)});\n")


def plan_ledger_sql(plan: ShardPlan, step: Step, elapsed_sql: str = _ELAPSED) -> str:
    """The ledger row for ``step`` in the plan's ledger mode: a new row, or the copied one."""
    if plan.copy_ledger is None:
        return ledger_sql(plan.shard, step, elapsed_sql)
    return copied_ledger_sql(plan.shard, step.version, plan.copy_ledger[step.version])


def transactional_sql(plan: ShardPlan, steps: list[Step]) -> str:
    """One shard's creation and its transactional steps, with their control rows."""
    parts: list[str] = []
    if plan.create_sql is not None:
        parts += [plan.create_sql.rstrip().rstrip(";") + ";\n", shard_row_sql(plan.shard, plan.schema, plan.state)]
    # One statement starts the step's clock and sets search_path (fewer round trips through the parser).
    search_path = quote_literal(f"{quote_ident(plan.schema)}, public")
    start = (f"SELECT set_config('shardctl.t0', clock_timestamp()::text, true), "
             f"set_config('search_path', {search_path}, true);\n")
    for step in steps:
        parts += [start, step.sql.rstrip().rstrip(";") + ";\n", plan_ledger_sql(plan, step)]
    return "".join(parts)


class HostRunner:
    """Applies a list of shard plans on one host, batch by batch."""

    def __init__(self, host: Host, options: RunOptions, stop: threading.Event,
                 progress: Callable[[int], None] | None = None):
        self.host = host
        self.options = options
        self.stop = stop
        self.progress = progress or (lambda n: None)
        self.conn: psycopg.Connection | None = None
        self._since_recycle = 0

    def _connection(self) -> psycopg.Connection:
        if self.conn is not None and self._since_recycle >= self.options.recycle_after:
            self.conn.close()
            self.conn = None
        if self.conn is None or self.conn.closed:
            self.conn = db.connect(self.host, connect_timeout=self.options.connect_timeout,
                                   purpose=self.options.purpose)
            db.set_timeouts(self.conn, self.options.lock_timeout, self.options.statement_timeout)
            self._since_recycle = 0
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def run(self, plans: list[ShardPlan]) -> list[ShardOutcome]:
        outcomes: list[ShardOutcome] = []
        size = max(1, self.options.batch_size)
        i = 0
        try:
            while i < len(plans):
                if self.stop.is_set() and not self.options.continue_on_error:
                    break
                batch = [p.materialize() for p in plans[i:i + size]]
                outcomes += self._batch(batch)
                i += len(batch)
                self._since_recycle += len(batch)
                self.progress(len(batch))
                if any(not o.ok for o in outcomes[-len(batch):]) and not self.options.continue_on_error:
                    self.stop.set()
        finally:
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
                return [ShardOutcome(p.shard, p.schema, created=p.create_sql is not None,
                                     applied=[s.version for s in p.steps]) for p in batch]
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
                    conn.execute(transactional_sql(ShardPlan(plan.shard, plan.schema, plan.create_sql,
                                                             state=plan.state), []))
                for step in group:
                    current = step.version
                    conn.execute(transactional_sql(ShardPlan(plan.shard, plan.schema, copy_ledger=plan.copy_ledger),
                                                   [step]))
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
            conn.execute(f"SET search_path TO {quote_ident(plan.schema)}, public")
            started = time.perf_counter()
            try:
                conn.execute(step.sql)
            finally:
                if not conn.broken:
                    conn.execute("RESET search_path")
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
            except Exception:  # noqa: BLE001 - the connection is already broken
                pass
            self.conn = None
        raise ConnectionLost(db.first_line(exc))
