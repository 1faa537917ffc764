"""The app's statements (from ``pg_stat_statements``) classed by how the fleet could run them, read
from PostgreSQL's own parse tree (pglast):

* ``single-shard``: every sharded table it reads or writes is pinned to one shard: its key or its
  ID (which holds the shard) compared with ``=`` to one value, or a foreign key to a parent's ID
  along the table's path; tables joined on the key (or along their path) share the pin. An INSERT
  that gives the key, and one into the root table (its new ID picks the shard), are single-shard.
* ``multi-shard``: pinned, but to a list of values (``IN (…)``, ``= ANY(…)``, several VALUES rows);
* ``fan-out``: sharded tables joined on the key but not pinned: every shard runs it;
* ``unroutable``: it cannot run on the fleet as it is: sharded tables joined on anything but the key,
  a global table joined with a sharded one (they live on different hosts), an INSERT without the key;
* ``global``: only global tables (one host).

Statements that touch none of the adopted tables (``BEGIN``, ``SET``, catalog reads) are left out.
Predicates under ``OR`` pin nothing (a conservative reading: such a statement counts as fan-out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pglast import parser as pg_parser

from ...sql.catalog.adopt import Table
from .keys import TablePlan, path_constraint, shard_columns

CLASSES = ("single-shard", "multi-shard", "fan-out", "unroutable", "global")
DML = ("SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt")
MAX_TEXT = 400  # characters of a statement kept in the plan


@dataclass
class Statement:
    query: str
    calls: int
    ms: float
    cls: str
    reason: str


@dataclass
class QueryReport:
    """The classes' totals (statements, calls, share of the total execution time) and each statement."""

    available: bool = False
    note: str = ""
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    statements: list[Statement] = field(default_factory=list)


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _name(node: dict) -> str:
    return node.get("String", {}).get("sval", "")


class _Reader:
    """One statement's references to the adopted tables and its key predicates."""

    def __init__(self, plans: dict[str, TablePlan], tables: dict[str, Table], schema: str):
        self.plans, self.tables, self.schema = plans, tables, schema
        self.refs: dict[str, TablePlan] = {}  # alias (or name) → the table's plan
        self.pins: dict[str, set[str]] = {}  # alias → {"one", "many"}
        self.edges: list[tuple[str, str]] = []

    def tables_of(self, tree: Any) -> None:
        for node in _walk(tree):
            rv = node.get("RangeVar")
            if rv is None and isinstance(node.get("relation"), dict):
                rv = node["relation"]  # INSERT, UPDATE and DELETE name their table unwrapped
            if (
                rv is None
                or "relname" not in rv
                or rv.get("schemaname", self.schema) != self.schema
            ):
                continue
            plan = self.plans.get(rv.get("relname"))
            if plan is not None and plan.kind != "history":
                alias = rv.get("alias", {}).get("aliasname") or plan.name
                self.refs[alias] = plan

    def column(self, node: Any) -> tuple[str, str] | None:
        """(alias, column) of a column reference to an adopted table, or None."""
        while isinstance(node, dict) and "TypeCast" in node:
            node = node["TypeCast"].get("arg")
        ref = node.get("ColumnRef") if isinstance(node, dict) else None
        if ref is None:
            return None
        fields = [_name(f) for f in ref.get("fields", [])]
        if len(fields) == 3 and fields[0] == self.schema:
            fields = fields[1:]  # schema.table.column, as Prisma writes every column
        if len(fields) == 2 and fields[0] in self.refs:
            return fields[0], fields[1]
        if len(fields) == 1:
            owners = [
                a
                for a, p in self.refs.items()
                if any(c.name == fields[0] for c in self.tables[p.name].columns)
            ]
            if len(owners) == 1:
                return owners[0], fields[0]
        return None

    def pin_columns(self, alias: str) -> set[str]:
        """The columns that pin a row of ``alias`` to one shard given one value."""
        return shard_columns(self.tables, self.plans, self.tables[self.refs[alias].name])

    def colocated(self, a: tuple[str, str], b: tuple[str, str]) -> bool:
        """Whether ``a = b`` keeps both rows on one shard: key to key, or a table's path to its parent."""
        pa, pb = self.refs[a[0]], self.refs[b[0]]
        if pa.key and pb.key and a[1] == pa.key and b[1] == pb.key:
            return True
        for (x, cx), (y, cy) in ((a, b), (b, a)):
            px, py = self.refs[x], self.refs[y]
            k = path_constraint(self.tables[px.name], px)
            if k and k.ref_table == py.name and k.columns == [cx] and k.ref_columns == [cy]:
                return True
        return False

    def predicate(self, node: dict) -> None:
        boolean = node.get("BoolExpr")
        if boolean is not None:
            if boolean.get("boolop") == "AND_EXPR":
                for arg in boolean.get("args", []):
                    self.predicate(arg)
            return
        expr = node.get("A_Expr")
        if expr is None:
            return
        kind, op = expr.get("kind"), "".join(_name(n) for n in expr.get("name", []))
        left, right = self.column(expr.get("lexpr")), self.column(expr.get("rexpr"))
        if kind == "AEXPR_OP" and op == "=" and left and right:
            if self.colocated(left, right):
                self.edges.append((left[0], right[0]))
            return
        if kind == "AEXPR_OP" and op == "=" and (left or right) and not (left and right):
            col, other = (left, expr.get("rexpr")) if left else (right, expr.get("lexpr"))
            if col[1] in self.pin_columns(col[0]) and _is_value(other):
                self.pins.setdefault(col[0], set()).add("one")
        elif (
            kind in ("AEXPR_IN", "AEXPR_OP_ANY")
            and op == "="
            and left
            and left[1] in self.pin_columns(left[0])
        ):
            self.pins.setdefault(left[0], set()).add("many")

    def predicates(self, tree: Any) -> None:
        for node in _walk(tree):
            for key in ("whereClause", "quals"):
                if isinstance(node.get(key), dict):
                    self.predicate(node[key])

    def insert(self, stmt: dict) -> str | None:
        """The class of an INSERT … VALUES, or None to read it like the other statements."""
        target = stmt["relation"].get("relname")
        plan = self.plans.get(target)
        values = stmt.get("selectStmt", {}).get("SelectStmt", {}).get("valuesLists")
        if plan is None or not plan.sharded or values is None:
            return None
        columns = [n["ResTarget"]["name"] for n in stmt.get("cols", [])]
        if plan.kind == "root" and plan.key not in columns:
            return "single-shard" if len(values) == 1 else "multi-shard"
        alias = next(a for a, p in self.refs.items() if p is plan)
        if not set(columns) & self.pin_columns(alias):
            return "unroutable"
        return "single-shard" if len(values) == 1 else "multi-shard"


def _is_value(node: Any) -> bool:
    while isinstance(node, dict) and "TypeCast" in node:
        node = node["TypeCast"].get("arg")
    return isinstance(node, dict) and ("ParamRef" in node or "A_Const" in node)


def classify(
    text: str, plans: dict[str, TablePlan], tables: dict[str, Table], schema: str
) -> tuple[str, str] | None:
    """(class, reason) of one statement, or None when it touches no adopted table (or is no DML)."""
    try:
        tree = json.loads(pg_parser.parse_sql_json(text))
    except pg_parser.ParseError:
        return None
    stmts = [s["stmt"] for s in tree.get("stmts", []) if next(iter(s["stmt"]), "") in DML]
    if not stmts:
        return None
    reader = _Reader(plans, tables, schema)
    reader.tables_of(stmts)
    if not reader.refs:
        return None
    sharded = sorted(a for a, p in reader.refs.items() if p.sharded)
    global_ = sorted(a for a, p in reader.refs.items() if not p.sharded)
    if not sharded:
        return "global", f"only global tables ({', '.join(global_)})"
    if global_:
        return "unroutable", (
            f"joins global {', '.join(global_)} with sharded {', '.join(sharded)} (different hosts)"
        )
    insert = stmts[0].get("InsertStmt")
    if insert is not None:
        verdict = reader.insert(insert)
        if verdict == "unroutable":
            return verdict, f"INSERT into {insert['relation']['relname']} without its key"
        if verdict is not None:
            return verdict, "INSERT with its key (or a new root row)"
    reader.predicates(stmts)
    return _verdict(reader, sharded)


def _verdict(reader: _Reader, sharded: list[str]) -> tuple[str, str]:
    parent = {a: a for a in sharded}

    def find(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a

    for a, b in reader.edges:
        if a in parent and b in parent:
            parent[find(a)] = find(b)
    groups = {find(a) for a in sharded}
    if len(groups) > 1:
        return "unroutable", f"joins {', '.join(sharded)} on something other than the shard key"
    kinds = set().union(*(reader.pins.get(a, set()) for a in sharded))
    if not kinds:
        return "fan-out", f"no key or ID pins {', '.join(sharded)} to a shard"
    if "one" in kinds:
        return "single-shard", "its key or ID is given"
    return "multi-shard", "a list of keys or IDs is given"


def report(
    rows: list[tuple[str, int, float]] | None,
    note: str,
    plans: dict[str, TablePlan],
    tables: dict[str, Table],
    schema: str,
) -> QueryReport:
    """Every statement's class, and each class's statements, calls and share of the execution time."""
    out = QueryReport(available=rows is not None, note=note)
    for text, calls, ms in rows or []:
        verdict = classify(text, plans, tables, schema)
        if verdict is not None:
            out.statements.append(Statement(text[:MAX_TEXT], calls, round(ms, 3), *verdict))
    total = sum(s.ms for s in out.statements) or 1.0
    for cls in CLASSES:
        mine = [s for s in out.statements if s.cls == cls]
        out.classes[cls] = {
            "statements": len(mine),
            "calls": sum(s.calls for s in mine),
            "time_share": round(sum(s.ms for s in mine) / total, 4),
        }
    return out
