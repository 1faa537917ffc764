"""shardctl's own lint rules for schema-per-shard migrations, read from pglast's parse tree.

A migration runs once per shard, in the shard's schema. These rules flag what works on the first
shard and silently does something else on the next thousand:

* ``shard-catalog-lookup-no-schema``: a catalog (``pg_class``, ``pg_constraint``, ``pg_indexes``, …)
  or ``information_schema`` lookup by object name with no schema filter. It finds the first shard's
  object on every shard (the ``IF NOT EXISTS (SELECT … FROM pg_constraint WHERE conname = …)`` bug).
* ``shard-fixed-schema``: a schema qualifier other than the shard's own (``public.users``,
  ``insta0.photos``), in names, function calls, types and ``'x.y'::regclass`` literals.
* ``shard-database-wide``: statements that act on the whole database or cluster (``CREATE
  EXTENSION``, roles, ``GRANT role``, ``ALTER SYSTEM``, ``ALTER DATABASE``, tablespaces): they belong
  in a host-level migration, once per host.
* ``shard-search-path``: ``SET search_path`` or ``set_config('search_path', …)``.
* ``shard-concurrently-in-transaction``: ``CONCURRENTLY`` in a migration shardctl wraps in a
  transaction (no ``-- shardctl:no-transaction`` directive): PostgreSQL refuses it there.
* ``shard-sequence-bypasses-next-id``: ``CREATE SEQUENCE``, ``serial`` types and identity columns
  mint IDs without the shard number; ``DEFAULT {{ next_id }}()`` puts it in every ID.

Statements inside ``DO`` blocks and function bodies are checked too: PL/pgSQL bodies through
``pglast.parse_plpgsql`` (each embedded statement and expression re-parsed), SQL bodies directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pglast
from pglast import ast

CATALOG = "shard-catalog-lookup-no-schema"
FIXED_SCHEMA = "shard-fixed-schema"
DATABASE_WIDE = "shard-database-wide"
SEARCH_PATH = "shard-search-path"
CONCURRENTLY = "shard-concurrently-in-transaction"
SEQUENCE = "shard-sequence-bypasses-next-id"
RULES = (CATALOG, FIXED_SCHEMA, DATABASE_WIDE, SEARCH_PATH, CONCURRENTLY, SEQUENCE)
# What makes shards silently wrong: the migration succeeds on every shard, but some (or all) of them end
# up with another schema's object or none. These findings lead lint's output and the import's list.
SILENTLY_WRONG = (CATALOG, FIXED_SCHEMA, SEARCH_PATH)

HINTS = {
    CATALOG: "filter by the shard's schema too: AND connamespace = {{ schema|literal }}::regnamespace, "
    "AND schemaname = {{ schema|literal }}, or look the object up as {{ schema|literal }}::regnamespace",
    FIXED_SCHEMA: "qualify with the shard's own schema, {{ schema|ident }}; what every shard shares "
    "(extensions, types) belongs to a host-level migration",
    DATABASE_WIDE: "move it to a host-level migration: it runs once per host database, not once per shard",
    SEARCH_PATH: "qualify names with {{ schema|ident }} instead; a changed search_path outlives the shard "
    "on a pooled connection",
    CONCURRENTLY: "put -- shardctl:no-transaction on the file's first line (one statement per file, with "
    "IF NOT EXISTS), or drop CONCURRENTLY",
    SEQUENCE: "use bigint DEFAULT {{ next_id }}(): its IDs carry the shard number and stay unique across "
    "the fleet",
}

# Name columns of catalog relations and information_schema views: a lookup by one of these names an object.
NAME_COLUMNS = {
    "relname",
    "conname",
    "indexname",
    "tablename",
    "viewname",
    "matviewname",
    "sequencename",
    "proname",
    "typname",
    "tgname",
    "attname",
    "polname",
    "policyname",
    "collname",
    "indexrelname",
    "table_name",
    "constraint_name",
    "column_name",
    "routine_name",
    "sequence_name",
    "trigger_name",
    "udt_name",
    "domain_name",
    "view_name",
}
# Columns (and casts) that pin a lookup to one schema or one relation.
SCHEMA_COLUMNS = {
    "relnamespace",
    "connamespace",
    "pronamespace",
    "typnamespace",
    "collnamespace",
    "nspname",
    "schemaname",
    "table_schema",
    "constraint_schema",
    "routine_schema",
    "sequence_schema",
    "trigger_schema",
    "specific_schema",
    "udt_schema",
    "domain_schema",
    "view_schema",
    "conrelid",
    "attrelid",
    "indrelid",
    "tgrelid",
    "polrelid",
    "confrelid",
    "relid",
}
REG_TYPES = {"regclass", "regnamespace", "regproc", "regprocedure", "regtype"}
SHARED_SCHEMAS = {"pg_catalog", "information_schema", "pg_temp"}
SERIAL_TYPES = {"serial", "serial2", "serial4", "serial8", "smallserial", "bigserial"}
_WIDE = {
    "CreateExtensionStmt": "CREATE EXTENSION",
    "AlterExtensionStmt": "ALTER EXTENSION",
    "CreateRoleStmt": "CREATE ROLE",
    "AlterRoleStmt": "ALTER ROLE",
    "AlterRoleSetStmt": "ALTER ROLE … SET",
    "DropRoleStmt": "DROP ROLE",
    "GrantRoleStmt": "GRANT/REVOKE of a role",
    "AlterSystemStmt": "ALTER SYSTEM",
    "AlterDatabaseStmt": "ALTER DATABASE",
    "AlterDatabaseSetStmt": "ALTER DATABASE … SET",
    "AlterDatabaseRefreshCollStmt": "ALTER DATABASE … REFRESH COLLATION VERSION",
    "CreatedbStmt": "CREATE DATABASE",
    "DropdbStmt": "DROP DATABASE",
    "CreateTableSpaceStmt": "CREATE TABLESPACE",
    "DropTableSpaceStmt": "DROP TABLESPACE",
}


# Statements that name what they create or change by a list of names (schema first when qualified).
_NAMED_BY_LIST = {
    "CreateFunctionStmt": "funcname",
    "CreateEnumStmt": "typeName",
    "AlterEnumStmt": "typeName",
    "CreateDomainStmt": "domainname",
    "DefineStmt": "defnames",
    "ObjectWithArgs": "objname",
}


_DROP_ON_TABLE = {
    pglast.enums.ObjectType.OBJECT_TRIGGER,
    pglast.enums.ObjectType.OBJECT_POLICY,
    pglast.enums.ObjectType.OBJECT_RULE,
}


@dataclass
class Hit:
    rule: str
    line: int
    column: int
    message: str

    @property
    def help(self) -> str:
        return HINTS[self.rule]


def walk(node) -> Iterator[ast.Node]:
    """Every node under ``node`` (itself included), depth first."""
    if isinstance(node, ast.Node):
        yield node
        for name in node.__slots__:
            yield from walk(getattr(node, name, None))
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from walk(item)


def _names(items) -> list[str]:
    return [getattr(x, "sval", None) or "" for x in items or ()]


def _loc(node, default: int) -> int:
    loc = getattr(node, "location", None)
    return loc if isinstance(loc, int) and loc >= 0 else default


class _Checker:
    """The rules over one rendered migration; ``hits`` in file order."""

    def __init__(self, sql: str, schema: str, transactional: bool):
        self.sql, self.schema, self.transactional = sql, schema, transactional
        self.hits: dict[tuple[str, int, int], Hit] = {}

    def hit(self, rule: str, offset: int, message: str) -> None:
        line = self.sql.count("\n", 0, offset) + 1
        column = offset - (self.sql.rfind("\n", 0, offset) + 1) + 1
        self.hits.setdefault((rule, line, column), Hit(rule, line, column, message))

    def run(self) -> list[Hit]:
        try:
            stmts = pglast.parse_sql(self.sql)
        except pglast.parser.ParseError:
            return []  # migrate's own parse (Migration.sql) names the file and line of a syntax error
        for raw in stmts:
            self.statement(raw.stmt, raw.stmt_location or 0, lambda off: off)
        return sorted(self.hits.values(), key=lambda h: (h.line, h.column, h.rule))

    def statement(self, stmt, base: int, where) -> None:
        """Check one statement; ``where(offset)`` maps a location in its text to one in the file."""
        kind = type(stmt).__name__
        at = where(base)
        if kind in _WIDE:
            self.hit(
                DATABASE_WIDE,
                at,
                f"{_WIDE[kind]} in a shard migration: it acts on the whole "
                f"database (or cluster), once per shard",
            )
        if isinstance(stmt, ast.VariableSetStmt) and (stmt.name or "").lower() == "search_path":
            self.hit(SEARCH_PATH, at, "SET search_path in a shard migration")
        if isinstance(stmt, (ast.CreateFunctionStmt, ast.DoStmt)):
            self.bodies(stmt, base, where)
        for node in walk(stmt):
            self.node(node, base, where)

    def node(self, node, base: int, where) -> None:
        at = where(_loc(node, base))
        if isinstance(node, ast.SelectStmt):
            self.catalog_lookup(node, base, where)
        elif isinstance(node, ast.RangeVar):
            self.qualifier(node.schemaname, f"{node.schemaname}.{node.relname}", at)
        elif isinstance(node, ast.FuncCall):
            name = _names(node.funcname)
            if len(name) > 1:
                self.qualifier(name[0], ".".join(name), at)
            args = node.args or ()
            if (
                name[-1] == "set_config"
                and args
                and isinstance(args[0], ast.A_Const)
                and getattr(args[0].val, "sval", "") == "search_path"
            ):
                self.hit(SEARCH_PATH, at, "set_config('search_path', …) in a shard migration")
        elif isinstance(node, ast.TypeName):
            name = _names(node.names)
            if len(name) > 1:
                self.qualifier(name[0], ".".join(name), at)
            if name and name[-1] in SERIAL_TYPES:
                self.hit(
                    SEQUENCE,
                    at,
                    f"{name[-1]} column: its sequence mints IDs without the shard number",
                )
        elif isinstance(node, ast.TypeCast):
            self.regclass_literal(node, at)
        # CREATE FUNCTION public.f, CREATE TYPE public.mood, …
        elif type(node).__name__ in _NAMED_BY_LIST:
            name = _names(getattr(node, _NAMED_BY_LIST[type(node).__name__], None))
            if len(name) > 1:
                self.qualifier(name[0], ".".join(name), at)
        elif isinstance(node, ast.DropStmt):
            # DROP TRIGGER t ON tbl (and POLICY, RULE) lists [tbl…, t]: the table's own qualifier
            # comes before two more names, not one
            on_table = node.removeType in _DROP_ON_TABLE
            for obj in node.objects or ():
                name = _names(obj) if isinstance(obj, (list, tuple)) else []
                if len(name) > (2 if on_table else 1):
                    self.qualifier(name[0], ".".join(name), at)
        self.concurrently(node, at)
        if isinstance(node, ast.CreateSeqStmt) and not node.for_identity:
            self.hit(
                SEQUENCE,
                at,
                "CREATE SEQUENCE in a shard migration: its values carry no shard number",
            )
        elif (
            isinstance(node, ast.Constraint)
            and node.contype == pglast.enums.ConstrType.CONSTR_IDENTITY
        ):
            self.hit(
                SEQUENCE, at, "identity column: its sequence mints IDs without the shard number"
            )

    def concurrently(self, node, at: int) -> None:
        if not self.transactional:
            return
        what = None
        if isinstance(node, ast.IndexStmt) and node.concurrent:
            what = "CREATE INDEX CONCURRENTLY"
        elif isinstance(node, ast.DropStmt) and node.concurrent:
            what = "DROP INDEX CONCURRENTLY"
        elif isinstance(node, ast.ReindexStmt) and any(
            getattr(p, "defname", "") == "concurrently" for p in node.params or ()
        ):
            what = "REINDEX CONCURRENTLY"
        elif isinstance(node, ast.PartitionCmd) and node.concurrent:
            what = "DETACH PARTITION CONCURRENTLY"
        if what:
            self.hit(
                CONCURRENTLY,
                at,
                f"{what} in a migration shardctl runs inside a transaction "
                f"(no -- shardctl:no-transaction directive): PostgreSQL refuses it",
            )

    def qualifier(self, schema: str | None, name: str, at: int) -> None:
        if schema and schema != self.schema and schema.lower() not in SHARED_SCHEMAS:
            self.hit(
                FIXED_SCHEMA,
                at,
                f"fixed schema {schema!r} in {name}: every shard would use "
                f"{schema}'s object, not its own ({self.schema} here)",
            )

    def regclass_literal(self, node: ast.TypeCast, at: int) -> None:
        names = _names(node.typeName.names if node.typeName else ())
        if names and names[-1] in REG_TYPES and isinstance(node.arg, ast.A_Const):
            text = getattr(node.arg.val, "sval", None) or ""
            if "." in text:
                self.qualifier(text.split(".", 1)[0].strip('"'), text, at)

    def catalog_lookup(self, select: ast.SelectStmt, base: int, where) -> None:
        """A catalog relation in FROM, a name column compared, and no schema column or reg* cast."""
        catalog = [
            r
            for r in walk(select.fromClause)
            if isinstance(r, ast.RangeVar)
            and (
                (r.relname or "").startswith("pg_")
                and (r.schemaname in (None, "pg_catalog"))
                or (r.schemaname or "").lower() == "information_schema"
            )
        ]
        if not catalog:
            return
        columns = _compared_to_values(select)
        casts = {
            _names(t.typeName.names)[-1]
            for t in walk(select)
            if isinstance(t, ast.TypeCast) and t.typeName is not None
        }
        named = sorted(columns & NAME_COLUMNS)
        if named and not columns & SCHEMA_COLUMNS and not casts & REG_TYPES:
            rel = catalog[0]
            what = f"{rel.schemaname}.{rel.relname}" if rel.schemaname else rel.relname
            self.hit(
                CATALOG,
                where(_loc(rel, base)),
                f"lookup in {what} by {named[0]} with no schema "
                f"filter: on every shard it finds the first shard's object",
            )

    def bodies(self, stmt, base: int, where) -> None:
        """The statements inside a DO block or a function body, at their lines in the file."""
        options = stmt.args if isinstance(stmt, ast.DoStmt) else stmt.options
        language = next(
            (getattr(o.arg, "sval", None) for o in options or () if o.defname == "language"),
            "plpgsql" if isinstance(stmt, ast.DoStmt) else "sql",
        )
        body_opt = next((o for o in options or () if o.defname == "as"), None)
        if body_opt is None:
            return
        arg = body_opt.arg
        body = arg.sval if isinstance(arg, ast.String) else (_names(arg)[0] if arg else "")
        start = self.sql.find(body, where(_loc(body_opt, base))) if body else -1
        if start < 0:
            return
        if language == "sql":
            try:
                inner = pglast.parse_sql(body)
            except pglast.parser.ParseError:
                return
            for raw in inner:
                self.statement(raw.stmt, raw.stmt_location or 0, lambda off, s=start: s + off)
        elif language == "plpgsql":
            self.plpgsql(body, start)

    def plpgsql(self, body: str, start: int) -> None:
        wrapped = (
            "CREATE FUNCTION pg_temp.shardctl_lint() RETURNS void LANGUAGE plpgsql "
            f"AS $shardctl_lint${body}$shardctl_lint$"
        )
        try:
            tree = pglast.parse_plpgsql(wrapped)
        except Exception:  # noqa: BLE001 - a body PostgreSQL would refuse is squawk's and migrate's to report
            return
        for expr in _plpgsql_exprs(tree):
            query = expr.get("query") or ""
            text = query if expr.get("parseMode", 0) == 0 else f"SELECT {query}"
            # Where the text stands in the body: PERFORM's query reads "SELECT …" but the body "PERFORM …".
            shift, found = (
                (0, body.find(query)) if text is query else (-len("SELECT "), body.find(query))
            )
            if found < 0 and text.startswith("SELECT "):
                shift, found = -len("SELECT "), body.find(text[len("SELECT ") :])
            origin = start + max(found, 0)
            try:
                inner = pglast.parse_sql(text)
            except pglast.parser.ParseError:
                continue
            for raw in inner:
                self.statement(
                    raw.stmt,
                    raw.stmt_location or 0,
                    lambda off, o=origin, d=shift: o + max(0, off + d),
                )


def _column(node) -> str | None:
    if isinstance(node, ast.ColumnRef) and node.fields and isinstance(node.fields[-1], ast.String):
        return node.fields[-1].sval
    return None


def _compared_to_values(select: ast.SelectStmt) -> set[str]:
    """Columns compared with a value (a constant, a cast, a function, a list), not with another column:
    ``c.relname = 'photos'`` counts, the join ``c.oid = a.attrelid`` does not."""
    out = set()
    for e in walk(select):
        if isinstance(e, ast.A_Expr):
            left, right = _column(e.lexpr), _column(e.rexpr)
            if left and not right:
                out.add(left)
            elif right and not left:
                out.add(right)
    return out


def _plpgsql_exprs(tree) -> Iterator[dict]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "PLpgSQL_expr" and isinstance(value, dict):
                yield value
            else:
                yield from _plpgsql_exprs(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _plpgsql_exprs(item)


def check(
    sql: str, schema: str, *, transactional: bool = True, rules: tuple[str, ...] = RULES
) -> list[Hit]:
    """The rules' findings in one rendered migration (``schema``: the shard's own schema name)."""
    return [h for h in _Checker(sql, schema, transactional).run() if h.rule in rules]
