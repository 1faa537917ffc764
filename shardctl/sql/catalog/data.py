"""The statements that move and compare a shard's rows: table locks, TRUNCATE, binary COPY, the
snapshot a copy reads in, and per-table row counts and checksums. The pacing (``--nice``) and the
loops over tables that drive them are the move's own (``ops/move/transfer.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from ...model.identifiers import quote_ident, quote_literal

CHUNK = 100  # tables per checksum query
PACED_CHUNK = 4  # tables per checksum query between pauses

# Row text must not depend on the session: the same rows give the same checksum on both hosts.
STABLE_TEXT = (
    "SET TimeZone TO 'UTC'; SET DateStyle TO 'ISO, YMD'; SET IntervalStyle TO 'postgres'; "
    "SET extra_float_digits TO 3; SET bytea_output TO 'hex'"
)


def _names(items: list[tuple[str, str]]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(s, t) for s, t in items)


def lock_tables(
    conn: psycopg.Connection,
    items: list[tuple[str, str]],
    per_statement: int = 500,
    mode: str = "EXCLUSIVE",
) -> None:
    """LOCK TABLE … IN EXCLUSIVE MODE (``mode``): writes wait, reads go on."""
    if mode not in ("EXCLUSIVE", "SHARE"):
        raise ValueError(f"lock mode {mode}")
    for i in range(0, len(items), per_statement):
        conn.execute(
            sql.SQL("LOCK TABLE {} IN {} MODE").format(
                _names(items[i : i + per_statement]), sql.SQL(mode)
            )
        )


def truncate_tables(conn: psycopg.Connection, items: list[tuple[str, str]]) -> None:
    if items:
        conn.execute(sql.SQL("TRUNCATE {}").format(_names(items)))


def copy_out(schema: str, table: str) -> sql.Composed:
    """The binary COPY that reads a table (for ``cursor.copy``)."""
    return sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(sql.Identifier(schema, table))


def copy_in(schema: str, table: str) -> sql.Composed:
    """The binary COPY that writes a table (for ``cursor.copy``)."""
    return sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(sql.Identifier(schema, table))


@contextmanager
def snapshot_transaction(conn: psycopg.Connection, snapshot: str) -> Iterator[None]:
    """A read-only REPEATABLE READ transaction on ``conn`` (autocommit) that sees the exported
    ``snapshot``; committed when the block ends without an error."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
    yield
    conn.execute("COMMIT")


def pin_text_settings(conn: psycopg.Connection) -> None:
    """Pin the session settings that shape a row's text (:data:`STABLE_TEXT`)."""
    conn.execute(STABLE_TEXT)


def checksum_rows(
    conn: psycopg.Connection, chunk: list[tuple[str, str]], rows_only: bool = False
) -> list[tuple[str, str, int, str]]:
    """(schema, table, row count, checksum) of each table of ``chunk``: one query. Order-independent: a
    sum of 64-bit hashes of each row, so no sort is needed. ``rows_only``: the row count alone (about 4x
    cheaper; the checksum is then the constant ``'n'``).

    Rows are hashed with ``hash_record_extended`` (each column's own hash function, as hash partitioning
    uses: stable across PostgreSQL versions, and about 4x faster than hashing the row's text). A chunk
    with a column type that has no hash function (point, json…) hashes the rows' text instead (call
    :func:`pin_text_settings` first); the method is part of the checksum, so both hosts must agree on it."""
    if rows_only:
        return conn.execute(_checksum_query(chunk, None, "n")).fetchall()
    rows = _hashed_rows(conn, chunk)
    if rows is not None:
        return rows
    rows = []  # some table of the chunk cannot be hashed by column: find which, one by one
    for item in chunk:
        rows += (
            _hashed_rows(conn, [item])
            or conn.execute(_checksum_query([item], "hashtextextended(x::text, 0)", "t")).fetchall()
        )
    return rows


def _hashed_rows(conn: psycopg.Connection, chunk: list[tuple[str, str]]) -> list[tuple] | None:
    try:
        with conn.transaction():  # a savepoint inside the caller's snapshot transaction
            return conn.execute(
                _checksum_query(chunk, "hash_record_extended(x, 0)", "r")
            ).fetchall()
    except psycopg.errors.UndefinedFunction:  # a column type without an extended hash function
        return None


def _checksum_query(chunk: list[tuple[str, str]], row_hash: str | None, method: str) -> str:
    # sum(bigint) is exact (a numeric result, summed in 128-bit integers): faster than summing numerics.
    total = f"'{method}' || coalesce(sum({row_hash}), 0)::text" if row_hash else f"'{method}'"
    return "\nUNION ALL\n".join(
        f"SELECT {quote_literal(s)}, {quote_literal(t)}, count(*), {total} "
        f"FROM {quote_ident(s)}.{quote_ident(t)} AS x"
        for s, t in chunk
    )
