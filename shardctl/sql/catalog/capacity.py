"""Capacity: how many connections may apply shards at once on a server."""

from __future__ import annotations

import psycopg


def connection_headroom(conn: psycopg.Connection) -> int:
    """Connection slots an ordinary role can still open: max_connections minus the reserved slots
    (superuser_reserved_connections, and reserved_connections from PostgreSQL 16) minus client
    backends now connected (numbackends over every database)."""
    return conn.execute(
        """SELECT current_setting('max_connections')::int
                - current_setting('superuser_reserved_connections')::int
                - coalesce(current_setting('reserved_connections', true)::int, 0)
                - (SELECT coalesce(sum(numbackends), 0)::int FROM pg_stat_database)"""
    ).fetchone()[0]


def server_cores(conn: psycopg.Connection) -> int | None:
    """The server machine's CPU count when the role may read server files (a superuser or a member of
    pg_read_server_files) and the server runs Linux; None otherwise (no SQL gives it to other roles)."""
    allowed = conn.execute(
        """SELECT rolsuper OR pg_has_role(current_user, 'pg_read_server_files', 'MEMBER')
             FROM pg_roles WHERE rolname = current_user"""
    ).fetchone()
    if not allowed or not allowed[0]:
        return None
    try:
        with conn.transaction():
            row = conn.execute(
                r"""SELECT count(*)::int FROM regexp_matches(pg_read_file('/proc/cpuinfo'), '^processor\s', 'gn')"""
            ).fetchone()
    except psycopg.Error:
        return None
    return row[0] if row and row[0] > 0 else None
