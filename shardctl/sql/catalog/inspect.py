"""What a host and its schemas hold: tables, columns, sequences, functions, sizes, and what the
server and the connected role allow."""

from __future__ import annotations

import psycopg

from ...model.identifiers import quote_ident
from .. import queries
from .control import NOT_STUB


def server_facts(conn: psycopg.Connection) -> dict:
    """Version, replication settings and how much of them is in use on this server; the database's
    encoding (``queries/server_facts.sql``: its column names are the keys)."""
    return _named_row(conn.execute(queries.load("server_facts")))


def role_facts(conn: psycopg.Connection, schemas: list[str]) -> dict:
    """What the connected role may do for a move: superuser, REPLICATION, CREATE on the database,
    pg_create_subscription membership, and how many tables in ``schemas`` it does not own
    (``queries/role_facts.sql``: its column names are the keys)."""
    return _named_row(conn.execute(queries.load("role_facts"), {"schemas": schemas}))


def _named_row(cur: psycopg.Cursor) -> dict:
    """The cursor's one row as column name → value."""
    row = cur.fetchone()
    return dict(zip([d.name for d in cur.description], row))


def tables(conn: psycopg.Connection, schemas: list[str], kinds: str = "r") -> list[tuple[str, str]]:
    """(schema, table) of the relations of ``kinds`` (pg_class.relkind letters) in ``schemas``."""
    return [
        tuple(r)
        for r in conn.execute(
            """SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = ANY(%s) AND c.relkind = ANY(%s) ORDER BY 1, 2""",
            (schemas, list(kinds)),
        ).fetchall()
    ]


def any_rows(conn: psycopg.Connection, items: list[tuple[str, str]]) -> bool:
    """Whether any of the (schema, table)s holds a row: one query of EXISTS per table."""
    probe = " OR ".join(
        f"EXISTS (SELECT 1 FROM {quote_ident(s)}.{quote_ident(t)})" for s, t in items
    )
    return bool(items) and conn.execute(f"SELECT {probe}").fetchone()[0]


def present_schemas(conn: psycopg.Connection, schemas: list[str]) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (schemas,)
        ).fetchall()
    }


def unmovable(conn: psycopg.Connection, schemas: list[str]) -> list[str]:
    """Why these schemas cannot be replicated: tables without a primary key or replica identity
    (their UPDATEs and DELETEs could not be applied), unlogged tables, materialized views and
    foreign tables (logical replication carries none of them)."""
    rows = conn.execute(
        """SELECT n.nspname, c.relname, c.relkind, c.relpersistence, c.relreplident,
                  EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
                  EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'm', 'f')
            ORDER BY 1, 2""",
        (schemas,),
    ).fetchall()
    problems = []
    for schema, table, kind, persistence, ident, has_pk, has_ident_index in rows:
        name = f"{schema}.{table}"
        if kind == "m":
            problems.append(f"{name} is a materialized view (not replicated)")
        elif kind == "f":
            problems.append(f"{name} is a foreign table (not replicated)")
        elif persistence == "u":
            problems.append(f"{name} is unlogged (not replicated)")
        elif (
            ident == "n" or (ident == "d" and not has_pk) or (ident == "i" and not has_ident_index)
        ):
            problems.append(f"{name} has no primary key or replica identity")
    return problems


def structure(
    conn: psycopg.Connection, schemas: list[str]
) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(schema, table) → [(column, type)] for the ordinary and partitioned tables in ``schemas``."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for schema, table, column, typ in conn.execute(
        """SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p')
                ORDER BY 1, 2, a.attnum""",
        (schemas,),
    ).fetchall():
        out.setdefault((schema, table), []).append((column, typ))
    for schema, table in tables(conn, schemas, "rp"):  # a table without columns still counts
        out.setdefault((schema, table), [])
    return out


def sequences(conn: psycopg.Connection, schemas: list[str]) -> dict[tuple[str, str], dict]:
    """(schema, sequence) → last_value (None if never used), max_value: read from the sequences themselves."""
    return {
        (r[0], r[1]): {"last_value": r[2], "max_value": r[3]}
        for r in conn.execute(
            """SELECT schemaname, sequencename, last_value, max_value FROM pg_sequences
            WHERE schemaname = ANY(%s)""",
            (schemas,),
        ).fetchall()
    }


def set_sequences(conn: psycopg.Connection, values: list[tuple[str, str, int]]) -> int:
    """setval each (schema, sequence, value), never moving a sequence backwards."""
    if not values:
        return 0
    schemas, names, vals = zip(*values)
    return conn.execute(
        """SELECT count(setval(format('%%I.%%I', u.s, u.n)::regclass,
                              greatest(u.v, coalesce(q.last_value, 0)), true))
             FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS u(s, n, v)
             LEFT JOIN pg_sequences q ON q.schemaname = u.s AND q.sequencename = u.n""",
        (list(schemas), list(names), list(vals)),
    ).fetchone()[0]


def now_ms(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[
        0
    ]


def schema_names(conn: psycopg.Connection) -> set[str]:
    """Every schema of the database but the stubs left under moved shards' old names."""
    return {
        r[0]
        for r in conn.execute(f"SELECT nspname FROM pg_namespace n WHERE {NOT_STUB}").fetchall()
    }


def function_sources(
    conn: psycopg.Connection, schemas: list[str]
) -> dict[tuple[str, str, int], tuple[str, str]]:
    """(schema, name, argument count) → (language, body as ``pg_proc.prosrc``) of the functions in ``schemas``."""
    rows = conn.execute(
        """SELECT n.nspname, p.proname, p.pronargs, l.lanname, p.prosrc
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             JOIN pg_language l ON l.oid = p.prolang
            WHERE n.nspname = ANY(%s)""",
        (schemas,),
    ).fetchall()
    return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}


def schema_sizes(conn: psycopg.Connection, schemas: list[str]) -> dict[str, int]:
    """Bytes per schema: pg_total_relation_size (tables, indexes, TOAST) of its tables."""
    return dict(
        conn.execute(
            """SELECT n.nspname, coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
             FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relkind IN ('r', 'm')
            WHERE n.nspname = ANY(%s) GROUP BY 1""",
            (schemas,),
        ).fetchall()
    )
