"""The statements of ``adopt copy`` and ``adopt status``: the run's record on the database being
adopted (schema ``shardctl_adopt``), replica identities, the per-host publications with row filters on
the rows' shard (:func:`key_shard`), the partitioned parents on each fleet host whose partitions are the shard tables,
the filtered COPYs, and what the source holds for the copy (slots, their WAL, the lag).

The publications, slots and subscriptions themselves are made and dropped by ``replication`` (the
move's); only what is shaped for adoption is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ...model.layouts import Layout

STATE_SCHEMA = "shardctl_adopt"
# pg_try_advisory_lock(classid, objid) = ('AD', 0): "an adopt copy runs on this database".
ADOPT_LOCK_CLASS = 0x4144

RUN_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {STATE_SCHEMA};
CREATE TABLE IF NOT EXISTS {STATE_SCHEMA}.run (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    phase text NOT NULL,
    plan_hash text NOT NULL,
    topology text,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    detail jsonb NOT NULL DEFAULT '{{}}'
)"""


@dataclass
class RunRow:
    phase: str
    plan_hash: str
    topology: str | None
    started_at: object
    updated_at: object
    detail: dict


def ensure_run_table(conn: psycopg.Connection) -> None:
    conn.execute(RUN_DDL)


def read_run(conn: psycopg.Connection) -> RunRow | None:
    """The run's one row, or None (no run recorded, or no state schema at all)."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{STATE_SCHEMA}.run",))
    if not exists.fetchone()[0]:
        return None
    row = conn.execute(
        f"SELECT phase, plan_hash, topology, started_at, updated_at, detail FROM {STATE_SCHEMA}.run"
    ).fetchone()
    return RunRow(*row) if row else None


def write_run(
    conn: psycopg.Connection, phase: str, plan_hash: str, topology: str | None, detail: dict
) -> None:
    """Insert or replace the run's row (``updated_at`` now)."""
    conn.execute(
        f"""INSERT INTO {STATE_SCHEMA}.run (phase, plan_hash, topology, detail)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (one) DO UPDATE SET phase = excluded.phase, plan_hash = excluded.plan_hash,
                topology = excluded.topology, detail = excluded.detail, updated_at = now()""",
        (phase, plan_hash, topology, Jsonb(detail)),
    )


def try_run_lock(conn: psycopg.Connection) -> bool:
    """The session advisory lock that keeps two ``adopt copy`` runs apart (gone with the session)."""
    return conn.execute("SELECT pg_try_advisory_lock(%s, 0)", (ADOPT_LOCK_CLASS,)).fetchone()[0]


# ---- replica identity ---------------------------------------------------------------------------

IDENTITY = """
SELECT c.relname, c.relreplident::text,
       (SELECT x.relname FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
         WHERE i.indrelid = c.oid AND i.indisreplident),
       ARRAY(SELECT a.attname::text FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
              WHERE i.indrelid = c.oid
                AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)))
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = ANY(%s)"""


def replica_identities(
    conn: psycopg.Connection, schema: str, tables: list[str]
) -> dict[str, tuple[str, str | None, list[str]]]:
    """table → (relreplident, the identity index if USING INDEX, the identity's columns)."""
    return {
        name: (kind, index, list(cols))
        for name, kind, index, cols in conn.execute(IDENTITY, (schema, tables)).fetchall()
    }


def set_replica_identity_full(conn: psycopg.Connection, schema: str, table: str) -> None:
    """``REPLICA IDENTITY FULL``, waiting at most 2 s for the table's lock (the caller retries): an
    ALTER queued behind a long transaction would make every write of the app queue behind it."""
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '2s'")
        conn.execute(
            sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(schema, table))
        )


def restore_replica_identity(
    conn: psycopg.Connection, schema: str, table: str, kind: str, index: str | None
) -> None:
    """Put back a replica identity :func:`set_replica_identity_full` replaced (abort, cleanup)."""
    what = {"d": sql.SQL("DEFAULT"), "n": sql.SQL("NOTHING"), "f": sql.SQL("FULL")}.get(kind)
    if what is None:
        what = sql.SQL("USING INDEX {}").format(sql.Identifier(index or ""))
    conn.execute(
        sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(sql.Identifier(schema, table), what)
    )


# A key changed by an UPDATE that moves the row to another host's publication reaches that host as
# an INSERT built from the new tuple, and a value stored out of line (TOAST) that the UPDATE left
# alone is not in the WAL unless the replica identity holds it (FULL; the id map's column lists need
# an (id, key) identity instead): the INSERT would write NULL. So, while the copy runs, a trigger
# on the source gives such an UPDATE fresh values of every column (the row's text read back), which
# PostgreSQL stores, and logs, anew.
RETOAST_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {STATE_SCHEMA}.retoast() RETURNS trigger LANGUAGE plpgsql AS $retoast$
BEGIN
    EXECUTE format('SELECT (($1::text)::%s).*', TG_RELID::regclass) INTO NEW USING NEW;
    RETURN NEW;
END
$retoast$"""
RETOAST_TRIGGER = "shardctl_adopt_retoast"


def create_retoast_trigger(conn: psycopg.Connection, schema: str, table: str, key: str) -> None:
    """The trigger above on ``schema.table``, for UPDATEs that change ``key`` (2 s of lock wait at
    most, as :func:`set_replica_identity_full`; the caller retries)."""
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '2s'")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(STATE_SCHEMA)))
        conn.execute(RETOAST_FUNCTION)
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {} BEFORE UPDATE ON {} FOR EACH ROW "
                "WHEN (OLD.{k} IS DISTINCT FROM NEW.{k}) EXECUTE FUNCTION {}.retoast()"
            ).format(
                sql.Identifier(RETOAST_TRIGGER),
                sql.Identifier(schema, table),
                sql.Identifier(STATE_SCHEMA),
                k=sql.Identifier(key),
            )
        )


def drop_retoast_trigger(conn: psycopg.Connection, schema: str, table: str) -> None:
    conn.execute(
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
            sql.Identifier(RETOAST_TRIGGER), sql.Identifier(schema, table)
        )
    )


# ---- row filters and publications ---------------------------------------------------------------


def layout_shard(expr: sql.Composable, layout: Layout) -> sql.Composed:
    """The shard field of the ID ``expr`` as SQL: ``((expr >> shift) & mask)`` (what
    ``Layout.shard_of`` reads; a negative bigint of the 64-bit split gives the same bits)."""
    mask = (1 << layout.bits("shard")) - 1
    return sql.SQL("(({} >> {}) & {})").format(
        expr, sql.Literal(layout.shift("shard")), sql.Literal(mask)
    )


def key_shard(key: str, modulus: int, layout: Layout, id_floor: int) -> sql.Composed:
    """The shard of a row by its key column, as the Router places an ID-valued key
    (``Routing.shard_of_id``): a pre-adoption ID (``0 <= key < id_floor``) is its own key,
    ``key % modulus``; a ``next_id()`` ID names its shard in its bits (:func:`layout_shard`). A
    new user's rows, made on the fleet after the cutover, thus fit the partition of their shard."""
    k = sql.Identifier(key)
    return sql.SQL("(CASE WHEN {k} >= 0 AND {k} < {floor} THEN {k} % {n} ELSE {bits} END)").format(
        k=k, floor=sql.Literal(id_floor), n=sql.Literal(modulus), bits=layout_shard(k, layout)
    )


def shard_filter(shard: sql.Composable, ranges: list[tuple[int, int]]) -> sql.Composed:
    """``shard BETWEEN a AND b OR …``: the rows whose shard (:func:`key_shard`) is in ``ranges``
    (inclusive)."""
    parts = [
        sql.SQL("{} BETWEEN {} AND {}").format(shard, sql.Literal(lo), sql.Literal(hi))
        for lo, hi in ranges
    ]
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts))


def create_filtered_publication(
    conn: psycopg.Connection,
    name: str,
    schema: str,
    sharded: list[tuple[str, sql.Composable]],
    ranges: list[tuple[int, int]],
    plain: list[str],
) -> None:
    """``CREATE PUBLICATION name FOR TABLE t WHERE (<shard> BETWEEN …), …``: each sharded (table,
    its rows' shard: :func:`key_shard`) filtered to the host's shards, the ``plain`` (global)
    tables whole."""
    items = [
        sql.SQL("{} WHERE {}").format(sql.Identifier(schema, table), shard_filter(shard, ranges))
        for table, shard in sharded
    ]
    items += [sql.Identifier(schema, table) for table in plain]
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(items)
        )
    )


# ---- the fleet host's side ----------------------------------------------------------------------


LOCK_FOOTPRINT = """
SELECT 1 + (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)::int
         + CASE WHEN c.reltoastrelid <> 0 THEN 2 ELSE 0 END
  FROM unnest(%s::text[]) AS t(name) JOIN pg_class c ON c.oid = t.name::regclass"""


def lock_footprints(conn: psycopg.Connection, tables: list[tuple[str, str]]) -> list[int]:
    """The locks a write into each of ``tables`` takes: the table, its indexes, its TOAST table and
    that one's index."""
    if not tables:
        return []
    names = [sql.Identifier(*t).as_string(conn) for t in tables]
    return [row[0] for row in conn.execute(LOCK_FOOTPRINT, (names,))]


def create_parent(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    like: tuple[str, str],
    shard: sql.Composable,
) -> None:
    """``schema.table`` partitioned by its rows' shard (:func:`key_shard`: the Router's rule, so that
    every row the Router or an ORM writes into a shard table fits its partition, a new user's rows
    too), with the columns of the shard table ``like``."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE {}) PARTITION BY LIST ({})").format(
            sql.Identifier(schema, table), sql.Identifier(*like), shard
        )
    )


def attach_shard(
    conn: psycopg.Connection, parent: tuple[str, str], shard_table: tuple[str, str], shard: int
) -> None:
    conn.execute(
        sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES IN ({})").format(
            sql.Identifier(*parent), sql.Identifier(*shard_table), sql.Literal(shard)
        )
    )


def partitions(conn: psycopg.Connection, schema: str) -> dict[str, set[str]]:
    """Partitioned table of ``schema`` → the schemas of its attached partitions."""
    out: dict[str, set[str]] = {}
    for parent, child_schema in conn.execute(
        """SELECT p.relname, cn.nspname FROM pg_class p
             JOIN pg_namespace pn ON pn.oid = p.relnamespace
             LEFT JOIN pg_inherits i ON i.inhparent = p.oid
             LEFT JOIN pg_class c ON c.oid = i.inhrelid
             LEFT JOIN pg_namespace cn ON cn.oid = c.relnamespace
            WHERE pn.nspname = %s AND p.relkind = 'p'""",
        (schema,),
    ).fetchall():
        out.setdefault(parent, set())
        if child_schema:
            out[parent].add(child_schema)
    return out


def without_triggers(conn: psycopg.Connection) -> None:
    """``session_replication_role = replica`` for the session: foreign keys are not checked while
    tables are copied in parallel, as the subscription's apply worker does not check them either (the
    rows come from a snapshot in which they held)."""
    conn.execute("SET session_replication_role = replica")


def may_skip_triggers(conn: psycopg.Connection) -> bool:
    """Whether this role may ``SET session_replication_role`` (a superuser, or one granted SET on
    it); a managed service's app role may not."""
    try:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def references(conn: psycopg.Connection, schemas: list[str]) -> list[tuple[str, str]]:
    """(table, the table it references) for each foreign key of a table in ``schemas``, by name."""
    return conn.execute(
        """SELECT r.relname, f.relname FROM pg_constraint c
             JOIN pg_class r ON r.oid = c.conrelid JOIN pg_class f ON f.oid = c.confrelid
            WHERE c.contype = 'f' AND r.relnamespace::regnamespace::text = ANY(%s)
              AND c.conrelid <> c.confrelid""",
        (schemas,),
    ).fetchall()


def copy_out_rows(
    schema: str, table: str, columns: list[str | sql.Composable], where: sql.Composable | None
) -> sql.Composed:
    """The binary COPY that reads ``columns`` (names, or expressions) of the rows ``where`` selects
    (all without it)."""
    items = [sql.Identifier(c) if isinstance(c, str) else c for c in columns]
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(items), sql.Identifier(schema, table)
    )
    if where is not None:
        query = sql.SQL("{} WHERE {}").format(query, where)
    return sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query)


def copy_in_columns(schema: str, table: str, columns: list[str]) -> sql.Composed:
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
        sql.Identifier(schema, table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )


def columns(conn: psycopg.Connection, schema: str, table: str) -> list[str]:
    """The table's columns in order, generated ones left out (COPY cannot write them)."""
    return [
        r[0]
        for r in conn.execute(
            """SELECT a.attname FROM pg_attribute a
                WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
                  AND a.attgenerated = '' ORDER BY a.attnum""",
            (sql.Identifier(schema, table).as_string(conn),),
        ).fetchall()
    ]


def create_sequence(conn: psycopg.Connection, qualified: str) -> None:
    """A sequence a global table's column default names (its value is the cutover's to set)."""
    conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(sql.SQL(qualified)))


def execute_ddl(conn: psycopg.Connection, text: str) -> None:
    """Run DDL the ``sql`` layer rendered (a global table's ``CREATE TABLE``)."""
    conn.execute(text)


def table_exists(conn: psycopg.Connection, schema: str, table: str) -> bool:
    return conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(schema, table).as_string(conn),)
    ).fetchone()[0]


# ---- what the source holds ----------------------------------------------------------------------

SLOTS = """
SELECT s.slot_name, s.active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS retained_bytes,
       greatest(0, pg_wal_lsn_diff(pg_current_wal_lsn(),
                coalesce(s.confirmed_flush_lsn, s.restart_lsn)))::bigint AS lag_bytes,
       extract(epoch FROM r.replay_lag)::float8 AS lag_seconds,
       s.wal_status
  FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
 WHERE s.slot_name = ANY(%s)"""


def slot_figures(conn: psycopg.Connection, names: list[str]) -> dict[str, dict]:
    """slot → active, retained WAL bytes (from restart_lsn), lag bytes (unconfirmed), lag seconds
    (the walsender's replay_lag; None when idle or not connected), wal_status."""
    cur = conn.execute(SLOTS, (names,))
    keys = [d.name for d in cur.description]
    return {row[0]: dict(zip(keys[1:], row[1:])) for row in cur.fetchall()}


def copy_progress(conn: psycopg.Connection, application_prefix: str) -> dict[str, tuple[int, int]]:
    """application_name → (rows, bytes) of the COPYs running on this server whose client names
    itself ``application_prefix…`` (pg_stat_progress_copy)."""
    return {
        name: (int(rows or 0), int(size or 0))
        for name, rows, size in conn.execute(
            """SELECT a.application_name, sum(p.tuples_processed), sum(p.bytes_processed)
                 FROM pg_stat_progress_copy p JOIN pg_stat_activity a ON a.pid = p.pid
                WHERE a.application_name LIKE %s GROUP BY 1""",
            (application_prefix.replace("_", "\\_") + "%",),
        ).fetchall()
    }


def global_table_ddl(table: Any, schema: str) -> str:
    """``CREATE TABLE`` for a global table as the source defines it (``sql.baseline``'s rendering,
    its ID default kept: sequences first, made by :func:`create_sequence`), indexes included, in
    ``schema``."""
    from ..baseline import create_table, indexes
    from ..render import string_environment

    text = create_table(table, schema, None) + indexes(table, schema)
    return string_environment().from_string(text).render(schema=schema)


# ---- tables whose columns use a shard's own types (enums): routed by a trigger ------------------
#
# A partition's column types must be its parent's, but each shard has its own copy of the app's enum
# types (the baseline creates them per shard), so such a table cannot be attached under one parent.
# Its rows go instead into a table of the same name in the source's schema, the per-shard types as
# text, partitioned by the rows' shard (:func:`key_shard`, as the parents are) into one table per shard
# in ``shardctl_adopt`` (:func:`routed_partition`), whose trigger (ENABLE REPLICA: it fires in the
# subscription's apply worker only) writes each change into the table of the row's shard: the shard
# of the partition it fired on. The initial copy reads each shard's rows from its own partition.
#
# The way back (after the cutover, for ``--abort``) is the same function the other way: a trigger on
# each shard table (:func:`create_mirror`, ENABLE: it fires for the app's writes only) writes each
# change into the shard's partition of the routed table, which holds the rows as of the cutover and
# goes back through the way back's publication like a parent. Neither trigger fires for the other's
# writes (session_replication_role), so nothing loops.
#
# A global table's way back is a mirror of the same kind (:func:`create_table_mirror`): a copy of the
# table under the name the old database's table takes at the cutover, kept equal to it by the same
# function for every write (the apply worker's too, from before the cutover: the mirror holds the
# rows as of the cutover, so the way back's updates and deletes find them on the old database).

SHARD_TYPED = """
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typnamespace = c.relnamespace,
       t.typcategory = 'A', coalesce(e.typname, t.typname)::text
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type e ON e.oid = nullif(t.typelem, 0)
 WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum"""

PRIMARY_KEY = """
SELECT ARRAY(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY u(n, i)
               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i)
  FROM pg_constraint k WHERE k.conrelid = %s::regclass AND k.contype = 'p'"""

# ``targets``: "schema.table" a row-level trigger fires on -> [schema, table] its change goes to. A
# row-level trigger fires on the partition that holds the row (an UPDATE that moves a row to another
# partition fires DELETE there and INSERT in the new one), so the table fired on names the row's shard.
# ``match``: the old row in the target, by its primary key (``KEY_MATCH``), or, for a table without
# one, one row equal to it, NULLs included (``ROW_MATCH``: one of two equal rows goes, as in the source).
ROUTE_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $route$
DECLARE
    targets constant jsonb := {targets};
    t jsonb;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN  -- DELETE: a TRUNCATE here would meet the tables the same
        FOR t IN SELECT value FROM jsonb_each(targets) LOOP  -- TRUNCATE holds (referencing ones)
            EXECUTE format('DELETE FROM %I.%I', t ->> 0, t ->> 1);
        END LOOP;
        RETURN NULL;
    END IF;
    t := targets -> (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    IF TG_OP <> 'INSERT' THEN
        EXECUTE format('DELETE FROM %1$I.%2$I WHERE {match}', t ->> 0, t ->> 1) USING OLD;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        EXECUTE format('INSERT INTO %1$I.%2$I SELECT * FROM json_populate_record(NULL::%1$I.%2$I, $1)',
                       t ->> 0, t ->> 1) USING to_json(NEW);
    END IF;
    RETURN NULL;
END
$route$"""
KEY_MATCH = "({pk}) = ({old_pk})"
ROW_MATCH = (
    "ctid = (SELECT ctid FROM %1$I.%2$I WHERE ({pk}) IS NOT DISTINCT FROM ({old_pk}) LIMIT 1)"
)
ROUTE_TRIGGER = "shardctl_adopt_route"
MIRROR_TRIGGER = "shardctl_adopt_mirror"
MIRROR_TRUNCATE_TRIGGER = "shardctl_adopt_mirror_truncate"


def shard_typed_columns(
    conn: psycopg.Connection, shard_table: tuple[str, str]
) -> list[tuple[str, str, bool, bool, str]]:
    """(column, type, typed by the shard's own schema, an array, the (element) type's name) of a
    shard table, in order."""
    return conn.execute(SHARD_TYPED, (sql.Identifier(*shard_table).as_string(conn),)).fetchall()


def primary_key(conn: psycopg.Connection, table: tuple[str, str]) -> list[str]:
    row = conn.execute(PRIMARY_KEY, (sql.Identifier(*table).as_string(conn),)).fetchone()
    return list(row[0]) if row else []


def routed_partition(table: str, shard: int) -> tuple[str, str]:
    """The partition of routed table ``table`` that holds shard ``shard``'s rows (in
    ``shardctl_adopt``, which the cleanup drops whole)."""
    suffix = f"_{shard}"
    return STATE_SCHEMA, table[: 63 - len(suffix)] + suffix


def create_routed_table(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    cols: list[tuple[str, str, bool, bool, str]],
    pk: list[str],
    shard: sql.Composable,
    shard_schemas: dict[int, str],
) -> None:
    """``schema.table`` (the per-shard types as text), partitioned by ``shard`` (the rows' shard:
    :func:`key_shard`) into one partition per shard of ``shard_schemas``, and its routing trigger
    (see above)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(STATE_SCHEMA)))
    defs = [
        sql.SQL("{} {}").format(
            sql.Identifier(name),
            sql.SQL(("text[]" if array else "text") if own else typ),
        )
        for name, typ, own, array, _ in cols
    ]
    target = sql.Identifier(schema, table)
    conn.execute(
        sql.SQL("CREATE TABLE {} ({}) PARTITION BY LIST ({})").format(
            target, sql.SQL(", ").join(defs), shard
        )
    )
    key = sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, pk)))
    for n in shard_schemas:
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} ({}) FOR VALUES IN ({})").format(
                sql.Identifier(*routed_partition(table, n)), target, key, sql.Literal(n)
            )
        )
    uncompressed(conn, (schema, table))
    function = (STATE_SCHEMA, f"route_{table}"[:63])
    targets = {routed_partition(table, n): (s, table) for n, s in shard_schemas.items()}
    create_route_function(conn, function, targets, pk)
    trigger = sql.Identifier(ROUTE_TRIGGER)
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(trigger, target, sql.Identifier(*function))
    )
    conn.execute(route_trigger(schema, table, enable=True))
    truncate = sql.Identifier("shardctl_adopt_truncate")
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER {} AFTER TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()"
        ).format(truncate, target, sql.Identifier(*function))
    )
    conn.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(target, truncate))


def create_route_function(
    conn: psycopg.Connection,
    function: tuple[str, str],
    targets: dict[tuple[str, str], tuple[str, str]],
    pk: list[str],
    columns: list[str] | None = None,
) -> None:
    """:data:`ROUTE_FUNCTION` as ``function``: each row change of a table of ``targets`` (fired on →
    written to) applied to its target, by the primary key ``pk``; without one, by all its
    ``columns``."""
    match = sql.SQL(KEY_MATCH if pk else ROW_MATCH).format(
        pk=sql.SQL(", ").join(map(sql.Identifier, pk or columns or [])),
        old_pk=sql.SQL(", ").join(
            sql.SQL("$1.{}").format(sql.Identifier(c)) for c in pk or columns or []
        ),
    )
    conn.execute(
        sql.SQL(ROUTE_FUNCTION).format(
            function=sql.Identifier(*function),
            targets=sql.Literal(Jsonb({f"{s}.{t}": list(to) for (s, t), to in targets.items()})),
            match=sql.SQL(match.as_string(conn).replace("'", "''")),
        )
    )


def mirror_function(table: str) -> tuple[str, str]:
    return STATE_SCHEMA, f"mirror_{table}"[:63]


def create_mirror(
    conn: psycopg.Connection, table: str, shard_schemas: dict[int, str], pk: list[str]
) -> None:
    """The way back of routed table ``table`` (see above): on each shard table of ``shard_schemas``
    (shard → schema) a trigger that writes its row changes into the shard's partition of the routed
    table. Idempotent."""
    targets = {(s, table): routed_partition(table, n) for n, s in shard_schemas.items()}
    mirror_into(conn, mirror_function(table), targets, pk)


def mirror_into(
    conn: psycopg.Connection,
    function: tuple[str, str],
    targets: dict[tuple[str, str], tuple[str, str]],
    pk: list[str],
    whole: bool = False,
    columns: list[str] | None = None,
) -> None:
    """On each table of ``targets`` (→ the table its row changes are written to, by the primary key
    ``pk``, else by all its ``columns``) a trigger ``function`` that writes them there, for the app's
    sessions only; ``whole`` (one table mirrored whole): for every session, the subscription's apply
    worker's too, and its TRUNCATEs (as DELETEs). Idempotent."""
    create_route_function(conn, function, targets, pk, columns)
    for source in targets:
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW "
                "EXECUTE FUNCTION {}()"
            ).format(
                sql.Identifier(MIRROR_TRIGGER), sql.Identifier(*source), sql.Identifier(*function)
            )
        )
        if not whole:
            continue
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {} AFTER TRUNCATE ON {} FOR EACH STATEMENT "
                "EXECUTE FUNCTION {}()"
            ).format(
                sql.Identifier(MIRROR_TRUNCATE_TRIGGER),
                sql.Identifier(*source),
                sql.Identifier(*function),
            )
        )
        for trigger in (MIRROR_TRIGGER, MIRROR_TRUNCATE_TRIGGER):
            conn.execute(
                sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(
                    sql.Identifier(*source), sql.Identifier(trigger)
                )
            )


def create_table_mirror(
    conn: psycopg.Connection, table: tuple[str, str], mirror: tuple[str, str]
) -> bool:
    """``mirror``: ``table``'s rows (its stored columns, its primary key if it has one, REPLICA
    IDENTITY FULL: the subscriber finds each old row by its own identity), kept equal to it by
    :func:`mirror_into` (``whole``). Made, filled and triggered in one transaction that stops
    ``table``'s writers meanwhile; False when it exists already (its trigger has kept it equal
    since)."""
    if table_exists(conn, *mirror):
        return False
    pk = primary_key(conn, table)
    names = [c[0] for c in shard_typed_columns(conn, table)]
    columns = sql.SQL(", ").join(map(sql.Identifier, names))
    with conn.transaction():
        conn.execute(
            sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(sql.Identifier(*table))
        )
        if table_exists(conn, *mirror):
            return False
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(mirror[0])))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(STATE_SCHEMA)))
        target = sql.Identifier(*mirror)
        conn.execute(
            sql.SQL("CREATE TABLE {} AS SELECT {} FROM {}").format(
                target, columns, sql.Identifier(*table)
            )
        )
        key = sql.SQL("ADD PRIMARY KEY ({}), ").format(sql.SQL(", ").join(map(sql.Identifier, pk)))
        conn.execute(
            sql.SQL("ALTER TABLE {} {}REPLICA IDENTITY FULL").format(
                target, key if pk else sql.SQL("")
            )
        )
        mirror_into(conn, mirror_function(table[1]), {table: mirror}, pk, True, names)
    return True


def drop_mirror(
    conn: psycopg.Connection,
    table: str,
    shard_schemas: dict[int, str],
    names: tuple[str, ...] = (),
) -> None:
    """:func:`create_mirror`'s (or :func:`mirror_into`'s) triggers and function gone (those that
    exist), from ``table`` in each schema or whichever of ``names`` it has there now (an abort
    renames the fleet's tables)."""
    for s in shard_schemas.values():
        for name in names or (table,):
            if not table_exists(conn, s, name):
                continue
            for trigger in (MIRROR_TRIGGER, MIRROR_TRUNCATE_TRIGGER):
                conn.execute(
                    sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                        sql.Identifier(trigger), sql.Identifier(s, name)
                    )
                )
    conn.execute(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(*mirror_function(table)))
    )


COMPRESSED = """
SELECT a.attname::text FROM pg_attribute a
 WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attstorage = 'x'
 ORDER BY a.attnum"""


def uncompressed(conn: psycopg.Connection, table: tuple[str, str]) -> None:
    """``STORAGE EXTERNAL`` for every column of ``table`` (and its partitions) that would be
    compressed: a routed table's values are written there once and read back once by the initial
    copy, then compressed by the shard's table; compressing them twice (pglz) made the copy of a
    table of long text values some three times as slow."""
    names = [r[0] for r in conn.execute(COMPRESSED, (sql.Identifier(*table).as_string(conn),))]
    if names:
        conn.execute(
            sql.SQL("ALTER TABLE {} {}").format(
                sql.Identifier(*table),
                sql.SQL(", ").join(
                    sql.SQL("ALTER COLUMN {} SET STORAGE EXTERNAL").format(sql.Identifier(n))
                    for n in names
                ),
            )
        )


def text_cast(column: str, array: bool) -> sql.Composed:
    """``column::text`` (``::text[]``): a per-shard-typed column as the routed table holds it."""
    return sql.SQL("{}::{}").format(sql.Identifier(column), sql.SQL("text[]" if array else "text"))


def route_trigger(schema: str, table: str, enable: bool) -> sql.Composed:
    """Disable (for the initial copy, which routes the rows itself: :func:`route_rows`) or enable
    again the routing trigger of a routed table (its partitions' with it), for the subscription's
    apply worker only (``REPLICA``: the way back's writes into the partitions are not routed)."""
    return sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(
        sql.Identifier(schema, table),
        sql.SQL("ENABLE REPLICA" if enable else "DISABLE"),
        sql.Identifier(ROUTE_TRIGGER),
    )


def route_rows(
    table: str, shard_schema: str, shard: int, cols: list[tuple[str, str, bool, bool, str]]
) -> sql.Composed:
    """``INSERT INTO shard.table SELECT … FROM <its partition>``: the rows of one shard from its
    partition of the routed table (:func:`routed_partition`: no other shard's rows read), its
    per-shard-typed columns cast back to the shard's types."""
    items = []
    for name, _, own, array, typname in cols:
        if own:
            items.append(
                sql.SQL("{}::{}{}").format(
                    sql.Identifier(name),
                    sql.Identifier(shard_schema, typname),
                    sql.SQL("[]" if array else ""),
                )
            )
        else:
            items.append(sql.Identifier(name))
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
        sql.Identifier(shard_schema, table),
        sql.SQL(", ").join(sql.Identifier(c[0]) for c in cols),
        sql.SQL(", ").join(items),
        sql.Identifier(*routed_partition(table, shard)),
    )
