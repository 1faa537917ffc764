"""What ``adopt verify`` reads and records on the database being adopted (the source): its run state in
the ``shardctl_adopt`` schema (``verify_runs``, ``verify_chunks``: one row per chunk, so a re-run after
a kill redoes only the chunks not recorded), each table's columns and the bounds its chunks split, the
rows its dark reads take their parameters from; and the app's statement texts made runnable with
bound parameters on both sides. The checksums themselves are :mod:`.data`'s (``Scope``)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from pglast import parser as pg_parser

from ...model.identifiers import quote_ident

SCHEMA = "shardctl_adopt"

STATE = """
CREATE SCHEMA IF NOT EXISTS shardctl_adopt;
CREATE TABLE IF NOT EXISTS shardctl_adopt.verify_runs (
    run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fingerprint text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    summary jsonb
);
CREATE TABLE IF NOT EXISTS shardctl_adopt.verify_chunks (
    run_id bigint NOT NULL REFERENCES shardctl_adopt.verify_runs ON DELETE CASCADE,
    chunk int NOT NULL,
    table_name text NOT NULL,
    column_name text,
    lo bigint,
    hi bigint,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ok', 'busy', 'differs')),
    rounds int,
    source_rows bigint,
    fleet_rows bigint,
    problems jsonb NOT NULL DEFAULT '[]',
    checked_at timestamptz,
    PRIMARY KEY (run_id, chunk)
)"""

LAST_RUN = """
SELECT r.started_at, r.finished_at, r.summary, count(c.chunk)::int,
       (count(c.chunk) FILTER (WHERE c.status <> 'pending'))::int
  FROM shardctl_adopt.verify_runs r LEFT JOIN shardctl_adopt.verify_chunks c USING (run_id)
 WHERE r.started_at >= to_timestamp(%s)
 GROUP BY r.run_id ORDER BY r.run_id DESC LIMIT 1"""


def last_run(conn: psycopg.Connection, since: float | None = None) -> dict[str, Any] | None:
    """The last run recorded on the source (one started at or after ``since``, epoch seconds): when
    it started and finished (None: not yet, or killed), its chunks and how many are checked, and the
    summary a finished run recorded. None when none ran."""
    exists = conn.execute("SELECT to_regclass('shardctl_adopt.verify_runs') IS NOT NULL").fetchone()
    if not exists[0]:
        return None
    row = conn.execute(LAST_RUN, (since or 0,)).fetchone()
    if row is None:
        return None
    started, finished, summary, chunks, checked = row
    return {
        "started_at": str(started),
        "finished_at": None if finished is None else str(finished),
        "chunks": chunks,
        "checked": checked,
        "summary": dict(summary or {}),
    }


def passed(run: dict[str, Any] | None) -> bool:
    """What the cutover asks of :func:`last_run`: it finished and found no difference, in the rows
    or in the dark reads (a summary without ``ok``: no problem listed)."""
    if run is None or run["finished_at"] is None:
        return False
    return bool(run["summary"].get("ok", not run["summary"].get("problems")))


# One verify at a time per source: a session lock on the state connection.
LOCK = "SELECT pg_try_advisory_lock(hashtext('shardctl_adopt.verify'))"


def ensure_state(conn: psycopg.Connection) -> bool:
    """Create the state schema and tables if missing; False when another verify holds the lock."""
    if not conn.execute(LOCK).fetchone()[0]:
        return False
    with conn.transaction():
        for statement in STATE.split(";"):
            conn.execute(statement)
    return True


def unfinished_run(conn: psycopg.Connection, fingerprint: str) -> int | None:
    """The last unfinished run, when it is of the same check (``fingerprint``): a re-run resumes it."""
    row = conn.execute(
        "SELECT run_id, fingerprint FROM shardctl_adopt.verify_runs WHERE finished_at IS NULL "
        "ORDER BY run_id DESC LIMIT 1"
    ).fetchone()
    return row[0] if row is not None and row[1] == fingerprint else None


def new_run(
    conn: psycopg.Connection,
    fingerprint: str,
    chunks: list[tuple[str, str, int | None, int | None]],
) -> int:
    """A new run with its chunks, (table, column, lo, hi) each, all pending: one transaction, so a
    run is recorded with all its chunks or not at all."""
    with conn.transaction(), conn.cursor() as cur:
        run_id = cur.execute(
            "INSERT INTO shardctl_adopt.verify_runs (fingerprint) VALUES (%s) RETURNING run_id",
            (fingerprint,),
        ).fetchone()[0]
        cur.executemany(
            "INSERT INTO shardctl_adopt.verify_chunks (run_id, chunk, table_name, column_name, lo, hi) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [(run_id, n, *chunk) for n, chunk in enumerate(chunks)],
        )
    return run_id


def chunks(conn: psycopg.Connection, run_id: int) -> list[tuple]:
    """(chunk, table, column, lo, hi, status, rounds, source rows, fleet rows, problems, checked_at)."""
    return conn.execute(
        "SELECT chunk, table_name, column_name, lo, hi, status, rounds, source_rows, fleet_rows, "
        "problems, checked_at FROM shardctl_adopt.verify_chunks WHERE run_id = %s ORDER BY chunk",
        (run_id,),
    ).fetchall()


def record_chunk(
    conn: psycopg.Connection,
    run_id: int,
    chunk: int,
    status: str,
    rounds: int,
    counts: tuple[int, int],
    problems: list[dict[str, Any]],
) -> None:
    conn.execute(
        "UPDATE shardctl_adopt.verify_chunks SET status = %s, rounds = %s, source_rows = %s, "
        "fleet_rows = %s, problems = %s::jsonb, checked_at = clock_timestamp() "
        "WHERE run_id = %s AND chunk = %s",
        (status, rounds, counts[0], counts[1], json.dumps(problems), run_id, chunk),
    )


def finish_run(conn: psycopg.Connection, run_id: int, summary: dict[str, Any]) -> None:
    conn.execute(
        "UPDATE shardctl_adopt.verify_runs SET finished_at = clock_timestamp(), summary = %s::jsonb "
        "WHERE run_id = %s",
        (json.dumps(summary), run_id),
    )


COLUMNS = """
SELECT a.attname, (t.typnamespace <> 'pg_catalog'::regnamespace
                   OR coalesce(e.typnamespace <> 'pg_catalog'::regnamespace, false)), a.attnotnull
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type e ON e.oid = t.typelem
 WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum"""


def columns(conn: psycopg.Connection, schema: str, table: str) -> list[tuple[str, bool, bool]]:
    """(name, hashed as text, not null) of each column in order. A type defined outside
    ``pg_catalog`` (an enum, a domain, …) is hashed as its text: its hash may depend on its OID,
    which differs between the source and the shards."""
    return conn.execute(COLUMNS, (f"{quote_ident(schema)}.{quote_ident(table)}",)).fetchall()


def bounds(
    conn: psycopg.Connection, schema: str, table: str, column: str
) -> tuple[int | None, int | None, int]:
    """(min, max of ``column``, estimated rows) of a table: what its chunks split."""
    name = f"{quote_ident(schema)}.{quote_ident(table)}"
    low, high = conn.execute(
        f"SELECT min({quote_ident(column)})::bigint, max({quote_ident(column)})::bigint FROM {name}"
    ).fetchone()
    rows = conn.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass", (name,)
    ).fetchone()[0]
    return low, high, rows


def null_keys(conn: psycopg.Connection, schema: str, table: str, key: str) -> int:
    """Rows whose key is NULL: no shard's publication carries them."""
    return conn.execute(
        f"SELECT count(*) FROM {quote_ident(schema)}.{quote_ident(table)} "
        f"WHERE {quote_ident(key)} IS NULL"
    ).fetchone()[0]


def sample_rows(
    conn: psycopg.Connection, schema: str, table: str, names: list[str], count: int
) -> list[tuple]:
    """Up to ``count`` random rows of ``table`` (the columns ``names``): a dark read's parameters.
    Small tables are read whole and shuffled; a large one is sampled by pages first."""
    cols = ", ".join(quote_ident(n) for n in names)
    name = f"{quote_ident(schema)}.{quote_ident(table)}"
    rows = conn.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass", (name,)
    ).fetchone()[0]
    sample = ""
    if rows > 20 * count and rows > 10_000:
        sample = f" TABLESAMPLE SYSTEM ({min(100.0, 100.0 * 20 * count / rows):.6f})"
    return conn.execute(
        f"SELECT {cols} FROM {name}{sample} ORDER BY random() LIMIT {int(count)}"
    ).fetchall()


def bind_parameters(text: str) -> str | None:
    """``text`` (a statement from ``pg_stat_statements``, its constants shown as ``$1``, ``$2`` …)
    with each ``$n`` written as psycopg's ``%(pn)s`` and every ``%`` doubled, found on PostgreSQL's own
    tokens (a ``$1`` inside a string literal stays); None when the scanner refuses the text."""
    try:
        tokens = list(pg_parser.scan(text))
    except pg_parser.ParseError:
        return None
    out, last = [], 0
    for token in tokens:
        if token.name == "PARAM":
            out.append(text[last : token.start].replace("%", "%%"))
            out.append(f"%(p{text[token.start + 1 : token.end + 1]})s")
            last = token.end + 1
    out.append(text[last:].replace("%", "%%"))
    return "".join(out)


def unqualified(text: str, schema: str) -> str:
    """``text`` with each qualifier that names ``schema`` dropped (``"public"."users"`` reads
    ``"users"``), on the scanner's tokens: the same statement then reads the search path's tables, on
    the source and in a shard alike."""
    tokens = list(pg_parser.scan(text))
    out, last = [], 0
    for i, token in enumerate(tokens):
        value = text[token.start : token.end + 1]
        name = value[1:-1].replace('""', '"') if value.startswith('"') else value.lower()
        if (
            token.name == "IDENT"
            and name == schema
            and i + 1 < len(tokens)
            and tokens[i + 1].name == "ASCII_46"
            and (i == 0 or tokens[i - 1].name != "ASCII_46")
        ):
            out.append(text[last : token.start])
            last = tokens[i + 1].end + 1
    out.append(text[last:])
    return "".join(out)


def read_only_on(conn: psycopg.Connection, schema: str) -> None:
    """The dark read's transaction on the source: read-only, the app's schema first on the path."""
    conn.execute("SET TRANSACTION READ ONLY")
    conn.execute(f"SET LOCAL search_path TO {quote_ident(schema)}")


def copy_slots(conn: psycopg.Connection) -> list[str]:
    """The adoption's logical slots in this database (``shardctl_adopt_<host>_<tag>``, one per fleet host,
    and the id map's): while any exists, the copy replicates and the shards follow the source."""
    rows = conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical' "
        "AND database = current_database() AND slot_name LIKE 'shardctl\\_adopt\\_%' ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]
