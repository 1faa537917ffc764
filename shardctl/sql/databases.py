"""Databases on a server, for the sandbox and the test fleets (``dev/``, ``testing.py``): made when
missing, made fresh, dropped with whatever connects to them."""

from __future__ import annotations

import psycopg
from psycopg import sql


def database_exists(conn: psycopg.Connection, name: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone())


def ensure_database(conn: psycopg.Connection, name: str) -> None:
    """Create database ``name`` unless it exists (``conn``: autocommit)."""
    if not database_exists(conn, name):
        create_database(conn, name)


def create_database(
    conn: psycopg.Connection,
    name: str,
    *,
    template: str | None = None,
    encoding: str | None = None,
) -> None:
    """``CREATE DATABASE name``: a copy of ``template`` (a file copy on PostgreSQL 15+, which beats
    the default block-by-block copy through the WAL by half on a small fleet), or empty in
    ``encoding`` (C collation, from template0)."""
    text = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        text += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        if conn.info.server_version >= 150000:
            text += sql.SQL(" STRATEGY FILE_COPY")
    elif encoding:
        text += sql.SQL(" ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
            sql.Literal(encoding)
        )
    conn.execute(text)


def seal_template(conn: psycopg.Connection, name: str) -> None:
    """Make ``name`` copyable as a template: refuse new connections and end those still open."""
    conn.execute(
        sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name))
    )
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
    )


def with_replication_objects(conn: psycopg.Connection, names: list[str]) -> set[str]:
    """Which of the databases hold a subscription or a replication slot (both catalogs are the
    cluster's: one connection sees every database's)."""
    return {
        name
        for (name,) in conn.execute(
            """SELECT d.datname FROM pg_database d WHERE d.datname = ANY(%s) AND (
                   EXISTS (SELECT 1 FROM pg_subscription s WHERE s.subdbid = d.oid)
                   OR EXISTS (SELECT 1 FROM pg_replication_slots r WHERE r.database = d.datname))""",
            (names,),
        )
    }


def local_subscriptions(conn: psycopg.Connection) -> list[str]:
    """The subscriptions of the connection's database."""
    return [
        name
        for (name,) in conn.execute(
            """SELECT subname FROM pg_subscription
                WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())"""
        )
    ]


def local_slots(conn: psycopg.Connection) -> list[str]:
    """The replication slots of the connection's database."""
    return [
        name
        for (name,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
        )
    ]


def drop_database(conn: psycopg.Connection, name: str) -> None:
    """Drop ``name`` if it exists, ending its sessions (and any subscription a failed move left)."""
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
