"""The catalog queries the Router sends, as texts and parsers: each Router (the asyncio one, and the
thread one generated from it) executes a text on its own connection and hands the rows to the parser,
so neither holds a query or reads a row's shape itself."""

from __future__ import annotations

from .control import HAS_REDIRECTS_SQL, REDIRECTS_SQL, SHARD_STATE_SQL, redirects_by_shard
from .replication import STANDBY_LAG_SQL

__all__ = [
    "HAS_REDIRECTS_SQL",
    "REDIRECTS_SQL",
    "SHARD_STATE_SQL",
    "STANDBY_LAG_SQL",
    "has_redirects",
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
