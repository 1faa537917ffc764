"""A moved shard's leftovers on its old host: the stub schema that tells direct clients where the shard
went, the guard triggers on the old tables, and the write privileges revoked and given back."""

from __future__ import annotations

import psycopg

from ...model.identifiers import quote_ident, quote_literal
from .. import queries
from .control import (
    GUARD_FUNCTION,
    GUARD_TRIGGER,
    NOT_STUB,
    STUB_COMMENT,
    STUB_PLAN_FUNCTION,
    STUB_READ_FUNCTION,
)
from .inspect import present_schemas

WRITE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")


def create_moved_stubs(
    conn: psycopg.Connection, stubs: dict[str, tuple[str, str]], only: list[str] | None = None
) -> int:
    """A stub schema named by each key for the shard schema ``value[0]``: one view per table with the
    table's columns, and a ``next_id()``, whose reads, writes and calls raise SQLSTATE SCM01 with the
    message ``value[1]`` (it names the new host), so direct clients (psql, other languages) are told
    where the shard went once the stub takes the shard's old name (:func:`place_moved_stubs`). Marked by
    its comment (:data:`STUB_COMMENT`); stubs that exist already are kept. ``only``: views for these
    tables alone (an adopted database's schema holds the app's other tables too). Returns the number of
    views made."""
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
              AND (%s::text[] IS NULL OR c.relname = ANY(%s))
            GROUP BY 1, 2 ORDER BY 1, 2""",
        (list(old_of), only, only),
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
    conn.execute(rename_schemas_sql(names))


def rename_schemas_sql(names: dict[str, str]) -> str:
    """ALTER SCHEMA … RENAME of each schema (key) to its new name (value), as one script."""
    return "".join(
        f"ALTER SCHEMA {quote_ident(k)} RENAME TO {quote_ident(v)};\n" for k, v in names.items()
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


def write_grants(conn: psycopg.Connection, schemas: list[str]) -> list[list[str]]:
    """[schema, table, grantee (SQL: a quoted role or PUBLIC), privilege] for every write privilege but the
    owner's (the guard trigger stops the owner; revoking its own rights would hide the guard's message
    behind "permission denied" when the fleet's role owns the tables, as on managed Postgres)."""
    return [
        list(r)
        for r in conn.execute(
            queries.load("write_grants"),
            {"schemas": schemas, "privileges": list(WRITE_PRIVILEGES)},
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
