"""The catalog queries the Router sends, as texts and parsers: each Router (the asyncio one, and the
thread one generated from it) executes a text on its own connection and hands the rows to the parser,
so neither holds a query or reads a row's shape itself."""

from __future__ import annotations

from psycopg import sql

from .control import HAS_REDIRECTS_SQL, REDIRECTS_SQL, SHARD_STATE_SQL, redirects_by_shard
from .replication import STANDBY_LAG_SQL

__all__ = [
    "HAS_REDIRECTS_SQL",
    "REDIRECTS_SQL",
    "SHARD_STATE_SQL",
    "STANDBY_LAG_SQL",
    "has_redirects",
    "id_map_key",
    "id_map_key_query",
    "moved_out",
    "redirects_by_shard",
    "standby_lag",
]


def standby_lag(rows: list[tuple]) -> float:
    """STANDBY_LAG_SQL's answer: how many seconds the standby is behind (0: it replayed all it got)."""
    return float(rows[0][0])


def has_redirects(rows: list[tuple]) -> bool:
    """HAS_REDIRECTS_SQL's answer: whether the host has the redirects table (a move left it one)."""
    return bool(rows[0][0])


def moved_out(rows: list[tuple]) -> bool:
    """SHARD_STATE_SQL's answer: whether the host records the shard as moved away from it."""
    return bool(rows) and rows[0][0] == "moved_out"


def id_map_key_query(schema: str, table: str, id_column: str, key_column: str) -> sql.Composed:
    """The key of a pre-adoption ID of ``table``, in the id map database (``ops/adopt/id_map.py``
    keeps ``<schema>.<table>(<id>, <key>)`` filled by logical replication from the old database,
    ``schema`` the old database's: ``public``)."""
    return sql.SQL("SELECT {key} FROM {table} WHERE {id} = %s").format(
        key=sql.Identifier(key_column),
        table=sql.Identifier(schema, table),
        id=sql.Identifier(id_column),
    )


def id_map_key(rows: list[tuple]) -> int | None:
    """id_map_key_query's answer: the key, or None when the id map has no such ID."""
    return rows[0][0] if rows else None
