"""What a move does with rows and replication objects over time: binary copies between hosts (paced
for ``--nice``), paced checksums, and the waits for slots and apply workers to let go. The statements
themselves are ``sql/catalog`` (``data``, ``replication``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psycopg
from psycopg import sql

from ...errors import WaitTimeout
from ...sql import session
from ...sql.catalog import data, replication

PAUSE_BYTES = 1 << 20  # bytes a paced copy moves between pauses


T = TypeVar("T")

# The longest pause between two looks at the servers: inside the freeze, where writes wait on every
# millisecond, and outside it, where a large shard's sync is not asked every few milliseconds.
FREEZE_POLL = 0.01
POLL = 0.2


def wait_for(
    ready: Callable[[], T | None],
    deadline: float,
    timed_out: Callable[[], Exception],
    cap: float = POLL,
) -> T:
    """The move's one wait for the servers: ``ready()`` until it returns a true value (returned),
    pausing 1 ms at first (a small shard is ready within a few) and doubling up to ``cap``; past
    ``deadline`` (``time.monotonic()``) it raises what ``timed_out()`` builds. ``ready`` may raise
    itself when waiting longer is pointless."""
    pause = 0.001
    while True:
        result = ready()
        if result:
            return result
        if time.monotonic() > deadline:
            raise timed_out()
        time.sleep(pause)
        pause = min(cap, pause * 2)


S = TypeVar("S")


def at_lag_zero(
    src: psycopg.Connection,
    names: list[str],
    read_source: Callable[[psycopg.Connection], S],
    read_target: Callable[[], T],
    timeout: float,
    timed_out: Callable[[str], Exception],
) -> tuple[S, T]:
    """``read_source(src)`` in one REPEATABLE READ snapshot of the source, then ``read_target()`` once
    the subscriptions of the slots ``names`` have applied the source's WAL up to past that snapshot
    (at once when ``names`` is empty: nothing replicates). The target then holds at least what the
    source read saw: with no write meanwhile, exactly it. ``timed_out(lsn)`` builds the error raised
    after ``timeout`` seconds."""
    with src.transaction():
        src.execute(session.REPEATABLE_READ)
        on_source = read_source(src)
        lsn = replication.wal_insert_lsn(src)
    if names:
        wait_for(
            lambda: replication.replayed(src, names, lsn),
            time.monotonic() + timeout,
            lambda: timed_out(lsn),
        )
    return on_source, read_target()


@contextmanager
def copy_encoding(frm: psycopg.Connection, into: psycopg.Connection) -> Iterator[None]:
    """For the block, both connections' ``client_encoding`` is ``into``'s database encoding: text in a
    COPY then crosses as logical replication sends it (its apply worker asks the publisher for the
    subscriber database's encoding), and between databases of one encoding byte for byte, with no
    conversion or validation: a SQL_ASCII database's bytes need not be UTF-8. The block should run
    COPYs only (psycopg reads SQL_ASCII text as bytes); each connection's encoding is restored after
    it (unless its transaction failed: the rollback restores it)."""
    encoding = into.info.parameter_status("server_encoding") or "UTF8"
    saved = [
        (conn, conn.info.parameter_status("client_encoding") or "UTF8") for conn in (frm, into)
    ]
    for conn, _ in saved:
        session.set_settings(conn, {"client_encoding": encoding}, local=False)
    try:
        yield
    finally:
        for conn, before in saved:
            if not conn.closed and conn.info.transaction_status in (
                psycopg.pq.TransactionStatus.IDLE,
                psycopg.pq.TransactionStatus.INTRANS,
            ):
                session.set_settings(conn, {"client_encoding": before}, local=False)


def retry_while_locked(
    action: Callable[[], T], tries: int, busy: Callable[[], Exception], pause: float = 0.2
) -> T:
    """``action()``, one autocommit DDL statement bounded by the session's ``lock_timeout``, until it
    gets its locks: at most ``tries`` times, ``pause`` seconds apart (the app's queries that queued
    behind it run meanwhile); then what ``busy()`` builds is raised. A deadlock counts as busy."""
    for attempt in range(tries):
        try:
            return action()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            if attempt == tries - 1:
                raise busy() from None
            time.sleep(pause)
    raise ValueError("retry_while_locked needs tries >= 1")


class CopiesInFlight:
    """The connections of the copies running in worker threads, so that Ctrl-C in the main thread
    stops them now rather than after their table: :meth:`abandon` cancels each one's statement (a
    COPY streaming, or waiting on a lock) and makes the copy loops raise at their next chunk."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[psycopg.Connection] = set()
        self.abandoned = threading.Event()

    @contextmanager
    def tracking(self, *conns: psycopg.Connection) -> Iterator[None]:
        with self._lock:
            self._conns.update(conns)
        try:
            self.check()
            yield
        finally:
            with self._lock:
                self._conns.difference_update(conns)

    def abandon(self) -> None:
        self.abandoned.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.cancel_safe(timeout=2.0)
            except (psycopg.Error, OSError):
                pass  # the statement ends anyway; the copy loop raises at its next chunk

    def check(self) -> None:
        if self.abandoned.is_set():
            raise CopyAbandoned("the copy was abandoned (Ctrl-C)")


class CopyAbandoned(Exception):
    """A copy stopped because the command was interrupted (the caller re-raises KeyboardInterrupt)."""


# One per process: Ctrl-C stops every copy of the process (``copy.in_new_slot``).
COPIES = CopiesInFlight()


def _copy_table(
    frm: psycopg.Connection,
    into: psycopg.Connection,
    source: tuple[str, str] | sql.Composable,
    target: tuple[str, str] | sql.Composable,
    on_data: Callable[[int], None] | None = None,
) -> int:
    """COPY one table (a (schema, table) pair each side, or the two COPY statements); returns the
    rows the source sent."""
    out_sql = data.copy_out(*source) if isinstance(source, tuple) else source
    in_sql = data.copy_in(*target) if isinstance(target, tuple) else target
    cur = frm.cursor()
    with cur.copy(out_sql) as out, into.cursor().copy(in_sql) as dst:
        for chunk in out:
            COPIES.check()
            dst.write(chunk)
            if on_data:
                on_data(len(chunk))
    return max(0, cur.rowcount)


def copy_tables(
    frm: psycopg.Connection,
    into: psycopg.Connection,
    pairs: list[tuple[tuple[str, str], tuple[str, str]]],
    truncate: bool = False,
    progress=None,
) -> None:
    """COPY each (from table, into table) pair in binary; ``truncate`` empties the destinations first."""
    if truncate and pairs:
        data.truncate_tables(into, [t for _, t in pairs])
    with copy_encoding(frm, into):
        for i, (source, target) in enumerate(pairs, 1):
            _copy_table(frm, into, source, target)
            if progress:
                progress(i)


def copy_in_snapshot(
    src: psycopg.Connection,
    tgt: psycopg.Connection,
    snapshot: str,
    items: list[tuple[str, str]],
    progress=None,
    pause: Callable[[], None] | None = None,
) -> int:
    """Copy each (schema, table) from ``src`` as of ``snapshot`` into the same (empty) table on ``tgt``,
    in binary, in one target transaction. Returns bytes copied. ``pause``: called after every
    PAUSE_BYTES copied (a move's ``--nice``)."""
    copied = copy_statements_in_snapshot(
        src, tgt, snapshot, [(item, item) for item in items], progress, pause
    )
    return sum(size for _, size in copied)


def copy_statements_in_snapshot(
    src: psycopg.Connection,
    tgt: psycopg.Connection,
    snapshot: str,
    pairs: list[tuple],
    progress=None,
    pause: Callable[[], None] | None = None,
) -> list[tuple[int, int]]:
    """Run each (COPY out of ``src``, COPY into ``tgt``) pair (or (schema, table) pairs) as of
    ``snapshot``, in binary, in one target transaction; a pair may carry two more items, the
    statements to run on ``tgt`` before and after its COPY. Returns (rows, bytes) per pair.
    ``pause``: called after every PAUSE_BYTES copied (``--nice``)."""
    copied = 0
    next_pause = PAUSE_BYTES if pause else -1
    out: list[tuple[int, int]] = []

    def count(n: int) -> None:
        nonlocal copied, next_pause
        copied += n
        if copied > next_pause > 0:
            pause()
            next_pause = copied + PAUSE_BYTES

    with (
        COPIES.tracking(src, tgt),
        data.snapshot_transaction(src, snapshot),
        tgt.transaction(),
        copy_encoding(src, tgt),
    ):
        for source, target, *around in pairs:
            start, then = around or ([], [])
            for statement in start:
                tgt.execute(statement)
            before = copied
            rows = _copy_table(src, tgt, source, target, count)
            out.append((rows, copied - before))
            for statement in then:
                tgt.execute(statement)
            if progress:
                progress(1)
    return out


def checksums(
    conn: psycopg.Connection,
    items: list[tuple[str, str]],
    *,
    rows_only: bool = False,
    pause: Callable[[], None] | None = None,
) -> dict[tuple[str, str], tuple[int, str]]:
    """(schema, table) → (row count, checksum of the rows): :func:`data.checksum_rows` over chunks of
    tables. ``pause``: called between queries, which then take PACED_CHUNK tables each (a move's
    ``--nice``)."""
    if not rows_only:  # the text fallback hashes rows' text: pin the settings that shape it
        data.pin_text_settings(conn)
    out: dict[tuple[str, str], tuple[int, str]] = {}
    step = data.PACED_CHUNK if pause else data.CHUNK
    for i in range(0, len(items), step):
        if pause and i:
            pause()
        for schema, table, count, total in data.checksum_rows(conn, items[i : i + step], rows_only):
            out[(schema, table)] = (count, total)
    return out


def drop_slots(
    conn: psycopg.Connection, names: list[str], sub_oids: list[int], timeout: float = 30
) -> list[str]:
    """Drop the move's slots on the publisher, ending a walsender that still holds one."""
    dropped: list[str] = []

    def all_dropped() -> bool:
        left = replication.move_slots(conn, names, sub_oids)
        for slot in left:
            try:
                if replication.end_slot_holder(conn, slot):
                    continue
                replication.drop_slot(conn, slot)
                dropped.append(slot)
            except (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                pass
        return not left or not replication.move_slots(conn, names, sub_oids)

    def timed_out() -> WaitTimeout:
        left = ", ".join(replication.move_slots(conn, names, sub_oids))
        return WaitTimeout(f"replication slots still in use after {timeout:g}s: {left}")

    wait_for(all_dropped, time.monotonic() + timeout, timed_out)
    return dropped


def disable_subscription(conn: psycopg.Connection, name: str, timeout: float = 30) -> None:
    """Disable a subscription and wait until its apply worker has exited."""
    replication.disable_subscription(conn, name)
    wait_for(
        lambda: not replication.apply_workers(conn, name),
        time.monotonic() + timeout,
        lambda: WaitTimeout(
            f"the apply worker of subscription {name} did not stop within {timeout:g}s"
        ),
    )
