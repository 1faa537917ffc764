"""Catalog, control-table and replication queries of ``move-shard`` (``shardctl.ops.move``).

Everything here is one or a few queries on one connection: the move records and shard
states in the control schema, what a shard schema holds, whether it can be replicated,
row counts and checksums, sequence values, write privileges, and the publication /
subscription / slot objects of a move. The control tables themselves (``shardctl.moves``,
the guard function) are defined in ``templates/control_schema.sql.j2``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg import sql

from ..model.identifiers import quote_ident, quote_literal
from .render import render_control

# SQLSTATE raised by the guard trigger on a moved shard's old tables (see Router.run).
MOVED_SQLSTATE = "SCM01"
GUARD_FUNCTION = "shardctl.moved_shard_guard"
GUARD_TRIGGER = "shardctl_moved_shard"
STUB_READ_FUNCTION = (
    "shardctl.moved_shard_read"  # a moved shard's stub views read through it (it raises SCM01)
)
# The stub views' WHERE: an immutable function of a constant, so it raises SCM01 when any read is planned.
STUB_PLAN_FUNCTION = "shardctl.moved_shard_planned"
STUB_COMMENT = "shardctl: moved-shard stub"  # COMMENT ON SCHEMA of a stub: never a shard
# A pg_namespace row (alias n) that is not a stub left under a moved shard's old name.
NOT_STUB = (
    "NOT EXISTS (SELECT FROM pg_description d WHERE d.objoid = n.oid AND d.classoid = 'pg_namespace'::regclass "
    f"AND d.objsubid = 0 AND starts_with(d.description, '{STUB_COMMENT}'))"
)
WRITE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
CHUNK = 100  # tables per checksum query
PACED_CHUNK = 4  # tables per checksum query between pauses
PAUSE_BYTES = 1 << 20  # bytes a paced copy moves between pauses

# Row text must not depend on the session: the same rows give the same checksum on both hosts.
STABLE_TEXT = (
    "SET TimeZone TO 'UTC'; SET DateStyle TO 'ISO, YMD'; SET IntervalStyle TO 'postgres'; "
    "SET extra_float_digits TO 3; SET bytea_output TO 'hex'"
)


# ---- control-schema records -----------------------------------------------------------


def moves_table_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl.moves') IS NOT NULL").fetchone()[0]


def ensure_move_objects(conn: psycopg.Connection) -> None:
    """Create what moves need in the control schema (shardctl.moves, the guard function) on a host
    initialised before they existed: the control-schema template again, whose statements are idempotent.
    Call under the host lock (concurrent CREATE IF NOT EXISTS can collide)."""
    ready = conn.execute(
        "SELECT to_regclass('shardctl.moves') IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
        "AND to_regclass('shardctl.redirects') IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
        "AND to_regprocedure(%s) IS NOT NULL",
        (f"{GUARD_FUNCTION}()", f"{STUB_READ_FUNCTION}(text)", f"{STUB_PLAN_FUNCTION}(text)"),
    ).fetchone()[0]
    if not ready:
        with conn.transaction():
            conn.execute(render_control())


def move_records(conn: psycopg.Connection) -> list[tuple]:
    """This host's records of moves: (move_id, shards, source, target, role, phase, detail, started, updated)."""
    if not moves_table_exists(conn):
        return []
    return conn.execute(
        "SELECT move_id, shards, source, target, role, phase, detail, started_at, updated_at "
        "FROM shardctl.moves ORDER BY started_at"
    ).fetchall()


def record_move(
    conn: psycopg.Connection,
    move_id: str,
    shards: str,
    source: str,
    target: str,
    role: str,
    phase: str,
    detail: dict,
    finished: list[str],
) -> None:
    """Insert or update this host's record of a move; ``finished`` phases stamp finished_at."""
    conn.execute(
        """INSERT INTO shardctl.moves (move_id, shards, source, target, role, phase, detail)
           VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb)
           ON CONFLICT (move_id) DO UPDATE SET phase = EXCLUDED.phase,
                  detail = shardctl.moves.detail || EXCLUDED.detail, updated_at = clock_timestamp(),
                  finished_at = CASE WHEN EXCLUDED.phase = ANY(%s) THEN clock_timestamp() END""",
        (move_id, shards, source, target, role, str(phase), dumps(detail), finished),
    )


def dsn_without_password(dsn: str) -> str:
    """The DSN as recorded for other readers: every part but the password."""
    parts = pg_conninfo.conninfo_to_dict(dsn)
    parts.pop("password", None)
    return pg_conninfo.make_conninfo(**parts)


def write_redirects(
    conn: psycopg.Connection,
    shards: list[int],
    schemas: list[str],
    host: str,
    dsn: str,
    move_id: str,
) -> None:
    """Record on this host that ``shards`` (schemas ``schemas`` there) now live on ``host``."""
    conn.execute(
        """INSERT INTO shardctl.redirects (shard_id, schema_name, host, dsn, move_id)
           SELECT r.id, r.name, %s, %s, %s FROM unnest(%s::int[], %s::text[]) AS r(id, name)
           ON CONFLICT (shard_id) DO UPDATE SET schema_name = EXCLUDED.schema_name, host = EXCLUDED.host,
                  dsn = EXCLUDED.dsn, move_id = EXCLUDED.move_id, at = clock_timestamp()""",
        (host, dsn_without_password(dsn), move_id, shards, schemas),
    )


def clear_redirects(conn: psycopg.Connection, shards: list[int]) -> None:
    """This host holds ``shards`` (again): forget where they had gone."""
    if conn.execute("SELECT to_regclass('shardctl.redirects') IS NOT NULL").fetchone()[0]:
        conn.execute("DELETE FROM shardctl.redirects WHERE shard_id = ANY(%s)", (shards,))


def read_redirects(conn: psycopg.Connection, shards: list[int]) -> dict[int, dict]:
    """Where ``shards`` went, as recorded on this host: shard → {host, dsn (no password), schema, move_id,
    at}. Empty for shards that never left it (or a host without the table). For Routers whose topology
    file is stale: connect to ``host`` with the secret of their own topology's entry for it."""
    if not conn.execute(HAS_REDIRECTS_SQL).fetchone()[0]:
        return {}
    return redirects_by_shard(conn.execute(REDIRECTS_SQL, (shards,)).fetchall())


HAS_REDIRECTS_SQL = "SELECT to_regclass('shardctl.redirects') IS NOT NULL"
REDIRECTS_SQL = "SELECT shard_id, host, dsn, schema_name, move_id, at FROM shardctl.redirects WHERE shard_id = ANY(%s)"


def redirects_by_shard(rows: list) -> dict[int, dict]:
    """:func:`read_redirects`' answer from the rows of REDIRECTS_SQL (for the asyncio Router's own query)."""
    return {
        r[0]: {"host": r[1], "dsn": r[2], "schema": r[3], "move_id": r[4], "at": r[5]} for r in rows
    }


def create_moved_stubs(conn: psycopg.Connection, stubs: dict[str, tuple[str, str]]) -> int:
    """A stub schema named by each key for the shard schema ``value[0]``: one view per table with the
    table's columns, and a ``next_id()``, whose reads, writes and calls raise SQLSTATE SCM01 with the
    message ``value[1]`` (it names the new host), so direct clients (psql, other languages) are told where the shard went once the stub
    takes the shard's old name (:func:`place_moved_stubs`). Marked by its comment (:data:`STUB_COMMENT`);
    stubs that exist already are kept. Returns the number of views made."""
    present = present_schemas(conn, list(stubs))
    stubs = {k: v for k, v in stubs.items() if k not in present}
    if not stubs:
        return 0
    old_of = {new: (old, message) for old, (new, message) in stubs.items()}
    rows = conn.execute(
        """SELECT n.nspname, c.relname,
                  array_agg(format('NULL::%%s AS %%I', format_type(a.atttypid, a.atttypmod), a.attname)
                            ORDER BY a.attnum) FILTER (WHERE a.attnum IS NOT NULL)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
            GROUP BY 1, 2 ORDER BY 1, 2""",
        (list(old_of),),
    ).fetchall()
    parts = []
    for old, (_new, message) in stubs.items():
        schema = quote_ident(old)
        parts.append(
            f"CREATE SCHEMA {schema};\nCOMMENT ON SCHEMA {schema} IS "
            f"{quote_literal(f'{STUB_COMMENT}: {message}')};\nGRANT USAGE ON SCHEMA {schema} TO PUBLIC;\n"
            # A direct client minting IDs on the old host is told too.
            f"CREATE FUNCTION {schema}.next_id() RETURNS bigint LANGUAGE sql VOLATILE AS "
            f"{quote_literal(f'SELECT count(*)::bigint FROM {STUB_READ_FUNCTION}({quote_literal(message)})')};\n"
        )
    for renamed, table, columns in rows:
        old, message = old_of[renamed]
        view, text = f"{quote_ident(old)}.{quote_ident(table)}", quote_literal(message)
        # The WHERE raises when a query reading the view is planned: the planner cannot skip it as it could
        # skip the scan (a filter on the NULL columns folds to false, and so do WHERE false and LIMIT 0).
        parts.append(
            f"CREATE VIEW {view} AS SELECT {', '.join(columns or ['NULL AS none'])} "
            f"FROM {STUB_READ_FUNCTION}({text}) WHERE {STUB_PLAN_FUNCTION}({text});\n"
            f"CREATE TRIGGER {GUARD_TRIGGER} INSTEAD OF INSERT OR UPDATE OR DELETE ON {view} FOR EACH ROW "
            f"EXECUTE FUNCTION {GUARD_FUNCTION}({text});\n"
            # The row trigger makes the view writable; this one fires first, for writes of no row too.
            f"CREATE TRIGGER {GUARD_TRIGGER}_statement BEFORE INSERT OR UPDATE OR DELETE ON {view} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_FUNCTION}({text});\n"
        )
    # Anyone may try: a client without rights on the old tables is told where the shard went, too.
    parts += [
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quote_ident(old)} TO PUBLIC;\n"
        for old in stubs
    ]
    conn.execute("".join(parts))
    return len(rows)


def place_moved_stubs(conn: psycopg.Connection, names: dict[str, str]) -> None:
    """Rename each stub (key) to the moved shard's old schema name (value): in the cutover's transaction,
    after the shard schema itself was renamed (renames are cheap; making the views is not)."""
    conn.execute(
        "".join(
            f"ALTER SCHEMA {quote_ident(k)} RENAME TO {quote_ident(v)};\n" for k, v in names.items()
        )
    )


def drop_moved_stubs(conn: psycopg.Connection, schemas: list[str]) -> list[str]:
    """Drop the stubs among ``schemas`` (only schemas marked as stubs, never a shard); returns them."""
    doomed = [
        r[0]
        for r in conn.execute(
            f"SELECT nspname FROM pg_namespace n WHERE nspname = ANY(%s) AND NOT {NOT_STUB}",
            (schemas,),
        ).fetchall()
    ]
    if doomed:
        conn.execute("".join(f"DROP SCHEMA {quote_ident(s)} CASCADE;\n" for s in doomed))
    return doomed


def ledger_rows(conn: psycopg.Connection, shards: list[int]) -> list[tuple]:
    """(shard_id, version, description, checksum, duration_ms, applied_at, applied_by) of these shards."""
    return conn.execute(
        """SELECT shard_id, version, description, checksum, duration_ms, applied_at, applied_by
             FROM shardctl.migrations WHERE shard_id = ANY(%s) ORDER BY shard_id, version""",
        (shards,),
    ).fetchall()


def change_shard_states(conn: psycopg.Connection, shards: list[int], old: str, new: str) -> int:
    """Shards in state ``old`` go to ``new``; returns how many did."""
    return conn.execute(
        "UPDATE shardctl.shards SET state = %s WHERE shard_id = ANY(%s) AND state = %s",
        (str(new), shards, str(old)),
    ).rowcount


def set_shard_states(
    conn: psycopg.Connection, shards: list[int], state: str, schemas: list[str]
) -> None:
    """Set the state and schema name of each shard (``schemas`` in the order of ``shards``)."""
    conn.execute(
        "UPDATE shardctl.shards AS s SET state = %s, schema_name = r.name "
        "FROM unnest(%s::int[], %s::text[]) AS r(id, name) WHERE s.shard_id = r.id",
        (str(state), shards, schemas),
    )


def drop_shard_schemas(
    conn: psycopg.Connection, schemas: list[str], shards: list[int], state: str
) -> None:
    """Drop ``schemas`` and forget the shards' ledger and their shard rows in ``state`` (one batch)."""
    conn.execute("".join(f"DROP SCHEMA IF EXISTS {quote_ident(s)} CASCADE;\n" for s in schemas))
    conn.execute("DELETE FROM shardctl.migrations WHERE shard_id = ANY(%s)", (shards,))
    conn.execute(
        "DELETE FROM shardctl.shards WHERE shard_id = ANY(%s) AND state = %s", (shards, str(state))
    )


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
            "LOCK TABLE "
            + ", ".join(
                f"{quote_ident(s)}.{quote_ident(t)}" for s, t in items[i : i + per_statement]
            )
            + f" IN {mode} MODE"
        )


def copy_tables(
    frm: psycopg.Connection,
    into: psycopg.Connection,
    pairs: list[tuple[tuple[str, str], tuple[str, str]]],
    truncate: bool = False,
    progress=None,
) -> None:
    """COPY each (from table, into table) pair in binary; ``truncate`` empties the destinations first."""
    if truncate and pairs:
        into.execute(
            "TRUNCATE " + ", ".join(f"{quote_ident(s)}.{quote_ident(t)}" for _, (s, t) in pairs)
        )
    with copy_encoding(frm, into):
        for i, ((fs, ft), (ts, tt)) in enumerate(pairs, 1):
            with (
                frm.cursor().copy(
                    f"COPY {quote_ident(fs)}.{quote_ident(ft)} TO STDOUT (FORMAT binary)"
                ) as out,
                into.cursor().copy(
                    f"COPY {quote_ident(ts)}.{quote_ident(tt)} FROM STDIN (FORMAT binary)"
                ) as dst,
            ):
                for data in out:
                    dst.write(data)
            if progress:
                progress(i)


@contextmanager
def copy_encoding(frm: psycopg.Connection, into: psycopg.Connection) -> Iterator[None]:
    """For the block, both connections' ``client_encoding`` is ``into``'s database encoding: text in a
    COPY then crosses as logical replication sends it (its apply worker asks the publisher for the
    subscriber database's encoding), and between databases of one encoding byte for byte, with no
    conversion or validation: a SQL_ASCII database's bytes need not be UTF-8. The block should run
    COPYs only (psycopg reads SQL_ASCII text as bytes); each connection's encoding is restored after
    it (unless its transaction failed: the rollback restores it)."""
    encoding = into.info.parameter_status("server_encoding") or "UTF8"
    saved = [
        (conn, conn.info.parameter_status("client_encoding") or "UTF8") for conn in (frm, into)
    ]
    for conn, _ in saved:
        conn.execute("SELECT set_config('client_encoding', %s, false)", (encoding,))
    try:
        yield
    finally:
        for conn, before in saved:
            if not conn.closed and conn.info.transaction_status in (
                psycopg.pq.TransactionStatus.IDLE,
                psycopg.pq.TransactionStatus.INTRANS,
            ):
                conn.execute("SELECT set_config('client_encoding', %s, false)", (before,))


def server_facts(conn: psycopg.Connection) -> dict:
    """Version, replication settings and how much of them is in use on this server; the database's encoding."""
    row = conn.execute(
        """SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
                  current_setting('max_replication_slots')::int,
                  (SELECT count(*) FROM pg_replication_slots)::int,
                  current_setting('max_wal_senders')::int,
                  current_setting('max_logical_replication_workers')::int,
                  current_setting('log_statement'),
                  (SELECT count(*) FROM pg_stat_replication)::int,
                  greatest((SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL),
                           (SELECT count(*) FROM pg_subscription WHERE subenabled))::int,
                  current_setting('max_sync_workers_per_subscription')::int,
                  current_setting('server_encoding')"""
    ).fetchone()
    return {
        "version_num": row[0],
        "wal_level": row[1],
        "max_replication_slots": row[2],
        "slots_used": row[3],
        "max_wal_senders": row[4],
        "max_logical_replication_workers": row[5],
        "log_statement": row[6],
        "senders_used": row[7],
        "workers_used": row[8],
        "max_sync_workers_per_subscription": row[9],
        "server_encoding": row[10],
    }


def role_facts(conn: psycopg.Connection, schemas: list[str]) -> dict:
    """What the connected role may do for a move: superuser, REPLICATION, CREATE on the database,
    pg_create_subscription membership, and how many tables in ``schemas`` it does not own."""
    row = conn.execute(
        """SELECT current_user, r.rolsuper, r.rolreplication,
                  has_database_privilege(current_database(), 'CREATE'),
                  CASE WHEN to_regrole('pg_create_subscription') IS NULL THEN false
                       ELSE pg_has_role(current_user, to_regrole('pg_create_subscription'), 'MEMBER') END,
                  pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
                  (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p')
                      AND NOT pg_has_role(current_user, c.relowner, 'USAGE'))::int
             FROM pg_roles r WHERE r.rolname = current_user""",
        (schemas,),
    ).fetchone()
    return {
        "name": row[0],
        "superuser": row[1],
        "replication": row[2],
        "create_on_database": row[3],
        "create_subscription": row[4],
        "read_all_stats": row[5],
        "tables_not_owned": row[6],
    }


# ---- what the schemas hold --------------------------------------------------------------


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


def checksums(
    conn: psycopg.Connection,
    items: list[tuple[str, str]],
    *,
    rows_only: bool = False,
    pause: Callable[[], None] | None = None,
) -> dict[tuple[str, str], tuple[int, str]]:
    """(schema, table) → (row count, checksum of the rows). Order-independent: a sum of 64-bit hashes of
    each row, so no sort is needed. ``rows_only``: the row count alone (about 4x cheaper; the
    checksum is then the constant ``'n'``). ``pause``: called between queries, which then take
    PACED_CHUNK tables each (a move's ``--nice``).

    Rows are hashed with ``hash_record_extended`` (each column's own hash function, as hash partitioning
    uses: stable across PostgreSQL versions, and about 4x faster than hashing the row's text). A chunk
    with a column type that has no hash function (point, json…) hashes the rows' text instead, with the
    session's text settings pinned; the method is part of the checksum, so both hosts must agree on it."""
    if not rows_only:  # the text fallback hashes rows' text: pin the settings that shape it
        conn.execute(STABLE_TEXT)
    out: dict[tuple[str, str], tuple[int, str]] = {}
    step = PACED_CHUNK if pause else CHUNK
    for i in range(0, len(items), step):
        if pause and i:
            pause()
        chunk = items[i : i + step]
        rows = (
            conn.execute(_checksum_query(chunk, None, "n")).fetchall()
            if rows_only
            else _hashed_rows(conn, chunk)
        )
        if (
            rows is None
        ):  # some table of the chunk cannot be hashed by column: find which, one by one
            rows = []
            for item in chunk:
                rows += (
                    _hashed_rows(conn, [item])
                    or conn.execute(
                        _checksum_query([item], "hashtextextended(x::text, 0)", "t")
                    ).fetchall()
                )
        for schema, table, count, total in rows:
            out[(schema, table)] = (count, total)
    return out


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


def write_grants(conn: psycopg.Connection, schemas: list[str]) -> list[list[str]]:
    """[schema, table, grantee (SQL: a quoted role or PUBLIC), privilege] for every write privilege but the
    owner's (the guard trigger stops the owner; revoking its own rights would hide the guard's message
    behind "permission denied" when the fleet's role owns the tables, as on managed Postgres)."""
    return [
        list(r)
        for r in conn.execute(
            """SELECT n.nspname, c.relname,
                  CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                  a.privilege_type
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
                  aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
            WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND a.privilege_type = ANY(%s)
              AND a.grantee <> c.relowner
            ORDER BY 1, 2, 3, 4""",
            (schemas, list(WRITE_PRIVILEGES)),
        ).fetchall()
    ]


def grant_sql(grants: list[list[str]], revoke: bool, rename: dict[str, str] | None = None) -> str:
    """REVOKE (or GRANT back) the recorded write privileges; ``rename`` maps recorded schema names to current ones."""
    rename = rename or {}
    out = []
    for schema, table, grantee, privilege in grants:
        if privilege not in WRITE_PRIVILEGES:
            continue
        target = f"{quote_ident(rename.get(schema, schema))}.{quote_ident(table)}"
        if revoke:
            out.append(f"REVOKE {privilege} ON {target} FROM {grantee};\n")
        else:
            out.append(f"GRANT {privilege} ON {target} TO {grantee};\n")
    return "".join(out)


def guard_sql(schema: str, table: str, message: str) -> str:
    return (
        f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON "
        f"{quote_ident(schema)}.{quote_ident(table)} FOR EACH STATEMENT EXECUTE FUNCTION "
        f"{GUARD_FUNCTION}({quote_literal(message)});\n"
    )


def unguard_sql(schema: str, table: str) -> str:
    return (
        f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON {quote_ident(schema)}.{quote_ident(table)};\n"
    )


def now_ms(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[
        0
    ]


# ---- publications, slots, subscriptions -------------------------------------------------


def publication_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)", (name,)
    ).fetchone()[0]


def create_publication(
    conn: psycopg.Connection, name: str, schemas: list[str], by_table: bool = False
) -> None:
    """A publication of every table in ``schemas``: ``FOR TABLES IN SCHEMA`` (superuser only), or, for
    ``by_table`` (a role that owns the tables, as on managed Postgres), ``FOR TABLE`` naming each."""
    if not by_table:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLES IN SCHEMA {}").format(
                sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(s) for s in schemas)
            )
        )
        return
    names = [sql.Identifier(s, t) for s, t in tables(conn, schemas, "r")]
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(names)
        )
    )


def drop_publications(conn: psycopg.Connection, names: list[str]) -> list[str]:
    dropped = []
    for name in names:
        if publication_exists(conn, name):
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
            dropped.append(name)
    return dropped


def slot_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", (name,)
    ).fetchone()[0]


def create_slot(conn: psycopg.Connection, name: str) -> None:
    """A logical slot for a subscription, made on the publisher first (so source and target may
    even be two databases of one server, where CREATE SUBSCRIPTION could not make it)."""
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


def move_slots(conn: psycopg.Connection, names: list[str], sub_oids: list[int]) -> list[str]:
    """The slots a move made on the publisher: its subscriptions' slots and their table-sync slots."""
    patterns = [f"pg\\_{int(oid)}\\_sync\\_%" for oid in sub_oids]
    return [
        r[0]
        for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s) OR slot_name LIKE ANY(%s)",
            (names, patterns),
        ).fetchall()
    ]


def drop_slots(
    conn: psycopg.Connection, names: list[str], sub_oids: list[int], timeout: float = 30
) -> list[str]:
    """Drop the move's slots on the publisher, ending a walsender that still holds one."""
    dropped: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        left = move_slots(conn, names, sub_oids)
        if not left:
            return dropped
        for slot in left:
            pid = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            try:
                if pid and pid[0]:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid[0],))
                    continue
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                dropped.append(slot)
            except psycopg.errors.ObjectInUse:
                pass
            except psycopg.errors.UndefinedObject:
                pass
        if time.monotonic() > deadline:
            left = move_slots(conn, names, sub_oids)
            if left:
                raise psycopg.OperationalError(f"replication slots still in use: {', '.join(left)}")
            return dropped
        time.sleep(0.1)


def subscriptions(conn: psycopg.Connection, names: list[str]) -> dict[str, int]:
    """name → oid of the named subscriptions in this database."""
    return dict(
        conn.execute(
            """SELECT subname, oid::int FROM pg_subscription
            WHERE subname = ANY(%s) AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())""",
            (names,),
        ).fetchall()
    )


def create_subscription(
    conn: psycopg.Connection, name: str, conninfo: str, copy_data: bool = True, start: bool = True
) -> None:
    """Create the subscription without connecting (``connect = false``): the one statement that holds
    the publisher's password cannot fail on the network, so the server never logs it with an error.
    :func:`start_subscription` then connects, in statements that carry no secret."""
    conn.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH "
            "(connect = false, enabled = false, create_slot = false, slot_name = {})"
        ).format(
            sql.Identifier(name), sql.Literal(conninfo), sql.Identifier(name), sql.Literal(name)
        )
    )
    if start:
        start_subscription(conn, name, copy_data)


def probe_subscription(
    conn: psycopg.Connection, name: str, conninfo: str, publication: str
) -> None:
    """Make this server open a replication connection with ``conninfo``, as a subscription's would:
    CREATE SUBSCRIPTION with ``connect = true`` and no slot (``slot_name = NONE``), so nothing is made on
    the publisher. Run it in a transaction the caller rolls back: nothing outlives it here either.
    Raises psycopg's error when the server cannot connect (its first line says why)."""
    conn.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (connect = true, "
            "enabled = false, create_slot = false, slot_name = NONE, copy_data = false)"
        ).format(sql.Identifier(name), sql.Literal(conninfo), sql.Identifier(publication))
    )


def start_subscription(
    conn: psycopg.Connection,
    name: str,
    copy_data: bool = True,
    hold: psycopg.Connection | None = None,
    tables: list[tuple[str, str]] | None = None,
) -> None:
    """Enable a subscription made by :func:`create_subscription` and fetch its tables (the initial copy
    starts). Idempotent: a subscription already enabled and with tables is left alone.

    Without the subscription's copy (``copy_data`` false: the rows were copied as of the slot's snapshot),
    ``hold`` (a second, non-autocommit connection to the same database) must hold SHARE locks on the
    subscription's ``tables`` from before ENABLE until REFRESH has committed. ENABLE starts the apply
    worker, and REFRESH (which cannot share a transaction with it) registers the tables: until then the
    worker skips the changes of tables it does not know (worker.c, should_apply_changes_for_rel: state
    unknown) and still confirms them, so rows written in between would never reach the target while
    ``replay_lsn`` says they did (a lost write that the freeze's lag-0 wait cannot see). With the locks,
    the worker waits on its first change (it opens the table in ROW EXCLUSIVE mode) and reads the table's
    state only once the lock is granted, after REFRESH committed (REFRESH takes ACCESS SHARE only)."""
    enabled, rels = _subscription_state(conn, name)
    ident = sql.Identifier(name)
    held = not copy_data and not rels
    if held:
        if hold is None or not tables:
            raise ValueError("start_subscription without copy_data needs hold and tables")
        lock_tables(hold, tables, mode="SHARE")
    try:
        if not enabled:
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} ENABLE").format(ident))
        if not rels:
            conn.execute(
                sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = {})").format(
                    ident, sql.SQL("true" if copy_data else "false")
                )
            )
    finally:
        if held:
            hold.rollback()  # the locks go; the apply worker reads the tables' state (ready) after this


def started_without_tables(conn: psycopg.Connection, name: str) -> bool:
    """True for a subscription left enabled with no tables registered: a run stopped between the ENABLE
    and the REFRESH of :func:`start_subscription`, after which its apply worker may have skipped (and
    confirmed) changes."""
    enabled, rels = _subscription_state(conn, name)
    return enabled and not rels


def _subscription_state(conn: psycopg.Connection, name: str) -> tuple[bool, int]:
    """(enabled, tables registered) of a subscription; (False, 0) when there is none."""
    row = conn.execute(
        """SELECT s.subenabled, (SELECT count(*) FROM pg_subscription_rel r WHERE r.srsubid = s.oid)
             FROM pg_subscription s WHERE s.subname = %s""",
        (name,),
    ).fetchone()
    return (bool(row[0]), int(row[1])) if row else (False, 0)


def disable_subscription(conn: psycopg.Connection, name: str, timeout: float = 30) -> None:
    """Disable a subscription and wait until its apply worker has exited."""
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(sql.Identifier(name)))
    deadline = time.monotonic() + timeout
    while conn.execute(
        """SELECT count(*) FROM pg_stat_subscription st JOIN pg_subscription s ON s.oid = st.subid
                           WHERE s.subname = %s AND st.pid IS NOT NULL""",
        (name,),
    ).fetchone()[0]:
        if time.monotonic() > deadline:
            raise psycopg.OperationalError(
                f"the apply worker of subscription {name} did not stop within {timeout:g}s"
            )
        time.sleep(0.05)


def drop_subscription(conn: psycopg.Connection, name: str) -> str:
    """Drop a subscription and its slot on the publisher. When the publisher cannot be reached,
    detach the slot first (the caller then drops the slot on the publisher itself).
    Returns 'dropped', 'detached' or 'absent'."""
    if name not in subscriptions(conn, [name]):
        return "absent"
    ident = sql.Identifier(name)
    try:
        conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(ident))
        return "dropped"
    except psycopg.Error:
        if not conn.autocommit and not conn.broken:
            conn.rollback()
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
    conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(ident))
    return "detached"


def sync_state(conn: psycopg.Connection, names: list[str]) -> dict:
    """Table states of the subscriptions: counts by state letter, and error counters."""
    states: dict[str, int] = {}
    for state, count in conn.execute(
        """SELECT r.srsubstate::text, count(*)::int FROM pg_subscription s
                 JOIN pg_subscription_rel r ON r.srsubid = s.oid
                WHERE s.subname = ANY(%s) GROUP BY 1""",
        (names,),
    ).fetchall():
        states[state] = count
    errors = conn.execute(
        """SELECT coalesce(sum(apply_error_count), 0)::bigint, coalesce(sum(sync_error_count), 0)::bigint
             FROM pg_stat_subscription_stats WHERE subname = ANY(%s)""",
        (names,),
    ).fetchone()
    return {
        "states": states,
        "ready": states.get("r", 0),
        "tables": sum(states.values()),
        "apply_errors": errors[0],
        "sync_errors": errors[1],
    }


def slot_lag(conn: psycopg.Connection, names: list[str]) -> int | None:
    """Bytes of WAL the subscriptions have yet to confirm (the largest over the move's slots)."""
    row = conn.execute(
        """SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(confirmed_flush_lsn, restart_lsn)))::bigint,
                  count(*)
             FROM pg_replication_slots WHERE slot_name = ANY(%s)""",
        (names,),
    ).fetchone()
    return None if not row[1] else max(0, int(row[0] or 0))


def replayed(conn: psycopg.Connection, names: list[str], lsn: str) -> bool:
    """True when every subscription's walsender reports having applied WAL up to ``lsn``.

    The walsender is found by its slot (not by application_name, which a DSN may set)."""
    row = conn.execute(
        """SELECT count(*) FILTER (WHERE r.replay_lsn >= %s::pg_lsn), count(*)
             FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
            WHERE s.slot_name = ANY(%s)""",
        (lsn, names),
    ).fetchone()
    return row[1] == len(names) and row[0] == len(names)


def dumps(value: object) -> str:
    return json.dumps(value, default=str)


# ======================================================================================
# Shard list and ledger reads (init, migrate, status, grow, moves): one place for each query.
# ======================================================================================


@dataclass
class ShardRow:
    """A shard recorded in a host's control schema, with its migration versions."""

    shard: int
    schema: str
    state: str
    version: int  # highest applied version (0: none)
    applied: int = 0  # how many versions the ledger holds for the shard

    @property
    def has_gap(self) -> bool:
        return self.applied != self.version


def control_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl.migrations') IS NOT NULL").fetchone()[0]


def shard_list(conn: psycopg.Connection) -> dict[int, ShardRow]:
    """Every shard recorded on the host with its highest applied version and version count: one query
    ({} when the host has no control schema)."""
    if not control_exists(conn):
        return {}
    rows = conn.execute(
        """SELECT s.shard_id, s.schema_name, s.state, coalesce(max(m.version), 0), count(m.version)
             FROM shardctl.shards s LEFT JOIN shardctl.migrations m USING (shard_id)
            GROUP BY 1, 2, 3"""
    ).fetchall()
    return {r[0]: ShardRow(r[0], r[1], r[2], r[3], r[4]) for r in rows}


def applied_versions(conn: psycopg.Connection) -> set[int]:
    """Every version the host's ledger records for any shard."""
    return {
        r[0] for r in conn.execute("SELECT DISTINCT version FROM shardctl.migrations").fetchall()
    }


def last_event(conn: psycopg.Connection) -> str | None:
    row = conn.execute(
        """SELECT kind || ' at ' || to_char(at, 'YYYY-MM-DD HH24:MI:SS') || coalesce(' (' || shards || ')', '')
             FROM shardctl.events ORDER BY id DESC LIMIT 1"""
    ).fetchone()
    return row[0] if row else None


def schema_names(conn: psycopg.Connection) -> set[str]:
    """Every schema of the database but the stubs left under moved shards' old names."""
    return {
        r[0]
        for r in conn.execute(f"SELECT nspname FROM pg_namespace n WHERE {NOT_STUB}").fetchall()
    }


def ledger_versions(conn: psycopg.Connection, shards: list[int]) -> dict[int, list[int]]:
    """Shard → the versions its ledger holds (for the shards given)."""
    return {
        s: list(v)
        for s, v in conn.execute(
            "SELECT shard_id, array_agg(version) FROM shardctl.migrations WHERE shard_id = ANY(%s) GROUP BY 1",
            (shards,),
        ).fetchall()
    }


def open_moves(conn: psycopg.Connection) -> list[tuple[str, str, str, str]]:
    """Unfinished moves recorded on the host: (shards, source, target, phase)."""
    if not moves_table_exists(conn):
        return []
    return [
        tuple(r)
        for r in conn.execute(
            "SELECT shards, source, target, phase FROM shardctl.moves WHERE finished_at IS NULL "
            "ORDER BY started_at"
        ).fetchall()
    ]


def subscription_problems(conn: psycopg.Connection, names: list[str]) -> list[str]:
    """Why the named subscriptions are not applying, as the subscriber's server sees it: disabled, no
    apply worker running, table-sync workers waiting for a free worker slot, error counters."""
    out = []
    for name, enabled, workers, syncing, apply_errors, sync_errors in conn.execute(
        """SELECT s.subname, s.subenabled,
                      (SELECT count(*) FROM pg_stat_subscription w WHERE w.subid = s.oid AND w.pid IS NOT NULL
                          AND w.relid IS NULL)::int,
                      (SELECT count(*) FROM pg_stat_subscription w WHERE w.subid = s.oid AND w.relid IS NOT NULL)::int,
                      coalesce(st.apply_error_count, 0), coalesce(st.sync_error_count, 0)
                 FROM pg_subscription s LEFT JOIN pg_stat_subscription_stats st ON st.subid = s.oid
                WHERE s.subname = ANY(%s) ORDER BY 1""",
        (names,),
    ).fetchall():
        if not enabled:
            out.append(f"subscription {name} is disabled")
        elif not workers:
            out.append(f"subscription {name} has no apply worker running")
        if apply_errors or sync_errors:
            out.append(
                f"subscription {name} has {apply_errors} apply and {sync_errors} table-sync errors"
            )
    workers = conn.execute(
        """SELECT current_setting('max_logical_replication_workers')::int,
                  (SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)::int"""
    ).fetchone()
    if workers[1] >= workers[0]:
        out.append(
            f"all {workers[0]} logical replication workers are busy (max_logical_replication_workers)"
        )
    return out


def id_sequence_settings(conn: psycopg.Connection, schemas: list[str]) -> dict[str, dict]:
    """schema → cache_size and increment_by of its ``next_id_seq`` (what verify checks: CACHE 1, INCREMENT 1)."""
    return {
        r[0]: {"cache_size": r[1], "increment_by": r[2]}
        for r in conn.execute(
            """SELECT schemaname, cache_size, increment_by FROM pg_sequences
            WHERE sequencename = 'next_id_seq' AND schemaname = ANY(%s)""",
            (schemas,),
        ).fetchall()
    }


# ---- template functions (``redeploy``) ------------------------------------------------------

TEMPLATE_LEDGER = """CREATE TABLE IF NOT EXISTS shardctl.templates (
    shard_id     integer NOT NULL,
    object       text NOT NULL,
    checksum     text NOT NULL,
    deployed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    deployed_by  text NOT NULL DEFAULT current_user,
    PRIMARY KEY (shard_id, object)
)"""


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


def ensure_template_ledger(conn: psycopg.Connection) -> None:
    """``shardctl.templates``: one row per shard and re-deployed template function."""
    conn.execute(TEMPLATE_LEDGER)


def record_template(conn: psycopg.Connection, shard: int, obj: str, checksum: str) -> None:
    conn.execute(
        """INSERT INTO shardctl.templates (shard_id, object, checksum) VALUES (%s, %s, %s)
                    ON CONFLICT (shard_id, object) DO UPDATE SET checksum = excluded.checksum,
                        deployed_at = clock_timestamp(), deployed_by = current_user""",
        (shard, obj, checksum),
    )


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


def create_slot_with_snapshot(repl: psycopg.Connection, name: str) -> tuple[str, str]:
    """On a replication connection (``replication=database``): a logical slot for a subscription, with
    its consistent point exported as a snapshot. Returns (consistent LSN, snapshot name); the snapshot
    lives as long as ``repl`` stays open and idle. (Replication commands need the simple query
    protocol: libpq's PQexec.)"""
    command = f"CREATE_REPLICATION_SLOT {quote_ident(name)} LOGICAL pgoutput (SNAPSHOT 'export')"
    res = repl.pgconn.exec_(command.encode())
    if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
        message = (res.error_message or b"").decode(errors="replace").strip()
        raise psycopg.OperationalError(f"CREATE_REPLICATION_SLOT {name}: {message}")
    return res.get_value(0, 1).decode(), res.get_value(0, 2).decode()


def copy_in_snapshot(
    src: psycopg.Connection,
    tgt: psycopg.Connection,
    snapshot: str,
    items: list[tuple[str, str]],
    progress=None,
    pause: Callable[[], None] | None = None,
) -> int:
    """Copy each (schema, table) from ``src`` as of ``snapshot`` into the same (empty) table on ``tgt``,
    in binary, in one target transaction. Returns bytes copied. ``pause``: called after every
    PAUSE_BYTES copied (a move's ``--nice``)."""
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    src.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot)}")
    copied = 0
    next_pause = PAUSE_BYTES if pause else -1
    with tgt.transaction(), copy_encoding(src, tgt):
        for schema, table in items:
            name = f"{quote_ident(schema)}.{quote_ident(table)}"
            with (
                src.cursor().copy(f"COPY {name} TO STDOUT (FORMAT binary)") as out,
                tgt.cursor().copy(f"COPY {name} FROM STDIN (FORMAT binary)") as into,
            ):
                for data in out:
                    copied += len(data)
                    into.write(data)
                    if copied > next_pause > 0:
                        pause()
                        next_pause = copied + PAUSE_BYTES
            if progress:
                progress(1)
    src.execute("COMMIT")
    return copied


def truncate_tables(conn: psycopg.Connection, items: list[tuple[str, str]]) -> None:
    if items:
        conn.execute(
            "TRUNCATE " + ", ".join(f"{quote_ident(s)}.{quote_ident(t)}" for s, t in items)
        )


# ======================================================================================
# Capacity (how many connections may apply shards at once) and fleet-wide set-based reads.
# ======================================================================================


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


# verify: one row per host with its version, clock, whether the control schema exists, and every schema name
# (but the stubs under moved shards' old names).
VERIFY_HOST_SQL = f"""SELECT current_setting('server_version'), extract(epoch FROM clock_timestamp())::float8,
       to_regclass('shardctl.migrations') IS NOT NULL,
       array(SELECT nspname::text FROM pg_namespace n WHERE {NOT_STUB})"""


def active_shard_ids(conn: psycopg.Connection) -> set[int]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT shard_id FROM shardctl.shards WHERE state = 'active'"
        ).fetchall()
    }


# A next_id() body with its shard's schema name and shard number (as a whole number) taken out: the
# same for every shard rendered from one template, whatever its number. Linear in the rows: one fixed
# pattern (compiled once per query, not once per row) brackets every run of digits, so the shard number
# as a whole number is a plain replace of '<N>'.
_SHAPE = (
    "md5(replace(regexp_replace(replace({body}, {schema}, '{{schema}}'), '([0-9]+)', '<\\1>', 'g'), "
    "'<' || {shard}::text || '>', '{{shard}}'))"
)
# A schema's next_id(): the whole key of pg_proc's (proname, proargtypes, pronamespace) index, so a
# nested-loop plan (stale catalog statistics right after init) looks each one up instead of scanning
# every shard's next_id() per shard.
_NEXT_ID = "p.proname = 'next_id' AND p.proargtypes = ''::oidvector"


def next_id_shapes(
    conn: psycopg.Connection,
    schemas: list[str],
    shards: list[int],
    expected: tuple[list[str], list[str], list[int]],
) -> tuple[dict[str | None, list[int]], set[str], list[int]]:
    """Every shard's next_id() shape (None: no next_id()) → its shards, the shapes of the ``expected``
    (bodies, schemas, shards) renderings, and the shards without a ``next_id_seq`` sequence: two
    set-based queries."""
    shape = _SHAPE.format(body="p.prosrc", schema="u.schema", shard="u.shard")
    rows = conn.execute(
        f"""SELECT {shape}, array_agg(u.shard),
                   array_agg(u.shard) FILTER (WHERE NOT EXISTS (
                       SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'next_id_seq'
                          AND c.relkind = 'S'))
              FROM unnest(%s::text[], %s::int[]) AS u(schema, shard)
              LEFT JOIN pg_namespace n ON n.nspname = u.schema
              LEFT JOIN pg_proc p ON p.pronamespace = n.oid AND {_NEXT_ID}
             GROUP BY 1""",
        (schemas, shards),
    ).fetchall()
    known = conn.execute(
        f"SELECT DISTINCT {_SHAPE.format(body='e.body', schema='e.schema', shard='e.shard')} "
        "FROM unnest(%s::text[], %s::text[], %s::int[]) AS e(body, schema, shard)",
        expected,
    ).fetchall()
    no_sequence = [n for r in rows for n in (r[2] or [])]
    return {r[0]: list(r[1]) for r in rows}, {r[0] for r in known}, no_sequence


def next_id_bodies(conn: psycopg.Connection, schemas: list[str]) -> dict[str, str]:
    """Schema → its next_id() body (``pg_proc.prosrc``), for the schemas given."""
    if not schemas:
        return {}
    return dict(
        conn.execute(
            f"""SELECT n.nspname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE {_NEXT_ID} AND n.nspname = ANY(%s)""",
            (schemas,),
        ).fetchall()
    )


# Calls every shard's next_id() ``n`` times in one query: a function of the session's own (pg_temp),
# gone when the connection closes. A shard whose next_id() fails gets its error, not an abort.
SAMPLE_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION pg_temp.shardctl_sample_ids(schemas text[], shards int[], n int)
RETURNS TABLE (shard int, ids bigint[], at_ms bigint, error text) LANGUAGE plpgsql AS $sample$
BEGIN
    FOR i IN 1 .. coalesce(array_length(schemas, 1), 0) LOOP
        shard := shards[i];
        ids := NULL;
        error := NULL;
        BEGIN
            EXECUTE format('SELECT array_agg(%I.next_id() ORDER BY g) FROM generate_series(1, $1) AS g',
                           schemas[i]) INTO ids USING n;
        EXCEPTION WHEN OTHERS THEN
            error := SQLERRM;
        END;
        at_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        RETURN NEXT;
    END LOOP;
END
$sample$"""
SAMPLE_BATCH = 256  # shards per UNION ALL query when no temporary function can be made
SAMPLE_CALL = (
    1024  # shards per call of the function: each is a transaction holding a lock per sequence
)


def sample_next_ids(
    conn: psycopg.Connection, schemas: list[str], shards: list[int], n: int
) -> list[tuple[int, list[int] | None, int, str | None]]:
    """(shard, ``n`` IDs from its next_id(), server time in ms after them, error or None) per shard:
    one query, or (a role that may not make temporary objects, a standby) UNION ALL batches."""
    if not shards:
        return []
    try:
        conn.execute(SAMPLE_FUNCTION_SQL)
    except psycopg.Error:
        return _sample_union(conn, schemas, shards, n)
    out: list[tuple] = []
    for i in range(
        0, len(shards), SAMPLE_CALL
    ):  # max_locks_per_transaction: 64 x max_connections slots
        out += conn.execute(
            "SELECT * FROM pg_temp.shardctl_sample_ids(%s::text[], %s::int[], %s)",
            (schemas[i : i + SAMPLE_CALL], shards[i : i + SAMPLE_CALL], n),
        ).fetchall()
    return out


def _sample_union(
    conn: psycopg.Connection, schemas: list[str], shards: list[int], n: int
) -> list[tuple]:
    def one(schema: str, shard: int) -> str:
        fn = f"{quote_ident(schema)}.next_id"
        return (
            f"SELECT {int(shard)}, (SELECT array_agg({fn}() ORDER BY g) FROM generate_series(1, {int(n)}) g), "
            f"(extract(epoch FROM clock_timestamp()) * 1000)::bigint, NULL::text"
        )

    out: list[tuple] = []
    for i in range(0, len(shards), SAMPLE_BATCH):
        part = list(zip(schemas[i : i + SAMPLE_BATCH], shards[i : i + SAMPLE_BATCH]))
        try:
            out += conn.execute("\nUNION ALL\n".join(one(s, k) for s, k in part)).fetchall()
        except psycopg.Error:
            for schema, shard in part:  # find the shard(s) whose next_id() fails
                try:
                    out.append(conn.execute(one(schema, shard)).fetchone())
                except psycopg.Error as exc:
                    out.append((shard, None, 0, str(exc)))
    return out
