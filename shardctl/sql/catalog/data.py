"""The statements that move and compare a shard's rows: table locks, TRUNCATE, binary COPY, the
snapshot a copy reads in, and per-table row counts and checksums. The pacing (``--nice``) and the
loops over tables that drive them are the move's own (``ops/move/transfer.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
    only: bool = False,
) -> None:
    """LOCK TABLE … IN EXCLUSIVE MODE (``mode``): writes wait, reads go on. ``only``: a partitioned
    table's partitions are not locked with it (one lock slot, not one per partition)."""
    if mode not in ("EXCLUSIVE", "SHARE"):
        raise ValueError(f"lock mode {mode}")
    for i in range(0, len(items), per_statement):
        conn.execute(
            sql.SQL("LOCK TABLE {}{} IN {} MODE").format(
                sql.SQL("ONLY " if only else ""),
                _names(items[i : i + per_statement]),
                sql.SQL(mode),
            )
        )


def truncate_tables(conn: psycopg.Connection, items: list[tuple[str, str]]) -> None:
    if items:
        conn.execute(sql.SQL("TRUNCATE {}").format(_names(items)))


# Tables a transaction of a host-wide chore holds locked at most: a TRUNCATE or a rename locks each
# table (a TRUNCATE its indexes and TOAST too, ~4 slots a table) until the transaction ends, and a
# server's lock table holds about max_locks_per_transaction x its processes (64 x ~150 by default):
# every shard table of a host at once overflows it ("out of shared memory") at a few thousand.
TABLES_PER_TRANSACTION = 256


def batched(groups: list[list], per_batch: int = TABLES_PER_TRANSACTION) -> Iterator[list[int]]:
    """Indexes into ``groups`` (each a list of tables that must go together, e.g. one shard's, whose
    foreign keys stay among them), consecutive groups whole, about ``per_batch`` tables a batch."""
    batch: list[int] = []
    size = 0
    for i, group in enumerate(groups):
        if batch and size + len(group) > per_batch:
            yield batch
            batch, size = [], 0
        batch.append(i)
        size += len(group)
    if batch:
        yield batch


def truncate_groups(conn: psycopg.Connection, groups: list[list[tuple[str, str]]]) -> None:
    """TRUNCATE every table of ``groups`` (see :func:`batched`), a batch a statement: on an
    autocommit ``conn``, a transaction each."""
    for batch in batched(groups):
        truncate_tables(conn, [t for i in batch for t in groups[i]])


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


@dataclass(frozen=True)
class Scope:
    """Some rows of one table to checksum (a plain ``(schema, table)`` item means all of them).

    ``column``/``lo``/``hi``: only the rows with ``lo <= column < hi`` (a None bound is open).
    With ``key`` and ``modulus``: ``shard`` None groups the rows by ``key % modulus`` (one result row
    per shard; NULL for rows without a key), a ``shard`` counts the rows whose ``key % modulus`` is
    another shard (``wrong``). ``shard_of``: the row's shard as SQL over the table's columns, in place
    of ``key % modulus`` (an adoption's rule for ID-valued keys, ``adopt_copy.key_shard``).
    ``columns``: the columns hashed, in order, each ``(name, as_text)``
    (text for types whose hash depends on the database, such as an enum's OID); empty: the whole row.
    ``tag`` comes back with the scope's result rows."""

    schema: str
    table: str
    tag: str = ""
    columns: tuple[tuple[str, bool], ...] = ()
    column: str | None = None
    lo: int | None = None
    hi: int | None = None
    key: str | None = None
    modulus: int = 0
    shard: int | None = None
    shard_of: str = ""

    def row(self) -> str:
        if not self.columns:
            return "x"
        cols = ", ".join(
            f"x.{quote_ident(c)}{'::text' if text else ''}" for c, text in self.columns
        )
        return f"ROW({cols})"

    def where(self, shard: int | None = None) -> str:
        """The scope's condition on ``x`` (and ``key % modulus = shard`` when ``shard`` is given)."""
        terms = []
        if self.column is not None and self.lo is not None:
            terms.append(f"x.{quote_ident(self.column)} >= {int(self.lo)}")
        if self.column is not None and self.hi is not None:
            terms.append(f"x.{quote_ident(self.column)} < {int(self.hi)}")
        if shard is not None:
            terms.append(f"{self._shard_of()} = {int(shard)}")
        return f" WHERE {' AND '.join(terms)}" if terms else ""

    def _shard_of(self) -> str:
        if self.shard_of:
            return f"({self.shard_of})"
        return f"(x.{quote_ident(self.key or '')} % {int(self.modulus)})"

    def select(self, total: str) -> str:
        """tag, shard (or NULL), count, ``total``, wrong-shard rows: one row (or one per shard)."""
        source = f"{quote_ident(self.schema)}.{quote_ident(self.table)} AS x{self.where()}"
        head = f"SELECT {quote_literal(self.tag)}::text"
        if self.key is not None and self.shard is None:
            return f"{head}, {self._shard_of()}::bigint, count(*), {total}, 0::bigint FROM {source} GROUP BY 2"
        if self.key is not None:
            wrong = f"count(*) FILTER (WHERE {self._shard_of()} IS DISTINCT FROM {int(self.shard)})"
            return f"{head}, {int(self.shard)}::bigint, count(*), {total}, {wrong} FROM {source}"
        return f"{head}, NULL::bigint, count(*), {total}, 0::bigint FROM {source}"


Item = tuple[str, str] | Scope


def checksum_rows(
    conn: psycopg.Connection, chunk: list[Item], rows_only: bool = False
) -> list[tuple]:
    """(schema, table, row count, checksum) of each table of ``chunk``: one query. Order-independent: a
    sum of 64-bit hashes of each row, so no sort is needed. ``rows_only``: the row count alone (about 4x
    cheaper; the checksum is then the constant ``'n'``). A chunk of :class:`Scope` items gives, for
    each, its rows (tag, shard, row count, checksum, wrong-shard rows) instead (see ``Scope``).

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
            _hashed_rows(conn, [item]) or conn.execute(_checksum_query([item], "t", "t")).fetchall()
        )
    return rows


def _hashed_rows(conn: psycopg.Connection, chunk: list[Item]) -> list[tuple] | None:
    try:
        with conn.transaction():  # a savepoint inside the caller's snapshot transaction
            return conn.execute(_checksum_query(chunk, "r", "r")).fetchall()
    except psycopg.errors.UndefinedFunction:  # a column type without an extended hash function
        return None


# How a row (``{}``: ``x`` or a ROW(...) of some columns) is hashed, by the method's letter.
ROW_HASH = {"r": "hash_record_extended({}, 0)", "t": "hashtextextended({}::text, 0)"}


def _checksum_query(chunk: list[Item], row_hash: str | None, method: str) -> str:
    # sum(bigint) is exact (a numeric result, summed in 128-bit integers): faster than summing numerics.
    def total(item: Item) -> str:
        if row_hash is None:
            return f"'{method}'"
        row = item.row() if isinstance(item, Scope) else "x"
        return f"'{method}' || coalesce(sum({ROW_HASH[row_hash].format(row)}), 0)::text"

    return "\nUNION ALL\n".join(
        item.select(total(item))
        if isinstance(item, Scope)
        else f"SELECT {quote_literal(item[0])}, {quote_literal(item[1])}, count(*), {total(item)} "
        f"FROM {quote_ident(item[0])}.{quote_ident(item[1])} AS x"
        for item in chunk
    )


def row_hashes(
    conn: psycopg.Connection, scope: Scope, method: str, shard: int | None, limit: int
) -> list[tuple]:
    """(``scope.column``, the row's hash, ``scope.key``, the row's shard by its key) of up to ``limit``
    rows of ``scope`` (those of ``shard`` when given), hashed as the checksum of ``method`` hashed
    them: to name the rows that differ within a chunk whose checksums differ."""
    hashed = ROW_HASH.get(method, ROW_HASH["r"]).format(scope.row())
    key = f"x.{quote_ident(scope.key)}" if scope.key else "NULL"
    owner = f"{scope._shard_of()}::bigint" if scope.key else "NULL"
    return conn.execute(
        f"SELECT x.{quote_ident(scope.column or '')}, {hashed}, {key}, {owner} FROM {quote_ident(scope.schema)}."
        f"{quote_ident(scope.table)} AS x{scope.where(shard)} ORDER BY 1 LIMIT {int(limit)}"
    ).fetchall()
