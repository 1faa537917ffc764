"""What ``adopt cutover`` (and its ``--abort`` and ``--cleanup``) sends: the run's record on the old
database (``shardctl_adopt.run``), the way back (a publication of each fleet host's partitioned
parents ``WITH (publish_via_partition_root = true)``, subscribed on the old database with
``origin = none``), replica identities, and the parents' partitions detached and dropped.

The guard triggers and redirects are the move's (``stubs.guard_sql``, ``control.write_redirects``)."""

from __future__ import annotations

import hashlib

import psycopg
from psycopg import sql

from ...model.identifiers import quote_ident
from .control import dumps
from .stubs import unguard_sql

RUN_TABLE = "shardctl_adopt.run"


def run_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl_adopt.run') IS NOT NULL").fetchone()[0]


def read_run(conn: psycopg.Connection, lock: bool = False) -> tuple[str, dict] | None:
    """(phase, detail) of the adoption run recorded on the old database, None without one;
    ``lock``: FOR UPDATE (the caller's transaction then owns the record)."""
    if not run_exists(conn):
        return None
    row = conn.execute(
        "SELECT phase, detail FROM shardctl_adopt.run" + (" FOR UPDATE" if lock else "")
    ).fetchone()
    return None if row is None else (row[0], dict(row[1] or {}))


def set_run(conn: psycopg.Connection, phase: str, detail: dict) -> None:
    """Record the run's ``phase``, merging ``detail``'s keys into its detail (one level deep)."""
    conn.execute(
        """UPDATE shardctl_adopt.run SET phase = %s, detail = coalesce(detail, '{}') || %s::jsonb,
                  updated_at = clock_timestamp()""",
        (phase, dumps(detail)),
    )


def merge_detail(conn: psycopg.Connection, detail: dict) -> None:
    """Merge ``detail``'s keys into the run's detail (one level deep), its phase unchanged."""
    conn.execute(
        "UPDATE shardctl_adopt.run SET detail = coalesce(detail, '{}') || %s::jsonb, "
        "updated_at = clock_timestamp()",
        (dumps(detail),),
    )


def partitions(conn: psycopg.Connection, schema: str, table: str) -> list[tuple[str, str]]:
    """(schema, table) of each partition attached to ``schema.table`` (none when it is not a parent)."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            """SELECT n.nspname, c.relname FROM pg_inherits i
                 JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE i.inhparent = to_regclass(%s) ORDER BY 1, 2""",
            (sql.Identifier(schema, table).as_string(conn),),
        ).fetchall()
    ]


def replica_identities(conn: psycopg.Connection, items: list[tuple[str, str]]) -> dict[str, str]:
    """``schema.table`` → relreplident (d n f i) of each of ``items`` that exists."""
    names = [sql.Identifier(s, t).as_string(conn) for s, t in items]
    return dict(
        conn.execute(
            """SELECT n.nspname || '.' || c.relname, c.relreplident::text FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = ANY(SELECT to_regclass(x) FROM unnest(%s::text[]) x)""",
            (names,),
        ).fetchall()
    )


def set_replica_identity_sql(schema: str, table: str, full: bool) -> sql.Composed:
    """REPLICA IDENTITY FULL, or back to DEFAULT (the primary key)."""
    return sql.SQL("ALTER TABLE {} REPLICA IDENTITY {};\n").format(
        sql.Identifier(schema, table), sql.SQL("FULL" if full else "DEFAULT")
    )


def slot_database(conn: psycopg.Connection, name: str) -> str | None:
    """The database the replication slot ``name`` of this server belongs to (None: no such slot).
    Slot names are the server's, not the database's: another database's adoption may hold it."""
    row = conn.execute(
        "SELECT database FROM pg_replication_slots WHERE slot_name = %s", (name,)
    ).fetchone()
    return None if row is None else row[0]


def create_root_publication(
    conn: psycopg.Connection, name: str, items: list[tuple[str, str]]
) -> bool:
    """A publication of ``items`` whose partitions' changes go out as their parent's (the old
    database has one table where the fleet has a parent and its partitions). False if it exists."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone():
        return False
    conn.execute(
        sql.SQL(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)"
        ).format(sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(s, t) for s, t in items))
    )
    return True


def create_back_subscription(conn: psycopg.Connection, name: str, conninfo: str) -> None:
    """The subscription that carries the fleet's writes back to the old database: created disabled and
    without connecting (the statement holds the password; see replication.create_subscription), on the
    slot made before the freeze, ``origin = none``: the rows the forward subscription applied on the
    fleet (they have a replication origin) never come back, only the fleet's own writes."""
    conn.execute(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (connect = false, "
            "enabled = false, create_slot = false, slot_name = {}, origin = none)"
        ).format(
            sql.Identifier(name), sql.Literal(conninfo), sql.Identifier(name), sql.Literal(name)
        )
    )


def detach_sql(parent: tuple[str, str], child: tuple[str, str]) -> sql.Composed:
    """Detach partition ``child`` from ``parent`` (it stays, as the shard's own table)."""
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
        sql.Identifier(*parent), sql.Identifier(*child)
    )


def drop_table_sql(table: tuple[str, str]) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*table))


def drop_guards_sql(items: list[tuple[str, str]]) -> str:
    """The guard trigger dropped from each of ``items`` (the move's ``stubs.unguard_sql``)."""
    return "".join(unguard_sql(s, t) for s, t in items)


def drop_state_schema(conn: psycopg.Connection) -> None:
    """``shardctl_adopt`` on a fleet host: the routing functions of ``adopt copy``'s routed tables."""
    conn.execute("DROP SCHEMA IF EXISTS shardctl_adopt CASCADE")


# ---- TRUNCATE on the fleet, carried back --------------------------------------------------------
# The way back carries row changes only: a TRUNCATE of a shard table is not published (a partition's
# is not, under ``publish_via_partition_root``) and fires no row trigger (the mirror of a table
# routed by trigger). Until the way back is dropped, each shard table's TRUNCATE first deletes its
# rows, and those of the tables referencing it (which the TRUNCATE empties too: it refuses
# otherwise), the deepest first so their foreign keys hold: each delete comes back as any other.
# Names of their own: the global tables' mirrors have an AFTER TRUNCATE trigger
# (``adopt_copy.MIRROR_TRUNCATE_TRIGGER``), and ``mirror_<table>`` functions are the mirrors'.
TRUNCATE_BACK_TRIGGER = "shardctl_adopt_truncate_back"
TRUNCATE_BACK_FUNCTION = ("shardctl_adopt", "truncate_back")
TRUNCATE_BACK = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $back$
DECLARE
    r record;
BEGIN
    FOR r IN
        WITH RECURSIVE refs(rel, depth) AS (
            SELECT TG_RELID, 0
            UNION ALL
            SELECT k.conrelid, refs.depth + 1 FROM pg_constraint k JOIN refs ON k.confrelid = refs.rel
             WHERE k.contype = 'f' AND k.conrelid <> k.confrelid AND refs.depth < 16)
        SELECT rel FROM refs GROUP BY rel ORDER BY max(depth) DESC
    LOOP
        EXECUTE format('DELETE FROM %s', r.rel::regclass);
    END LOOP;
    RETURN NULL;
END
$back$"""
TRUNCATE_BACK_TABLES = """
SELECT n.nspname::text, c.relname::text FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE t.tgname = %s"""


def create_truncate_back(conn: psycopg.Connection, tables: list[tuple[str, str]]) -> None:
    """The ``BEFORE TRUNCATE`` trigger of :data:`TRUNCATE_BACK` on each of ``tables`` (schema,
    table). Idempotent. One table a statement (``conn`` in autocommit): a trigger's DDL locks its
    table, and several held at once could deadlock with a transaction using them in another order."""
    conn.execute("CREATE SCHEMA IF NOT EXISTS shardctl_adopt")
    function = sql.Identifier(*TRUNCATE_BACK_FUNCTION)
    conn.execute(sql.SQL(TRUNCATE_BACK).format(function=function))
    make = sql.SQL(
        "CREATE OR REPLACE TRIGGER {} BEFORE TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()"
    )
    for table in tables:
        conn.execute(
            make.format(sql.Identifier(TRUNCATE_BACK_TRIGGER), sql.Identifier(*table), function)
        )


def drop_truncate_back(conn: psycopg.Connection) -> None:
    """:func:`create_truncate_back`'s triggers (wherever they are, one table a statement: see there)
    and function gone."""
    drop = sql.SQL("DROP TRIGGER IF EXISTS {} ON {}")
    for table in conn.execute(TRUNCATE_BACK_TABLES, (TRUNCATE_BACK_TRIGGER,)).fetchall():
        conn.execute(drop.format(sql.Identifier(TRUNCATE_BACK_TRIGGER), sql.Identifier(*table)))
    conn.execute(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(*TRUNCATE_BACK_FUNCTION))
    )


# ---- the old names handed to stubs at the cutover --------------------------------------------------
# The schema the adopted tables move to at the cutover: on the old database (their old names in the
# app's schema then hold stubs), and on each fleet host (its partitioned parents, so the way back
# publishes them under the names the old database's tables have there).
MOVED_SCHEMA = "shardctl_adopted"
STUB_STAGING = "shardctl_adopt_stubs"  # the stubs, made before the freeze, moved in by it


# ---- the fleet's shard tables out of their names at --abort -----------------------------------------
# A Router whose topology copy still says ``fleet`` reads a shard's tables by name (search_path: the
# shard's schema, then public). Reads fire no trigger: only a missing name (undefined_table, which
# the Router follows through the host's redirect) keeps it from the fleet's stale rows. So the abort
# renames each adopted shard table (and the global tables on the global host) within its schema,
# and ``adopt copy`` puts them back before emptying them.
ABORTED_PREFIX = "shardctl_aborted_"
NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1


def aborted_name(table: str) -> str:
    """The name ``table`` has on the fleet after an abort: :data:`ABORTED_PREFIX` and the name, or,
    past 63 bytes, its head and a digest of the whole name (deterministic: the way back is computed)."""
    name = ABORTED_PREFIX + table
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.sha256(table.encode()).hexdigest()[:10]
    head = name.encode()[: NAME_BYTES - len(digest) - 1].decode("utf-8", "ignore")
    return f"{head}_{digest}"


def rename_tables_sql(items: list[tuple[str, str, str]]) -> str:
    """ALTER TABLE schema.old RENAME TO new for each (schema, old, new), as one script (catalog
    only; a partition keeps its parent, indexes and triggers go along)."""
    return "".join(
        f"ALTER TABLE {quote_ident(s)}.{quote_ident(old)} RENAME TO {quote_ident(new)};\n"
        for s, old, new in items
    )


def ensure_schema(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


SCHEMA_HOLDS_SOMETHING = """
SELECT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_namespace n ON n.oid = d.refobjid
                WHERE d.refclassid = 'pg_namespace'::regclass AND n.nspname = %s)"""


def drop_empty_schema(conn: psycopg.Connection, schema: str) -> bool:
    """Drop ``schema`` if it exists and holds nothing; False when it still holds something.
    Asked of the catalog first: a DROP that fails still locks every object it would have dropped
    (after an abort: each of the host's shard tables, their indexes, triggers and constraints)."""
    if conn.execute(SCHEMA_HOLDS_SOMETHING, (schema,)).fetchone()[0]:
        return False
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {}").format(sql.Identifier(schema)))
    except psycopg.errors.DependentObjectsStillExist:
        return False
    return True


def set_schema_sql(items: list[tuple[str, str]], schema: str, view: bool = False) -> sql.Composed:
    """ALTER TABLE (or VIEW) … SET SCHEMA of each of ``items`` (catalog only: no row is touched;
    indexes, owned sequences, triggers and publications' memberships go along)."""
    kind = sql.SQL("VIEW" if view else "TABLE")
    return sql.Composed(
        sql.SQL("ALTER {} {} SET SCHEMA {};\n").format(
            kind, sql.Identifier(s, t), sql.Identifier(schema)
        )
        for s, t in items
    )


def table_schemas(
    conn: psycopg.Connection, tables: list[str], schemas: list[str]
) -> dict[str, str]:
    """table → the first of ``schemas`` that holds a table (plain or partitioned) of that name."""
    rows = conn.execute(
        """SELECT DISTINCT ON (c.relname) c.relname, n.nspname FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relname = ANY(%s) AND n.nspname = ANY(%s) AND c.relkind IN ('r', 'p')
            ORDER BY c.relname, array_position(%s, n.nspname::text)""",
        (tables, schemas, schemas),
    ).fetchall()
    return dict(rows)


def view_over_sql(schema: str, table: str, moved: str) -> sql.Composed:
    """A view ``schema.table`` of every row of ``moved.table`` (the id map's readers keep their name)."""
    return sql.SQL("CREATE VIEW {} AS SELECT * FROM {};\n").format(
        sql.Identifier(schema, table), sql.Identifier(moved, table)
    )


def source_now(conn: psycopg.Connection) -> float:
    """The database's clock, epoch seconds (what its ``now()`` defaults record)."""
    return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
