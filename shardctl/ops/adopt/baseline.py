"""``shardctl adopt baseline --from DSN --plan FILE``: the adopted tables' current definitions as the
fleet's first migration, ``V0001__baseline.sql``, written into the topology's migrations folder.

The file is a Jinja template like every migration (``sql.baseline``): the sharded tables (the plan's
root and ``column`` tables) qualified by ``{{ schema|ident }}``, each ID column ``bigint`` with
``DEFAULT {{ next_id }}()`` instead of its old sequence or identity, the schema's enum types, the
constraints and indexes, and the foreign keys between sharded tables. Global tables stay out of the
shards; the app's migration tables are not adopted: the history they record is the plan's
``history`` (applied up to its ``last``), and the baseline's header says so, so the team's next
migration is ``V0002``.

It reads the database again, in one read-only snapshot, and refuses a plan that no longer describes
it (BadInput: plan again) or one with blockers (OperationFailed: fix them, plan again). The rendered
file is checked as ``migrate`` checks a migration, for a shard, before it is written; nothing is
written on an error, nor with ``dry_run``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, OperationFailed, first_few
from ...model.documents import Result
from ...model.topology import Topology
from ...sql import baseline as ddl
from ...sql.catalog import adopt as catalog
from ...sql.migrations import Migration, load
from .plan import AdoptPlan, History, read_plan, read_plan_snapshot, read_source, source_host

FILE_NAME = "V0001__baseline.sql"


@dataclass
class BaselineResult(Result):
    command = "adopt baseline"

    file: str
    tables: list[str] = field(default_factory=list)  # the sharded tables the baseline creates
    types: list[str] = field(default_factory=list)
    global_tables: list[str] = field(default_factory=list)  # not in the shards
    history: list[History] = field(default_factory=list)  # recorded as applied (the plan's)
    not_carried: list[str] = field(default_factory=list)  # objects the baseline does not write
    written: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True  # a baseline that cannot be written raises instead

    def raise_for_status(self) -> BaselineResult:
        return self


def _target(topo: Topology, target: Path | None) -> Path:
    if target is None:
        if topo.migrations_dir is None:
            raise BadInput("the topology names no migrations folder: give --to DIR")
        target = topo.migrations_dir
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise BadInput(f"--to {target}: not a directory")
    if target.exists() and load(target):
        raise BadInput(
            f"{target} already holds migrations ({load(target)[0].name}): the baseline is the fleet's "
            f"first migration; write it into an empty folder"
        )
    return target


def _compare(doc: dict[str, Any], fresh: AdoptPlan, path: Path) -> None:
    """BadInput naming the first table whose place the plan file and the database disagree on."""
    planned = {t["name"]: (t["kind"], t["key"], t["id_column"]) for t in doc["tables"]}
    now = {t.name: (t.kind, t.key, t.id_column) for t in fresh.tables}
    for name in sorted(set(planned) | set(now)):
        if planned.get(name) != now.get(name):
            raise BadInput(
                f"--plan {path} is stale: table {name} is {planned.get(name) or 'not in it'} there and "
                f"{now.get(name) or 'gone'} in the database now; run adopt plan again"
            )
    if doc["blockers"] and not fresh.blockers:
        raise BadInput(
            f"--plan {path} lists blockers the database no longer has: run adopt plan again"
        )


def adopt_baseline(
    topo: Topology,
    dsn: str,
    plan_file: Path,
    *,
    target: Path | None = None,
    dry_run: bool = False,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> BaselineResult:
    """Write ``V0001__baseline.sql`` (into ``target``, default the topology's migrations folder) from
    the database at ``dsn`` as the plan file ``plan_file`` describes it."""
    started = time.perf_counter()
    doc = read_plan(Path(plan_file))
    folder = _target(topo, target)
    host = source_host(dsn)
    conn = read_source(host, connect_timeout, "adopt baseline")
    try:
        fresh, tables = read_plan_snapshot(conn, topo, host, doc["schema"], doc["root"])
        _compare(doc, fresh, Path(plan_file))
        if fresh.blockers:
            raise OperationFailed(
                f"adopt baseline: the plan has {len(fresh.blockers)} blocker(s): "
                f"{first_few(fresh.blockers, 1, lambda b: b.message)}; fix them and plan again",
                report=fresh.to_dict(),
            )
        enums = catalog.enum_types(conn, fresh.schema)
        sharded = [t.name for t in fresh.tables if t.sharded]
        not_carried = catalog.not_carried(conn, fresh.schema, sharded)
        not_carried += [f"type {t}" for t in catalog.other_types(conn, fresh.schema)]
        conn.rollback()
    finally:
        conn.close()
    result = BaselineResult(
        str(folder / FILE_NAME),
        tables=sharded,
        types=sorted(enums),
        global_tables=[t.name for t in fresh.tables if t.kind == "global"],
        history=fresh.history,
        not_carried=not_carried,
    )
    text = _text(fresh, tables, enums, result)
    Migration(1, "baseline", folder / FILE_NAME, text).sql(
        topo, 0
    )  # renders and parses, or BadInput
    if not dry_run:
        _write(folder, text)
        result.written = True
    result.seconds = time.perf_counter() - started
    return result


def _text(
    plan: AdoptPlan,
    tables: dict[str, catalog.Table],
    enums: dict[str, list[str]],
    result: BaselineResult,
) -> str:
    for name in result.tables:
        bad = [
            c.name
            for c in tables[name].columns
            if c.sequence and c.name != plan.table(name).id_column and not c.identity
        ]
        if bad:
            raise BadInput(
                f"{name}.{bad[0]} takes its default from a sequence but is not the table's ID: the "
                f"baseline cannot give each shard that sequence; give the column a default of its own"
            )
        if tables[name].kind == "p":
            raise BadInput(
                f"{name} is partitioned: the baseline does not write partitioned tables yet"
            )
    lines = [
        f"shardctl adopt baseline: schema {plan.schema} of {plan.source} (PostgreSQL {plan.server_version}),",
        f"sharded by {plan.root}.{plan.root_key} ({plan.routing_key}).",
        "ID columns take next_id() instead of their sequence; old rows keep their IDs.",
    ]
    lines += [
        f"The app's history: {h.tool} ({h.table}), "
        f"{'' if h.applied is None else f'{h.applied} migration(s) '}applied up to {h.last}; "
        f"the next migration follows as V0002."
        for h in plan.history
    ]
    if result.global_tables:
        lines.append(
            f"Global tables, not in the shards (they stay on {plan.global_host}): "
            f"{', '.join(result.global_tables)}."
        )
    if result.not_carried:
        lines.append(f"Not carried: {', '.join(result.not_carried)}.")
    parts = [ddl.header(lines), "\n"]
    parts += [ddl.enum_type(name, labels) for name, labels in enums.items()]
    for name in result.tables:
        parts += ["\n", ddl.create_table(tables[name], plan.schema, plan.table(name).id_column)]
        parts.append(ddl.indexes(tables[name], plan.schema))
    keys = "".join(ddl.foreign_keys(tables[n], plan.schema, result.tables) for n in result.tables)
    if keys:
        parts += ["\n", keys]
    return "".join(parts)


def _write(folder: Path, text: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / FILE_NAME, "x", encoding="utf-8") as out:  # "x": never overwrite
            out.write(text)
    except OSError as exc:
        raise BadInput(f"cannot write {folder / FILE_NAME}: {exc}") from None
