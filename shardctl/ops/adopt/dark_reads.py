"""Dark reads: the app's own single-shard reads (``pg_stat_statements`` on the source, classed by the
plan's classifier, :mod:`.queries`) run with sampled values on the source and through the ``Router``
on the fleet, and their results compared (as multisets; with ``ORDER BY``, rows in another order
count only where the order is a tie's).

A statement's parameters are read from its parse tree: each ``$n`` compared with a column of one
table (``=``, ``<``, ``>=`` …) takes that column's value from a row sampled on the source, ``LIMIT $n``
reads 100 and ``OFFSET $n`` 0; the Router routes by that row's key. A statement whose parameters
cannot all be filled that way, or whose values come from several tables, is skipped, saying why.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from pglast import parser as pg_parser

from ...errors import OperationFailed
from ...model.topology import Topology
from ...sql.catalog import adopt as catalog
from ...sql.catalog import adopt_verify as state
from .keys import TablePlan
from .queries import _Reader, _walk, classify

MAX_STATEMENTS = 50  # the most-called single-shard reads tried
LIMIT, OFFSET = 100, 0
COMPARISONS = ("=", "<", ">", "<=", ">=", "<>")


@dataclass
class DarkRead:
    """One of the app's statements run on the source and through the Router on the fleet."""

    query: str
    status: str  # ok | differs | skipped
    reads: int = 0
    detail: str = ""


def run_dark_reads(
    topo: Topology,
    doc: dict[str, Any],
    src: psycopg.Connection,
    per_statement: int,
    connect_timeout: int,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
    settle: Settle | None = None,
) -> list[DarkRead]:
    """Each of the app's single-shard reads, ``per_statement`` times with sampled values. ``settle``
    (while the copy replicates): reads the source, then the fleet once it has applied the source's
    WAL past that read (``transfer.at_lag_zero``); a read that differs is read again that way."""
    rows, note = catalog.statements(src)
    if rows is None:
        return [DarkRead("", "skipped", detail=f"no dark reads: {note}")]
    schema = doc["schema"]
    catalog.qualified_names(src)
    tables = {t.name: t for t in catalog.tables(src, schema)}
    plans = {
        t["name"]: TablePlan(
            t["name"], t["kind"], t.get("key"), t.get("path") or [], t.get("id_column")
        )
        for t in doc["tables"]
        if t["name"] in tables
    }
    chosen = []
    for text, calls, _ in sorted(rows, key=lambda r: -r[1]):
        verdict = classify(text, plans, tables, schema)
        if verdict and verdict[0] == "single-shard" and _is_select(text):
            chosen.append(text)
    chosen = chosen[:MAX_STATEMENTS]
    if not chosen:
        return [DarkRead("", "skipped", detail="no single-shard read among the app's statements")]
    from ...router import Router

    fleet = replace(topo, adoption=None) if getattr(topo, "adoption", None) else topo
    tick = progress("dark reads", len(chosen)) if progress else None
    out = []
    with Router(fleet, connect_timeout=connect_timeout) as router:
        for text in chosen:
            reads = _Reads(src, router, schema, settle)
            out.append(_one(text, plans, tables, reads, per_statement))
            if tick:
                tick(1)
    return out


def _is_select(text: str) -> bool:
    try:
        tree = json.loads(pg_parser.parse_sql_json(text))
    except pg_parser.ParseError:
        return False
    stmts = tree.get("stmts", [])
    return len(stmts) == 1 and "SelectStmt" in stmts[0]["stmt"]


def _parameters(
    text: str, plans: dict[str, TablePlan], tables: dict, schema: str
) -> tuple[dict[int, Any], str | None, list[str], str]:
    """({n: fixed value}, the table the other parameters' values come from, {n: column} as a list
    ordered by n, why not) of a statement's ``$n``."""
    tree = json.loads(pg_parser.parse_sql_json(text))
    select = tree["stmts"][0]["stmt"]["SelectStmt"]
    reader = _Reader(plans, tables, schema)
    reader.tables_of(select)
    fixed: dict[int, Any] = {}
    for clause, value in (("limitCount", LIMIT), ("limitOffset", OFFSET)):
        ref = _param(select.get(clause))
        if ref is not None:
            fixed[ref] = value
    columns: dict[int, tuple[str, str]] = {}
    for node in _walk(select):
        expr = node.get("A_Expr")
        if not expr or expr.get("kind") != "AEXPR_OP":
            continue
        op = "".join(n.get("String", {}).get("sval", "") for n in expr.get("name", []))
        for a, b in (("lexpr", "rexpr"), ("rexpr", "lexpr")):
            col, ref = reader.column(expr.get(a)), _param(expr.get(b))
            if op in COMPARISONS and col and ref is not None:
                columns[ref] = col
    numbers = {n["ParamRef"]["number"] for n in _walk(select) if "ParamRef" in n}
    loose = sorted(numbers - set(fixed) - set(columns))
    if loose:
        return fixed, None, [], f"parameter ${loose[0]} is not compared with a column of one table"
    aliases = {alias for alias, _ in columns.values()}
    if len(aliases) > 1:
        return (
            fixed,
            None,
            [],
            f"its parameters take values from several tables ({', '.join(sorted(aliases))})",
        )
    if not aliases:
        return fixed, None, [], "no parameter gives a key to route by"
    alias = aliases.pop()
    return (
        fixed,
        reader.refs[alias].name,
        [columns.get(n, ("", ""))[1] for n in sorted(columns)],
        "",
    )


def _param(node: Any) -> int | None:
    while isinstance(node, dict) and "TypeCast" in node:
        node = node["TypeCast"].get("arg")
    if isinstance(node, dict) and "ParamRef" in node:
        return node["ParamRef"].get("number")
    return None


Settle = Callable[[Callable[[psycopg.Connection], Any], Callable[[], Any]], tuple[Any, Any]]
ROUNDS = 3  # a read that differs is read up to this many times in all


@dataclass
class _Reads:
    """Where a statement is read: the source's connection, the fleet's Router, and the lag-0 wait."""

    src: psycopg.Connection
    router: Any
    schema: str
    settle: Settle | None

    def on_source(self, conn: psycopg.Connection, query: str, params: dict) -> list[tuple]:
        state.read_only_on(conn, self.schema)
        return conn.execute(query, params).fetchall()

    def on_fleet(self, key: Any, query: str, params: dict) -> list[tuple]:
        return list(self.router.execute(key, query, params))  # the primary: no standby lag

    def confirmed(self, key: Any, query: str, params: dict, expected: list[tuple]) -> str:
        """The difference that stays at lag 0 while the source's rows do not change, or ''. With
        nothing replicating, the first difference is the answer."""
        if self.settle is None:
            return _difference(expected, self.on_fleet(key, query, params))
        difference = ""
        for _ in range(ROUNDS - 1):
            now, got = self.settle(
                lambda conn: self.on_source(conn, query, params),
                lambda: self.on_fleet(key, query, params),
            )
            difference = _difference(now, got)
            if not difference or now != expected:
                return ""  # equal at lag 0, or the source's rows are being written
        return difference


def _one(
    text: str, plans: dict[str, TablePlan], tables: dict, reads: _Reads, count: int
) -> DarkRead:
    """One statement's dark reads: ok, differs (the first difference), or skipped (why)."""
    shown = " ".join(text.split())[:200]
    src, schema = reads.src, reads.schema
    fixed, table, names, why = _parameters(text, plans, tables, schema)
    if why:
        return DarkRead(shown, "skipped", detail=why)
    query = state.bind_parameters(state.unqualified(text, schema))
    if query is None:
        return DarkRead(shown, "skipped", detail="the statement's text cannot be scanned")
    numbers = sorted(set(_numbers(text)) - set(fixed))
    key = plans[table].key
    sampled = state.sample_rows(src, schema, table, [*names, key], count)
    if not sampled:
        return DarkRead(shown, "skipped", detail=f"{table} has no rows to sample")
    select = json.loads(pg_parser.parse_sql_json(text))["stmts"][0]["stmt"]["SelectStmt"]
    paged = "limitCount" in select and "sortClause" not in select
    done = 0
    for row in sampled:
        params = {f"p{n}": v for n, v in fixed.items()}
        params.update({f"p{n}": row[i] for i, n in enumerate(numbers)})
        try:
            with src.transaction():
                expected = reads.on_source(src, query, params)
        except psycopg.Error as exc:
            return DarkRead(shown, "skipped", done, f"the source refused it: {_first_line(exc)}")
        try:
            got = reads.on_fleet(row[-1], query, params)
            done += 1
            if paged and len(expected) >= LIMIT:
                continue  # a full page without ORDER BY: either side may return other rows
            if _difference(expected, got):
                difference = reads.confirmed(row[-1], query, params, expected)
                if difference:
                    return DarkRead(
                        shown, "differs", done, f"{key} {row[-1]} ({params}): {difference}"
                    )
        except (psycopg.Error, OperationFailed) as exc:  # the fleet's error is the finding
            return DarkRead(
                shown, "differs", done, f"{key} {row[-1]}: the fleet raised {_first_line(exc)}"
            )
    return DarkRead(shown, "ok", done)


def _numbers(text: str) -> list[int]:
    tree = json.loads(pg_parser.parse_sql_json(text))
    return sorted({n["ParamRef"]["number"] for n in _walk(tree) if "ParamRef" in n})


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _difference(expected: list[tuple], got: list[tuple]) -> str:
    """The first difference between the source's rows and the fleet's, or ''."""
    if [tuple(r) for r in expected] == [tuple(r) for r in got]:
        return ""
    a, b = Counter(repr(tuple(r)) for r in expected), Counter(repr(tuple(r)) for r in got)
    if a == b:
        return ""  # the same rows: in another order only where ORDER BY ties (or none is given)
    if len(expected) != len(got):
        head = f"{len(expected)} row(s) on the source, {len(got)} on the fleet"
    else:
        head = f"{len(expected)} row(s) on both"
    only_source, only_fleet = list((a - b).elements()), list((b - a).elements())
    if only_source:
        return f"{head}; first on the source only: {only_source[0]}"
    return f"{head}; first on the fleet only: {only_fleet[0]}"
