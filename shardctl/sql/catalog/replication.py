"""Publications, replication slots and subscriptions of a move, and how far they have got: one or a
few statements each. The waits on them (a slot's walsender, an apply worker exiting) are the move's
(``ops/move/transfer.py``)."""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from ...model.identifiers import quote_ident
from .data import lock_tables
from .inspect import tables

# Behind by the age of the last replayed transaction, unless everything received is replayed.
STANDBY_LAG_SQL = (
    "SELECT CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() "
    "THEN 0 ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), "
    "1e9) END"
)


# pg_subscription and its statistics are the cluster's: every query of them keeps to this database.
_THIS_DB_OID = "(SELECT oid FROM pg_database WHERE datname = current_database())"


def publication_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)", (name,)
    ).fetchone()[0]


def create_publication(
    conn: psycopg.Connection, name: str, schemas: list[str], by_table: bool = False
) -> None:
    """A publication of every table in ``schemas``: ``FOR TABLES IN SCHEMA`` (superuser only), or, for
    ``by_table`` (a role that owns the tables, as on managed Postgres), ``FOR TABLE`` naming each."""
    if not by_table:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLES IN SCHEMA {}").format(
                sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(s) for s in schemas)
            )
        )
        return
    names = [sql.Identifier(s, t) for s, t in tables(conn, schemas, "r")]
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(names)
        )
    )


def drop_publications(conn: psycopg.Connection, names: list[str]) -> list[str]:
    dropped = []
    for name in names:
        if publication_exists(conn, name):
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
            dropped.append(name)
    return dropped


def slot_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", (name,)
    ).fetchone()[0]


def create_slot(conn: psycopg.Connection, name: str) -> None:
    """A logical slot for a subscription, made on the publisher first (so source and target may
    even be two databases of one server, where CREATE SUBSCRIPTION could not make it)."""
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


def move_slots(conn: psycopg.Connection, names: list[str], sub_oids: list[int]) -> list[str]:
    """The slots a move made on the publisher: its subscriptions' slots and their table-sync slots."""
    patterns = [f"pg\\_{int(oid)}\\_sync\\_%" for oid in sub_oids]
    return [
        r[0]
        for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s) OR slot_name LIKE ANY(%s)",
            (names, patterns),
        ).fetchall()
    ]


def end_slot_holder(conn: psycopg.Connection, slot: str) -> bool:
    """End the walsender that holds ``slot``, if one does; True when there was one."""
    pid = conn.execute(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if pid and pid[0]:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid[0],))
        return True
    return False


def drop_slot(conn: psycopg.Connection, slot: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def subscriptions(conn: psycopg.Connection, names: list[str]) -> dict[str, int]:
    """name → oid of the named subscriptions in this database."""
    return dict(
        conn.execute(
            f"""SELECT subname, oid::int FROM pg_subscription
            WHERE subname = ANY(%s) AND subdbid = {_THIS_DB_OID}""",
            (names,),
        ).fetchall()
    )


def create_subscription(
    conn: psycopg.Connection, name: str, conninfo: str, copy_data: bool = True, start: bool = True
) -> None:
    """Create the subscription without connecting (``connect = false``): the one statement that holds
    the publisher's password cannot fail on the network, so the server never logs it with an error.
    :func:`start_subscription` then connects, in statements that carry no secret."""
    conn.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH "
            "(connect = false, enabled = false, create_slot = false, slot_name = {})"
        ).format(
            sql.Identifier(name), sql.Literal(conninfo), sql.Identifier(name), sql.Literal(name)
        )
    )
    if start:
        start_subscription(conn, name, copy_data)


def probe_subscription(
    conn: psycopg.Connection, name: str, conninfo: str, publication: str
) -> None:
    """Make this server open a replication connection with ``conninfo``, as a subscription's would:
    CREATE SUBSCRIPTION with ``connect = true`` and no slot (``slot_name = NONE``), so nothing is made on
    the publisher. Run it in a transaction the caller rolls back: nothing outlives it here either.
    Raises psycopg's error when the server cannot connect (its first line says why)."""
    conn.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (connect = true, "
            "enabled = false, create_slot = false, slot_name = NONE, copy_data = false)"
        ).format(sql.Identifier(name), sql.Literal(conninfo), sql.Identifier(publication))
    )


def start_subscription(
    conn: psycopg.Connection,
    name: str,
    copy_data: bool = True,
    hold: psycopg.Connection | None = None,
    tables: list[tuple[str, str]] | None = None,
) -> None:
    """Enable a subscription made by :func:`create_subscription` and fetch its tables (the initial copy
    starts). Idempotent: a subscription already enabled and with tables is left alone.

    Without the subscription's copy (``copy_data`` false: the rows were copied as of the slot's snapshot),
    ``hold`` (a second, non-autocommit connection to the same database) must hold SHARE locks on the
    subscription's ``tables`` from before ENABLE until REFRESH has committed. ENABLE starts the apply
    worker, and REFRESH (which cannot share a transaction with it) registers the tables: until then the
    worker skips the changes of tables it does not know (worker.c, should_apply_changes_for_rel: state
    unknown) and still confirms them, so rows written in between would never reach the target while
    ``replay_lsn`` says they did (a lost write that the freeze's lag-0 wait cannot see). With the locks,
    the worker waits on its first change (it opens the table in ROW EXCLUSIVE mode) and reads the table's
    state only once the lock is granted, after REFRESH committed (REFRESH takes ACCESS SHARE only).
    The worker opens a partitioned table before its partitions, so a parent's lock is enough: its
    partitions (thousands of shard tables, for an adoption) are left out of the host's lock table."""
    enabled, rels = _subscription_state(conn, name)
    ident = sql.Identifier(name)
    held = not copy_data and not rels
    if held:
        if hold is None or not tables:
            raise ValueError("start_subscription without copy_data needs hold and tables")
        lock_tables(hold, tables, mode="SHARE", only=True)
    try:
        if not enabled:
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(ident))
        if not rels:
            conn.execute(
                sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = {})").format(
                    ident, sql.SQL("true" if copy_data else "false")
                )
            )
    finally:
        if held:
            hold.rollback()  # the locks go; the apply worker reads the tables' state (ready) after this


def started_without_tables(conn: psycopg.Connection, name: str) -> bool:
    """True for a subscription left enabled with no tables registered: a run stopped between the ENABLE
    and the REFRESH of :func:`start_subscription`, after which its apply worker may have skipped (and
    confirmed) changes."""
    enabled, rels = _subscription_state(conn, name)
    return enabled and not rels


def _subscription_state(conn: psycopg.Connection, name: str) -> tuple[bool, int]:
    """(enabled, tables registered) of a subscription; (False, 0) when there is none."""
    row = conn.execute(
        f"""SELECT s.subenabled, (SELECT count(*) FROM pg_subscription_rel r WHERE r.srsubid = s.oid)
             FROM pg_subscription s WHERE s.subname = %s AND s.subdbid = {_THIS_DB_OID}""",
        (name,),
    ).fetchone()
    return (bool(row[0]), int(row[1])) if row else (False, 0)


def disable_subscription(conn: psycopg.Connection, name: str) -> None:
    """ALTER SUBSCRIPTION … DISABLE: its apply worker exits soon after (:func:`apply_workers`)."""
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(name)))


def apply_workers(conn: psycopg.Connection, name: str) -> int:
    """How many workers of the subscription are running."""
    return conn.execute(
        f"""SELECT count(*) FROM pg_stat_subscription st JOIN pg_subscription s ON s.oid = st.subid
            WHERE s.subname = %s AND s.subdbid = {_THIS_DB_OID} AND st.pid IS NOT NULL""",
        (name,),
    ).fetchone()[0]


def drop_subscription(conn: psycopg.Connection, name: str) -> str:
    """Drop a subscription and its slot on the publisher. When the publisher cannot be reached,
    detach the slot first (the caller then drops the slot on the publisher itself).
    Returns 'dropped', 'detached' or 'absent'."""
    if name not in subscriptions(conn, [name]):
        return "absent"
    ident = sql.Identifier(name)
    try:
        conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(ident))
        return "dropped"
    except psycopg.Error:
        if not conn.autocommit and not conn.broken:
            conn.rollback()
    disable_subscription(conn, name)
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
    conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(ident))
    return "detached"


def sync_state(conn: psycopg.Connection, names: list[str]) -> dict:
    """Table states of the subscriptions: counts by state letter, and error counters."""
    states: dict[str, int] = {}
    for state, count in conn.execute(
        f"""SELECT r.srsubstate::text, count(*)::int FROM pg_subscription s
                 JOIN pg_subscription_rel r ON r.srsubid = s.oid
                WHERE s.subname = ANY(%s) AND s.subdbid = {_THIS_DB_OID} GROUP BY 1""",
        (names,),
    ).fetchall():
        states[state] = count
    errors = conn.execute(
        f"""SELECT coalesce(sum(apply_error_count), 0)::bigint, coalesce(sum(sync_error_count), 0)::bigint
             FROM pg_stat_subscription_stats st JOIN pg_subscription s ON s.oid = st.subid
            WHERE s.subname = ANY(%s) AND s.subdbid = {_THIS_DB_OID}""",
        (names,),
    ).fetchone()
    return {
        "states": states,
        "ready": states.get("r", 0),
        "tables": sum(states.values()),
        "apply_errors": errors[0],
        "sync_errors": errors[1],
    }


def wal_insert_lsn(conn: psycopg.Connection) -> str:
    """The server's WAL insert position now, as text."""
    return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


# One WAL record of the transaction's own (a non-transactional logical decoding message: pgoutput
# passes messages on only to a subscription that asks for them, and ours never do), a transaction ID
# and a synchronous commit. The record is what makes the commit wait for the flush: PostgreSQL
# flushes at commit only a transaction that wrote WAL, whatever synchronous_commit says.
_FLUSH_WAL = (
    "SELECT set_config('synchronous_commit', 'on', true), pg_current_xact_id(), "
    "pg_logical_emit_message(false, 'shardctl', '')"
)


def flush_wal(conn: psycopg.Connection) -> bool:
    """Flush the server's WAL up to now (``conn`` in autocommit). False when the server refuses
    (wal_level below logical, or the function revoked): its WAL writer then flushes within
    ``wal_writer_delay``."""
    try:
        conn.execute(_FLUSH_WAL)
    except (
        psycopg.errors.ObjectNotInPrerequisiteState,
        psycopg.errors.InsufficientPrivilege,
        psycopg.errors.UndefinedFunction,
    ):
        return False
    return True


class FeedbackPrompt:
    """Makes subscriptions report how far they have applied now, not a few hundred ms later.

    An apply worker commits what it applies asynchronously and reports as applied only what its
    server has flushed, and it reports when its walsender pings it, which a walsender does when it
    has read new WAL. With the publisher's writers stopped (a freeze's locks) neither happens soon:
    its WAL writer flushes within ``wal_writer_delay`` and nothing pings. So each call (at most
    every ``every`` seconds) flushes each subscriber's WAL, then writes and flushes a record on the
    publisher: its walsender reads it and pings, and the worker answers with its position."""

    def __init__(
        self,
        publisher: psycopg.Connection,
        subscribers: list[psycopg.Connection],
        every: float = 0.02,
    ):
        self.publisher = publisher
        self.subscribers = list(subscribers)
        self.every = every
        self.due = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.subscribers = [conn for conn in self.subscribers if flush_wal(conn)]
        flush_wal(self.publisher)
        self.due = now + self.every


def slot_lag(conn: psycopg.Connection, names: list[str]) -> int | None:
    """Bytes of WAL the subscriptions have yet to confirm (the largest over the move's slots)."""
    row = conn.execute(
        """SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(confirmed_flush_lsn, restart_lsn)))::bigint,
                  count(*)
             FROM pg_replication_slots WHERE slot_name = ANY(%s)""",
        (names,),
    ).fetchone()
    return None if not row[1] else max(0, int(row[0] or 0))


# how far a slot's subscriber has applied (see ``replayed``)
_APPLIED = "coalesce(r.replay_lsn, s.confirmed_flush_lsn)"


def behind(conn: psycopg.Connection, names: list[str], lsn: str) -> list[str]:
    """The named slots whose subscriber has not applied WAL up to ``lsn``, each with why: no
    walsender streaming from it (its apply worker is not running), or how far it has applied."""
    return [
        f"{name} ({'applied up to ' + str(replay) if active else 'no subscriber streaming'})"
        for name, active, replay in conn.execute(
            f"""SELECT s.slot_name, r.pid IS NOT NULL, {_APPLIED}
                 FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
                WHERE s.slot_name = ANY(%s)
                  AND (r.pid IS NULL OR {_APPLIED} IS NULL OR {_APPLIED} < %s::pg_lsn)
                ORDER BY 1""",
            (names, lsn),
        )
    ]


def replayed(conn: psycopg.Connection, names: list[str], lsn: str) -> bool:
    """True when every subscription's walsender reports having applied WAL up to ``lsn``.

    The walsender is found by its slot (not by application_name, which a DSN may set). Its
    ``replay_lsn`` shows only to pg_read_all_stats (not to the role it runs as): without it, the
    slot's ``confirmed_flush_lsn`` (applied and flushed by the subscriber) answers."""
    row = conn.execute(
        f"""SELECT count(*) FILTER (WHERE {_APPLIED} >= %s::pg_lsn), count(*)
             FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
            WHERE s.slot_name = ANY(%s)""",
        (lsn, names),
    ).fetchone()
    return row[1] == len(names) and row[0] == len(names)


def subscription_problems(conn: psycopg.Connection, names: list[str]) -> list[str]:
    """Why the named subscriptions are not applying, as the subscriber's server sees it: disabled, no
    apply worker running, table-sync workers waiting for a free worker slot, error counters."""
    out = []
    for name, enabled, workers, syncing, apply_errors, sync_errors in conn.execute(
        f"""SELECT s.subname, s.subenabled,
                      (SELECT count(*) FROM pg_stat_subscription w WHERE w.subid = s.oid AND w.pid IS NOT NULL
                          AND w.relid IS NULL)::int,
                      (SELECT count(*) FROM pg_stat_subscription w WHERE w.subid = s.oid AND w.relid IS NOT NULL)::int,
                      coalesce(st.apply_error_count, 0), coalesce(st.sync_error_count, 0)
                 FROM pg_subscription s LEFT JOIN pg_stat_subscription_stats st ON st.subid = s.oid
                WHERE s.subname = ANY(%s) AND s.subdbid = {_THIS_DB_OID} ORDER BY 1""",
        (names,),
    ).fetchall():
        if not enabled:
            out.append(f"subscription {name} is disabled")
        elif not workers:
            out.append(f"subscription {name} has no apply worker running")
        if apply_errors or sync_errors:
            out.append(
                f"subscription {name} has {apply_errors} apply and {sync_errors} table-sync errors"
            )
    workers = conn.execute(
        """SELECT current_setting('max_logical_replication_workers')::int,
                  (SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)::int"""
    ).fetchone()
    if workers[1] >= workers[0]:
        out.append(
            f"all {workers[0]} logical replication workers are busy (max_logical_replication_workers)"
        )
    return out


def create_slot_with_snapshot(repl: psycopg.Connection, name: str) -> tuple[str, str]:
    """On a replication connection (``replication=database``): a logical slot for a subscription, with
    its consistent point exported as a snapshot. Returns (consistent LSN, snapshot name); the snapshot
    lives as long as ``repl`` stays open and idle. (Replication commands need the simple query
    protocol: libpq's PQexec.)"""
    command = f"CREATE_REPLICATION_SLOT {quote_ident(name)} LOGICAL pgoutput (SNAPSHOT 'export')"
    res = repl.pgconn.exec_(command.encode())
    if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
        message = (res.error_message or b"").decode(errors="replace").strip()
        raise psycopg.OperationalError(f"CREATE_REPLICATION_SLOT {name}: {message}")
    return res.get_value(0, 1).decode(), res.get_value(0, 2).decode()
