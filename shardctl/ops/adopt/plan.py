"""``shardctl adopt plan --from DSN``: how one live PostgreSQL database would become the topology's
fleet, read-only.

It reads, in one read-only snapshot, the catalog of one schema (``public`` by default), the app's
migration history table and ``pg_stat_statements`` where installed, and returns (and writes, with
``out``, as the plan file the team reviews and commits):

* each table's shard key (:mod:`.keys`): the topology's ``routing.key`` column, the root table's key,
  or a foreign-key path to it; colocated groups; global tables, which stay unsharded on the host the
  topology names in ``placement.global_host`` (the first host when it names none);
* the blockers (:mod:`.blockers`), one line each with its fix;
* the app's statements classed single-shard, multi-shard, fan-out, unroutable or global, with each
  class's count and share of the execution time (:mod:`.queries`).

The result is ``ok`` without blockers; ``raise_for_status`` raises OperationFailed (exit 1)
otherwise. Nothing is changed on the database either way (the transaction is READ ONLY).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, OperationFailed, first_few
from ...model import dsn as dsnlib
from ...model.documents import Result
from ...model.topology import Host, Topology
from ...sql.catalog import adopt as catalog
from ...sql.catalog import inspect
from . import blockers as rules
from .blockers import Blocker
from .keys import TablePlan, classify, find_root, groups
from .queries import QueryReport, report

PLAN_VERSION = 1


@dataclass
class History:
    """The app's migration tool and what its table records as applied."""

    tool: str
    table: str
    applied: int | None  # None: the tool records only its current version (golang-migrate)
    last: str | None


@dataclass
class AdoptPlan(Result):
    command = "adopt plan"

    source: str  # the DSN, masked
    schema: str
    server_version: str
    routing_key: str
    root: str
    root_key: str
    global_host: str
    shard_count: int
    tables: list[TablePlan] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)
    history: list[History] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    queries: QueryReport = field(default_factory=QueryReport)
    notes: list[str] = field(default_factory=list)
    written: str | None = None  # the plan file written, if any
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.blockers

    def table(self, name: str) -> TablePlan:
        return next(t for t in self.tables if t.name == name)

    def raise_for_status(self) -> AdoptPlan:
        """OperationFailed (exit 1) naming the first blockers, when there are any."""
        if self.blockers:
            raise OperationFailed(
                f"adopt plan: {len(self.blockers)} blocker(s): "
                f"{first_few(self.blockers, 2, lambda b: b.message)}",
                report=self.to_dict(),
            )
        return self

    def document(self) -> dict[str, Any]:
        """The plan file's content: what ``adopt baseline`` reads back, and what a reviewer reads."""
        doc = self.to_dict()
        for key in ("command", "ok", "written", "seconds"):
            doc.pop(key)
        return {"version": PLAN_VERSION, **doc}


def source_host(dsn: str) -> Host:
    """The database to adopt as a host shardctl can connect to (BadInput for a DSN libpq refuses)."""
    try:
        dsnlib.parse(dsn)
    except ValueError as exc:
        raise BadInput(f"--from: not a valid libpq connection string: {exc}") from None
    return Host(name="source", dsn=dsn, shards=[], pooler="none")


def adopt_plan(
    topo: Topology,
    dsn: str,
    *,
    schema: str = "public",
    root: str | None = None,
    out: Path | None = None,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> AdoptPlan:
    """Read the database at ``dsn`` and plan its adoption into ``topo``'s fleet (read-only); write the
    plan file to ``out`` when given, blockers or not (it is what the team reviews)."""
    started = time.perf_counter()
    if not topo.routing_key:
        raise BadInput("the topology names no routing.key: the plan shards every table by it")
    host = source_host(dsn)
    conn = read_source(host, connect_timeout, "adopt plan")
    try:
        plan, _ = read_plan_snapshot(conn, topo, host, schema, root)
        conn.rollback()
    finally:
        conn.close()
    if out is not None:
        write_plan(plan, Path(out))
    plan.seconds = time.perf_counter() - started
    return plan


def read_source(host: Host, connect_timeout: int, purpose: str) -> psycopg.Connection:
    """A read-only connection to the database to adopt, whose transaction sees one snapshot."""
    conn = db.connect(host, connect_timeout=connect_timeout, purpose=purpose)
    conn.read_only = True
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return conn


def read_plan_snapshot(
    conn: Any, topo: Topology, host: Host, schema: str, root: str | None
) -> tuple[AdoptPlan, dict[str, catalog.Table]]:
    """The plan of the database on ``conn`` (in its current transaction), and the tables it read."""
    facts = inspect.server_facts(conn)
    catalog.qualified_names(conn)
    tables = {t.name: t for t in catalog.tables(conn, schema)}
    if not tables:
        raise BadInput(f"schema {schema} of {host.masked_dsn} holds no table to adopt")
    key = topo.routing_key
    root, root_key = find_root(tables, schema, key, root)
    plans = classify(tables, schema, key, root, root_key)
    found = catalog.history(conn, schema, set(tables))
    history = [History(tool, table, applied, last) for table, tool, applied, last, _ in found]
    adopted = [n for n, p in plans.items() if p.kind != "history"]
    found_blockers = (
        rules.server_blockers(facts, len(topo.hosts))
        + rules.history_blockers(found)
        + rules.replication_blockers(inspect.unmovable(conn, [schema]), schema, adopted)
        + rules.table_blockers(tables, plans, key)
    )
    rows, note = catalog.statements(conn)
    global_host = topo.global_host or topo.hosts[0].name
    notes = (
        []
        if topo.global_host
        else [
            f"placement.global_host is not set: global tables stay on the first host, {global_host}"
        ]
    )
    if note:
        notes.append(f"{note}: no query classes")
    num = facts["version_num"]
    plan = AdoptPlan(
        source=host.masked_dsn,
        schema=schema,
        server_version=f"{num // 10000}.{num % 10000}",
        routing_key=key,
        root=root,
        root_key=root_key,
        global_host=global_host,
        shard_count=topo.shard_count,
        tables=[plans[n] for n in sorted(plans)],
        groups=groups(tables, plans, schema),
        history=history,
        blockers=found_blockers,
        queries=report(rows, note, plans, tables, schema),
        notes=notes,
    )
    return plan, tables


def write_plan(plan: AdoptPlan, path: Path) -> None:
    """The plan file: YAML, a header that says what it is, then :meth:`AdoptPlan.document`."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    buffer = io.StringIO()
    yaml.dump(plan.document(), buffer)
    header = (
        "# shardctl adopt plan: how this database becomes the fleet. Review it and commit it;\n"
        "# `shardctl adopt baseline --plan FILE` reads it back. Regenerate it, do not edit it.\n"
    )
    try:
        path.write_text(header + buffer.getvalue(), encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"--out {path}: cannot write: {exc}") from None
    plan.written = str(path)


def read_plan(path: Path) -> dict[str, Any]:
    """A plan file's document (BadInput when it cannot be read or is not a plan of this version)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="safe", pure=True).load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YAMLError) as exc:
        raise BadInput(f"--plan {path}: cannot read it: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("version") != PLAN_VERSION:
        raise BadInput(f"--plan {path}: not a shardctl adopt plan (version {PLAN_VERSION})")
    missing = [
        k
        for k in ("schema", "routing_key", "root", "tables", "blockers", "history")
        if k not in doc
    ]
    if missing:
        raise BadInput(f"--plan {path}: not a shardctl adopt plan (no {', '.join(missing)})")
    return doc
