"""Databases on a server, for the sandbox and the test fleets (``dev/``, ``testing.py``): made when
missing, made fresh, dropped with whatever connects to them."""

from __future__ import annotations

import psycopg
from psycopg import sql


def ensure_database(conn: psycopg.Connection, name: str) -> None:
    """Create database ``name`` unless it exists (``conn``: autocommit)."""
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        create_database(conn, name)


def create_database(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(conn: psycopg.Connection, name: str) -> None:
    """Drop ``name`` if it exists, ending its sessions (and any subscription a failed move left)."""
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
