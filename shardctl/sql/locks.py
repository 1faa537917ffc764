"""Who holds a lock: shardctl runs' session advisory locks (take them, release them, name their holder),
and the sessions holding locks on a shard's tables (who blocks a migration there).

Two kinds, both ``pg_try_advisory_lock(class, key)`` (two int4 keys, so ``pg_locks.objsubid = 2``):
the per-host lock ``('SC', 1)`` of init, migrate, add-shard and moves (``shardctl.engine.connections``),
and the per-shard locks ``('SM', shard)`` of a move (``shardctl.ops.move.run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

# Released in one round trip before a lock's connection is closed: a closed connection's backend
# releases its locks only as it exits, after the client has gone on (the next command may be first).
RELEASE_ALL = "SELECT pg_advisory_unlock_all()"


@dataclass(frozen=True)
class LockHolder:
    """A backend holding one of the locks asked about. ``exiting``: it has left pg_stat_activity already,
    and its locks go with it in a moment. ``client_addr`` and ``backend_start`` are None for another
    role's session unless the asking role may read all statistics (pg_read_all_stats)."""

    pid: int
    application_name: str | None
    client_addr: str | None
    backend_start: datetime | None
    exiting: bool

    def describe(self) -> str:
        if self.exiting:
            return f"pid {self.pid}, exiting"
        since = f", connected {self.backend_start:%Y-%m-%d %H:%M:%S}" if self.backend_start else ""
        return (
            f"pid {self.pid}, {self.application_name or 'unnamed client'}, from "
            f"{self.client_addr or 'local socket'}{since}"
        )


def try_advisory_locks(conn: psycopg.Connection, lock_class: int, keys: list[int]) -> bool:
    """Take the session advisory locks (lock_class, key) of every key, or none of them (a session
    holding only these: on a miss it releases all its advisory locks)."""
    got = conn.execute(
        "SELECT count(*) FROM unnest(%s::int[]) AS k WHERE pg_try_advisory_lock(%s, k)",
        (keys, lock_class),
    ).fetchone()[0]
    if got == len(keys):
        return True
    conn.execute(RELEASE_ALL)
    return False


def advisory_lock_holder(
    conn: psycopg.Connection, lock_class: int, keys: list[int]
) -> LockHolder | None:
    """Another session holding one of the locks (lock_class, key), or None when none does (any more)."""
    row = conn.execute(
        """SELECT l.pid, a.application_name, a.client_addr::text, a.backend_start, a.pid IS NULL
             FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
                  SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid = %s AND l.objid = ANY(%s::oid[]) AND l.objsubid = 2
              AND l.pid <> pg_backend_pid()
            ORDER BY a.pid IS NULL, a.backend_start LIMIT 1""",
        (lock_class, keys),
    ).fetchone()
    return LockHolder(*row) if row else None


def lock_holders(conn: psycopg.Connection, schema: str) -> list[str]:
    """Other backends holding locks on the relations of ``schema`` (who blocks a migration there):
    pid, application name, state and query start, one line each."""
    rows = conn.execute(
        """SELECT a.pid, coalesce(nullif(a.application_name, ''), 'unnamed client'), a.state,
                  to_char(coalesce(a.query_start, a.xact_start), 'YYYY-MM-DD HH24:MI:SS.MS'),
                  extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, a.query_start))::float8
             FROM pg_stat_activity a
            WHERE a.pid <> pg_backend_pid() AND a.pid IN (
                  SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE l.granted AND n.nspname = %s)
            ORDER BY a.xact_start NULLS LAST LIMIT 3""",
        (schema,),
    ).fetchall()
    return [
        f"pid {p}, {app}, {state}, query started {start} (transaction open {age:.1f}s)"
        for p, app, state, start, age in rows
    ]
