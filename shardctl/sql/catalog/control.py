"""The control schema's records: moves, redirects, shard states, the migration ledger's reads, the
template-function ledger. The control tables themselves (``shardctl.moves``, the guard function) are
defined in ``templates/control_schema.sql.j2``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg
from psycopg import conninfo as pg_conninfo

from ...model.identifiers import quote_ident
from ..render import render_control

# SQLSTATE raised by the guard trigger on a moved shard's old tables (see Router.run).
MOVED_SQLSTATE = "SCM01"


GUARD_FUNCTION = "shardctl.moved_shard_guard"


GUARD_TRIGGER = "shardctl_moved_shard"


# a moved shard's stub views read through it (it raises SCM01)
STUB_READ_FUNCTION = "shardctl.moved_shard_read"


# The stub views' WHERE: an immutable function of a constant, so it raises SCM01 when any read is planned.
STUB_PLAN_FUNCTION = "shardctl.moved_shard_planned"


# a stale client's transactions look for their shard's redirect through it (sql.session.redirect_check)
REDIRECT_CHECK_FUNCTION = "shardctl.redirect_check"


STUB_COMMENT = "shardctl: moved-shard stub"  # COMMENT ON SCHEMA of a stub: never a shard


# A pg_namespace row (alias n) that is not a stub left under a moved shard's old name.
NOT_STUB = (
    "NOT EXISTS (SELECT FROM pg_description d WHERE d.objoid = n.oid AND d.classoid = 'pg_namespace'::regclass "
    f"AND d.objsubid = 0 AND starts_with(d.description, '{STUB_COMMENT}'))"
)


# A shard's state as its (old) host records it (a Router asking a host a statement failed on).
SHARD_STATE_SQL = "SELECT state FROM shardctl.shards WHERE shard_id = %s"


def moves_table_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl.moves') IS NOT NULL").fetchone()[0]


def ensure_move_objects(conn: psycopg.Connection) -> None:
    """Create what moves need in the control schema (shardctl.moves, the guard function) on a host
    initialised before they existed: the control-schema template again, whose statements are idempotent.
    Call under the host lock (concurrent CREATE IF NOT EXISTS can collide)."""
    ready = conn.execute(
        "SELECT to_regclass('shardctl.moves') IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
        "AND to_regclass('shardctl.redirects') IS NOT NULL AND to_regprocedure(%s) IS NOT NULL "
        "AND to_regprocedure(%s) IS NOT NULL AND to_regprocedure(%s) IS NOT NULL",
        (
            f"{GUARD_FUNCTION}()",
            f"{STUB_READ_FUNCTION}(text)",
            f"{STUB_PLAN_FUNCTION}(text)",
            f"{REDIRECT_CHECK_FUNCTION}(integer)",
        ),
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


def dumps(value: object) -> str:
    return json.dumps(value, default=str)


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


def schemaless_shards(conn: psycopg.Connection) -> set[int]:
    """Shards the host records whose schema is gone (dropped, or only a moved shard's stub is left)."""
    rows = conn.execute(
        "SELECT s.shard_id FROM shardctl.shards s WHERE NOT EXISTS "
        f"(SELECT FROM pg_namespace n WHERE n.nspname = s.schema_name AND {NOT_STUB})"
    ).fetchall()
    return {r[0] for r in rows}


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


TEMPLATE_LEDGER = """CREATE TABLE IF NOT EXISTS shardctl.templates (
    shard_id     integer NOT NULL,
    object       text NOT NULL,
    checksum     text NOT NULL,
    deployed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    deployed_by  text NOT NULL DEFAULT current_user,
    PRIMARY KEY (shard_id, object)
)"""


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


# ---- the catalog watch: which DDL transactions committed, for caches of catalog-derived facts -------

# An event trigger notes every transaction that ran DDL in the database (its xid, once per
# transaction); a cache of something read from the catalog (status's schema fingerprints) is valid
# while the set of noted transactions is the same. Made only by a superuser (event triggers need
# one); without it there is no watch, and nothing is cached.
CATALOG_WATCH = "shardctl_catalog_watch"
_NOTE_BODY = """
BEGIN
    -- once per transaction; a failure here must never fail the DDL that fired it
    IF current_setting('shardctl.catalog_noted', true) = 'on' THEN
        RETURN;
    END IF;
    BEGIN
        -- a session's own temporary objects (verify's sampling function) change no shard: a
        -- command that names only pg_temp schemas is not noted (a DROP names none: noted)
        IF (SELECT count(*) > 0 AND bool_and(coalesce(c.schema_name ~ '^pg_temp(_[0-9]+)?$', false))
              FROM pg_event_trigger_ddl_commands() AS c) THEN
            RETURN;
        END IF;
        PERFORM set_config('shardctl.catalog_noted', 'on', true);
        INSERT INTO shardctl.catalog_changes DEFAULT VALUES ON CONFLICT DO NOTHING;
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
END """
_NOTE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION shardctl.note_catalog_change() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $${_NOTE_BODY}$$;
REVOKE ALL ON FUNCTION shardctl.note_catalog_change() FROM PUBLIC;
"""
_WATCH_SQL = f"""
CREATE TABLE IF NOT EXISTS shardctl.catalog_changes (
    xid xid8 PRIMARY KEY DEFAULT pg_current_xact_id(),
    at timestamptz NOT NULL DEFAULT now()
);
{_NOTE_FUNCTION}
CREATE EVENT TRIGGER {CATALOG_WATCH} ON ddl_command_end
    EXECUTE FUNCTION shardctl.note_catalog_change();
"""
REPEATABLE_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


def catalog_watch_on(conn: psycopg.Connection) -> bool:
    """Whether the database's DDL is being noted (the event trigger exists and fires)."""
    row = conn.execute(
        "SELECT evtenabled FROM pg_event_trigger WHERE evtname = %s", (CATALOG_WATCH,)
    ).fetchone()
    return row is not None and row[0] in ("O", "A")


def ensure_catalog_watch(conn: psycopg.Connection) -> bool:
    """Start noting DDL transactions when the role may (a superuser), or bring the noting function
    of an older shardctl up to date; whether the watch is on."""
    on = catalog_watch_on(conn)
    if (
        on
        and conn.execute(
            "SELECT prosrc = %s FROM pg_proc WHERE oid = 'shardctl.note_catalog_change()'::regprocedure",
            (_NOTE_BODY,),
        ).fetchone()[0]
    ):
        return True
    if not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
        return on
    try:
        with conn.transaction():
            conn.execute(_NOTE_FUNCTION if on else _WATCH_SQL)
    except psycopg.Error:  # a server too old for xid8, or a managed one that refuses event triggers
        return on
    return True


def catalog_token(conn: psycopg.Connection) -> str | None:
    """What changes whenever a DDL transaction commits (in the caller's snapshot), or None when DDL
    is not being noted."""
    if not catalog_watch_on(conn):
        return None
    count, top = conn.execute(
        "SELECT count(*), coalesce(max(xid::text::numeric), 0) FROM shardctl.catalog_changes"
    ).fetchone()
    return f"{count}:{top}"
