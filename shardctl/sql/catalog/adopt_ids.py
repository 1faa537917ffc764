"""The id map of an adoption: on the old database, the publication of each sharded table's ID and key
columns (and the replica identity those column lists need); in the id map database, its tables.
One statement or a small catalog read each; ``ops/adopt/id_map.py`` decides what to run."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

IDENTITY_SQL = """
SELECT c.relreplident::text,
       coalesce((SELECT array_agg(a.attname::text ORDER BY a.attname)
                   FROM pg_index i JOIN pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                  WHERE i.indrelid = c.oid
                    AND ((c.relreplident = 'd' AND i.indisprimary)
                      OR (c.relreplident = 'i' AND i.indisreplident))), '{}'),
       (SELECT i.indexrelid::regclass::text FROM pg_index i
         WHERE i.indrelid = c.oid AND i.indisreplident)
  FROM pg_class c WHERE c.oid = %s::regclass
"""

COLUMNS_SQL = """
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
  FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
"""


@dataclass(frozen=True)
class Identity:
    """A table's replica identity: ``kind`` (d default, i index, f full, n nothing), the columns it
    holds (none for full or nothing) and its index, when it is one."""

    kind: str
    columns: tuple[str, ...]
    index: str | None


def qualified(schema: str, table: str) -> str:
    """``schema.table`` as a regclass literal reads it (each part quoted)."""
    return sql.Identifier(schema, table).as_string(None)


def identity(conn: psycopg.Connection, schema: str, table: str) -> Identity:
    kind, columns, index = conn.execute(IDENTITY_SQL, (qualified(schema, table),)).fetchone()
    return Identity(kind, tuple(columns), index)


def columns(conn: psycopg.Connection, schema: str, table: str) -> dict[str, tuple[str, bool]]:
    """Each column's type (as ``format_type`` writes it) and NOT NULL."""
    rows = conn.execute(COLUMNS_SQL, (qualified(schema, table),)).fetchall()
    return {name: (kind, notnull) for name, kind, notnull in rows}


def create_identity_index(
    conn: psycopg.Connection, schema: str, table: str, index: str, cols: list[str]
) -> None:
    """A unique index on (id, key), built without blocking writes (``conn``: autocommit)."""
    conn.execute(
        sql.SQL("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(index),
            sql.Identifier(schema, table),
            sql.SQL(", ").join(sql.Identifier(c) for c in cols),
        )
    )


def index_valid(conn: psycopg.Connection, schema: str, index: str) -> bool | None:
    """Whether the index is valid (None: there is none; False: a failed concurrent build left it)."""
    row = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
        (qualified(schema, index),),
    ).fetchone()
    return None if row is None else bool(row[0])


def drop_index(conn: psycopg.Connection, schema: str, index: str) -> None:
    conn.execute(
        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(schema, index))
    )


def set_identity(conn: psycopg.Connection, schema: str, table: str, index: str | None) -> None:
    """``REPLICA IDENTITY USING INDEX index`` (None: ``DEFAULT``)."""
    how = sql.SQL("USING INDEX {}").format(sql.Identifier(index)) if index else sql.SQL("DEFAULT")
    conn.execute(
        sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(sql.Identifier(schema, table), how)
    )


def ids_publication(
    conn: psycopg.Connection,
    name: str,
    schema: str,
    entries: list[tuple[str, str, str]],
    *,
    exists: bool,
) -> None:
    """Publication ``name`` of each (table, id column, key column) with the column list (id, key):
    created, or, when it ``exists``, set to exactly these tables."""
    items = sql.SQL(", ").join(
        sql.SQL("{} ({}, {})").format(
            sql.Identifier(schema, t), sql.Identifier(i), sql.Identifier(k)
        )
        for t, i, k in entries
    )
    if exists:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(sql.Identifier(name), items)
        )
        return
    conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(name), items))


def create_id_table(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    id_col: str,
    id_type: str,
    key_col: str,
    key_type: str,
) -> None:
    """``<schema>.<table>(<id> PRIMARY KEY, <key>)`` in the id map database, with the source's types,
    in the source's schema name (a subscription applies ``app.t`` to ``app.t``)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} {} PRIMARY KEY, {} {})").format(
            sql.Identifier(schema, table),
            sql.Identifier(id_col),
            sql.SQL(id_type),
            sql.Identifier(key_col),
            sql.SQL(key_type),
        )
    )


def subscriptions_from(conn: psycopg.Connection, prefix: str) -> list[str]:
    """This database's subscriptions whose names start with ``prefix`` (an id map database's, when
    the old database that names its run is out of reach)."""
    like = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"
    return [
        r[0]
        for r in conn.execute(
            "SELECT subname FROM pg_subscription WHERE subname LIKE %s AND subdbid = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY 1",
            (like,),
        ).fetchall()
    ]
