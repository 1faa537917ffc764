"""What ``adopt plan`` and ``adopt baseline`` read from the database being adopted: its tables,
columns, constraints, indexes and enum types in one schema, the app's migration history tables, and
its statements from ``pg_stat_statements``. Read-only: every function only selects.

Definitions are the server's own renderings (``format_type``, ``pg_get_expr``,
``pg_get_constraintdef``, ``pg_get_indexdef``) read with ``search_path`` set to ``pg_catalog`` alone
(:func:`qualified_names`), so every name outside the catalog comes back schema-qualified and the
baseline can rewrite the adopted schema's names on the parse tree, never by text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from ..session import set_settings


@dataclass
class Column:
    name: str
    type: str  # format_type, qualified where the type is not a catalog one
    not_null: bool
    default: str | None  # pg_get_expr of the default, None without one
    identity: str  # '' | 'a' (ALWAYS) | 'd' (BY DEFAULT)
    generated: str  # '' | 's' (stored)
    collation: str | None  # a collation other than the type's default, qualified
    sequence: str | None  # the sequence the column owns (serial or identity), qualified


@dataclass
class Constraint:
    name: str
    kind: str  # pg_constraint.contype: p u f c x
    columns: list[str]
    definition: str  # pg_get_constraintdef
    ref_table: str | None = None  # FOREIGN KEY: the referenced table (in the same schema) or None
    ref_schema: str | None = None
    ref_columns: list[str] = field(default_factory=list)


@dataclass
class Index:
    """An index that backs no constraint (a constraint's index comes with the constraint)."""

    name: str
    unique: bool
    columns: list[str]  # [] when it holds an expression
    partial: bool
    definition: str  # pg_get_indexdef


@dataclass
class Table:
    name: str
    kind: str  # relkind: r (table) or p (partitioned)
    persistence: str  # p permanent, u unlogged
    replica_identity: str  # relreplident: d n f i
    rows: int  # the planner's estimate (reltuples), 0 when never analyzed
    bytes: int  # pg_total_relation_size
    toast_bytes: int  # the TOAST table's size
    columns: list[Column] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    indexes: list[Index] = field(default_factory=list)
    replica_index: bool = False  # REPLICA IDENTITY USING INDEX names an index that exists


def qualified_names(conn: psycopg.Connection) -> None:
    """Make the catalog's renderings qualify every name outside ``pg_catalog`` (this transaction)."""
    set_settings(conn, {"search_path": "pg_catalog"}, local=True)


TABLES = """
SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.relreplident,
       greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid),
       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),
       EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
 ORDER BY c.relname"""

COLUMNS = """
SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
       CASE WHEN a.attcollation <> t.typcollation THEN a.attcollation::regcollation::text END,
       pg_get_serial_sequence(format('%%I.%%I', n.nspname, c.relname), a.attname)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = ANY(%(oids)s) AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid, a.attnum"""

CONSTRAINTS = """
SELECT k.conrelid, k.conname, k.contype,
       ARRAY(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY u(n, i)
               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i),
       pg_get_constraintdef(k.oid), fc.relname, fn.nspname,
       ARRAY(SELECT a.attname::text FROM unnest(k.confkey) WITH ORDINALITY u(n, i)
               JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n ORDER BY u.i)
  FROM pg_constraint k
  LEFT JOIN pg_class fc ON fc.oid = k.confrelid LEFT JOIN pg_namespace fn ON fn.oid = fc.relnamespace
 WHERE k.conrelid = ANY(%(oids)s) AND k.contype IN ('p', 'u', 'f', 'c', 'x')
 ORDER BY k.conrelid, k.contype = 'f', k.conname"""

INDEXES = """
SELECT i.indrelid, x.relname, i.indisunique,
       ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY u(n, o)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.n
              WHERE u.o <= i.indnkeyatts ORDER BY u.o),
       0 = ANY(i.indkey::int2[]), i.indpred IS NOT NULL, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
 WHERE i.indrelid = ANY(%(oids)s)
   AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid)
 ORDER BY i.indrelid, x.relname"""

ENUMS = """
SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace JOIN pg_enum e ON e.enumtypid = t.oid
 WHERE n.nspname = %(schema)s GROUP BY t.typname ORDER BY t.typname"""

OTHER_TYPES = """
SELECT t.typname, t.typtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = %(schema)s AND t.typtype IN ('d', 'r', 'm')
    OR (n.nspname = %(schema)s AND t.typtype = 'c'
        AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')"""


def tables(conn: psycopg.Connection, schema: str) -> list[Table]:
    """Every table of ``schema`` (partitions are read as their parent), with its columns, constraints
    and the indexes no constraint owns. Call inside a transaction after :func:`qualified_names`."""
    by_oid: dict[int, Table] = {}
    for oid, name, kind, persistence, ident, rows, size, toast, ident_index in conn.execute(
        TABLES, {"schema": schema}
    ).fetchall():
        by_oid[oid] = Table(name, kind, persistence, ident, rows, size, toast)
        by_oid[oid].replica_index = ident_index
    oids = list(by_oid)
    for oid, *row in conn.execute(COLUMNS, {"oids": oids}).fetchall():
        by_oid[oid].columns.append(Column(*row))
    for oid, name, kind, cols, definition, ref, ref_schema, ref_cols in conn.execute(
        CONSTRAINTS, {"oids": oids}
    ).fetchall():
        by_oid[oid].constraints.append(
            Constraint(name, kind, list(cols), definition, ref, ref_schema, list(ref_cols))
        )
    for oid, name, unique, cols, expression, partial, definition in conn.execute(
        INDEXES, {"oids": oids}
    ).fetchall():
        by_oid[oid].indexes.append(
            Index(name, unique, [] if expression else list(cols), partial, definition)
        )
    return list(by_oid.values())


def enum_types(conn: psycopg.Connection, schema: str) -> dict[str, list[str]]:
    """The enum types of ``schema``: name → labels in their order."""
    return {name: list(labels) for name, labels in conn.execute(ENUMS, {"schema": schema})}


def other_types(conn: psycopg.Connection, schema: str) -> list[str]:
    """Domains, range, multirange and composite types of ``schema`` (the baseline does not write them)."""
    return [f"{name} ({kind})" for name, kind in conn.execute(OTHER_TYPES, {"schema": schema})]


# The migration tables of the tools an app's history may come from, and how each reads: the applied
# migrations' count and the last one's name. golang-migrate's and Rails' ``schema_migrations`` differ by
# their columns (golang-migrate keeps one row: its version and a dirty flag).
HISTORY_TABLES = {
    "django_migrations": (
        "django",
        "SELECT count(*), (SELECT app || '.' || name FROM {t} ORDER BY id DESC LIMIT 1), false FROM {t}",
    ),
    "alembic_version": (
        "alembic",
        "SELECT count(*), string_agg(version_num, ',' ORDER BY version_num), false FROM {t}",
    ),
    "_prisma_migrations": (
        "prisma",
        """SELECT count(*) FILTER (WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL),
                  (SELECT migration_name FROM {t} WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL
                    ORDER BY finished_at DESC, migration_name DESC LIMIT 1),
                  bool_or(finished_at IS NULL AND rolled_back_at IS NULL) FROM {t}""",
    ),
    "flyway_schema_history": (
        "flyway",
        """SELECT count(*) FILTER (WHERE success), (SELECT coalesce(version, description) FROM {t}
                   WHERE success ORDER BY installed_rank DESC LIMIT 1), bool_or(NOT success) FROM {t}""",
    ),
}
GOLANG_MIGRATE = "SELECT NULL::bigint, max(version)::text, bool_or(dirty) FROM {t}"
RAILS = "SELECT count(*), max(version), false FROM {t}"


def history(conn: psycopg.Connection, schema: str, present: set[str]) -> list[tuple]:
    """(table, tool, applied, last, dirty) for each migration table of a known tool in ``present``
    (the schema's table names): how many migrations the app's tool recorded as applied (None for
    golang-migrate, which keeps only its current version), the last one, and whether the tool left
    one half-applied (golang-migrate's dirty flag, a Prisma migration started and not finished, a
    failed Flyway row)."""
    out = []
    checks = dict(HISTORY_TABLES)
    if "schema_migrations" in present:
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
                (f"{_quote(schema)}.schema_migrations",),
            )
        }
        checks["schema_migrations"] = (
            ("golang-migrate", GOLANG_MIGRATE) if "dirty" in columns else ("rails", RAILS)
        )
    for table, (tool, text) in checks.items():
        if table not in present:
            continue
        query = sql.SQL(text.replace("{t}", "{table}")).format(table=sql.Identifier(schema, table))
        applied, last, dirty = conn.execute(query).fetchone()
        out.append((table, tool, None if applied is None else int(applied), last, bool(dirty)))
    return out


def _quote(name: str) -> str:
    return sql.Identifier(name).as_string(None)


STATEMENTS_SCHEMA = (
    "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_stat_statements'"
)
STATEMENTS = """
SELECT query, sum(calls)::bigint, sum(total_exec_time)::float8
  FROM {view}
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel
 GROUP BY query ORDER BY 3 DESC"""


def statements(conn: psycopg.Connection) -> tuple[list[tuple[str, int, float]] | None, str]:
    """This database's statements from ``pg_stat_statements`` (text, calls, total ms), or None and
    why not (the extension is not installed, or its library is not preloaded)."""
    row = conn.execute(STATEMENTS_SCHEMA).fetchone()
    if row is None:
        return None, "pg_stat_statements is not installed in this database"
    view = sql.SQL("{}.pg_stat_statements").format(sql.Identifier(row[0]))
    try:
        with conn.transaction():
            rows = conn.execute(sql.SQL(STATEMENTS).format(view=view)).fetchall()
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:
        return None, f"pg_stat_statements cannot be read: {str(exc).splitlines()[0]}"
    return [(q, int(c), float(t)) for q, c, t in rows], ""


NOT_CARRIED = """
SELECT 'trigger ' || t.tgname || ' on ' || c.relname
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND NOT t.tgisinternal AND c.relname = ANY(%(tables)s)
UNION ALL
SELECT CASE c.relkind WHEN 'v' THEN 'view ' ELSE 'materialized view ' END || c.relname
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relkind IN ('v', 'm')
UNION ALL
SELECT 'policy ' || p.polname || ' on ' || c.relname
  FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s)
UNION ALL
SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = %(schema)s
   AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                              AND d.deptype = 'e')
ORDER BY 1"""


def not_carried(conn: psycopg.Connection, schema: str, tables: list[str]) -> list[str]:
    """What the baseline does not write: triggers and row-level policies on ``tables``, and the
    schema's views and functions (those of extensions aside)."""
    return [r[0] for r in conn.execute(NOT_CARRIED, {"schema": schema, "tables": tables})]
