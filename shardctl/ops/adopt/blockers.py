"""What stops a database from being adopted as it is, each a one-line message with its fix.

Each rule says why the fleet could not keep what the database promises today:

* a sharded table with no key column: the copy could not tell its rows' shard without a join (the
  fix adds the column and backfills it from the parent its path names);
* a key column that may be NULL: such a row has no shard;
* a unique constraint (or unique index, or exclusion constraint) without the key: each shard could
  only enforce it among its own rows (a constraint on the ID column is exempt: IDs are unique
  fleet-wide, old ones by the source's sequence, new ones by ``next_id()``);
* a foreign key without the key, or between a sharded and a global table: parent and child may end
  up on different hosts, where no constraint reaches;
* a table logical replication cannot carry (``inspect.unmovable``, the move's own rule): no primary
  key or replica identity, unlogged;
* an ID column of type integer: ``next_id()`` mints 64-bit IDs;
* the server: the version and settings a logical copy needs;
* the app's history tool left a migration half-applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...sql import adopt as fixes
from ...sql.catalog.adopt import Table
from .keys import TablePlan, fk_constraints, fk_holds, path_constraint, shard_columns

# Publication row filters (``CREATE PUBLICATION … WHERE``), which a copy to each host's shards uses.
MIN_VERSION_NUM = 150000


@dataclass
class Blocker:
    kind: str  # no-key-column, nullable-key, unique-without-key, foreign-key, replica-identity,
    #            integer-id, server, history
    table: str | None
    message: str  # one line: what, why, and the fix in words
    fix: list[str] = field(default_factory=list)  # the SQL the fix runs on the old database


def table_blockers(
    tables: dict[str, Table], plans: dict[str, TablePlan], key: str
) -> list[Blocker]:
    """The schema's blockers, table by table in name order."""
    out: list[Blocker] = []
    # parents first: a child's backfill reads the key its parent's fix added
    paths = sorted(
        (p for p in plans.values() if p.kind == "fk-path"), key=lambda p: (len(p.path), p.name)
    )
    out += [_no_key_column(tables, plans, tables[p.name], p, key) for p in paths]
    for name in sorted(plans):
        plan, table = plans[name], tables[name]
        if plan.kind == "history":
            continue
        if plan.sharded and plan.kind != "fk-path":
            column = next(c for c in table.columns if c.name == plan.key)
            if not column.not_null:
                out.append(
                    Blocker(
                        "nullable-key",
                        name,
                        f"{name}.{plan.key} (the shard key) may be NULL, and a row without a key has "
                        f"no shard: fill any NULLs, then SET NOT NULL",
                        [fixes.set_not_null(name, plan.key)],
                    )
                )
        if plan.sharded:
            out += _unique_blockers(tables, plans, table, plan.key or key)
            out += _integer_id(tables, plans, table, plan)
        out += _fk_blockers(table, plans)
    return out


def _no_key_column(
    tables: dict[str, Table], plans: dict[str, TablePlan], table: Table, plan: TablePlan, key: str
) -> Blocker:
    k = path_constraint(table, plan)
    parent = plans[k.ref_table]
    parent_key = parent.key or key
    fix = [  # bigint: keys are the root's IDs, new ones from next_id()
        fixes.add_key_column(table.name, key, "bigint"),
        fixes.backfill_key(table.name, key, k.columns, parent.name, k.ref_columns, parent_key),
    ]
    nullable = any(not c.not_null for c in table.columns if c.name in k.columns)
    if not nullable:
        fix.append(fixes.set_not_null(table.name, key))
    if parent.kind != "root" and len(k.ref_columns) == 1:
        # the foreign key then includes the key: the row stays on its parent's shard, and says so
        actions = k.definition[k.definition.index(")", k.definition.index("REFERENCES")) + 1 :]
        fix += [
            fixes.unique_key_and_id(parent.name, parent_key, k.ref_columns[0]),
            fixes.fk_with_key(
                table.name, k.name, key, k.columns, parent.name, parent_key, k.ref_columns, actions
            ),
        ]
    return Blocker(
        "no-key-column",
        table.name,
        f"{table.name} has no key column: its key comes through {' then '.join(plan.path)}; add "
        f"{key}, backfill it from {parent.name}, and have the app (or a trigger) set it on insert",
        fix,
    )


def _unique_blockers(
    tables: dict[str, Table], plans: dict[str, TablePlan], table: Table, key: str
) -> list[Blocker]:
    plan = plans[table.name]
    items: list[tuple[str, str, list[str], bool, bool]] = [
        (
            k.name,
            {"p": "PRIMARY KEY", "u": "UNIQUE", "x": "EXCLUDE"}[k.kind],
            k.columns,
            True,
            False,
        )
        for k in table.constraints
        if k.kind in "pux"
    ]
    items += [
        (i.name, "unique index", i.columns, False, i.partial or not i.columns)
        for i in table.indexes
        if i.unique
    ]
    placing = shard_columns(tables, plans, table)
    out = []
    for name, what, columns, constraint, odd in items:
        if placing & set(columns):
            continue
        shown = ", ".join(columns) or "an expression"
        if plan.kind == "root":
            how = f"keep these values unique in a global table that maps them to {key}"
            fix = []
        else:
            how = f"make it ({key}, {shown}), or keep these values unique in a global table"
            fix = (
                []
                if odd or what in ("PRIMARY KEY", "EXCLUDE")
                else fixes.unique_with_key(table.name, name, key, columns, constraint)
            )
        out.append(
            Blocker(
                "unique-without-key",
                table.name,
                f"{what} {name} ({shown}) on {table.name} does not include the shard key {key}: each "
                f"shard could only enforce it among its own rows; {how}",
                fix,
            )
        )
    return out


def _fk_blockers(table: Table, plans: dict[str, TablePlan]) -> list[Blocker]:
    out = []
    plan = plans[table.name]
    for k in fk_constraints(table):
        ref = plans.get(k.ref_table)
        if ref is None or ref.kind == "history":
            continue
        if not plan.sharded and not ref.sharded:
            continue  # global to global: both on the global host
        if plan.sharded and fk_holds(table, plans, k):
            continue
        if plan.sharded and ref.sharded:
            why = (
                "does not include the shard key: a row and the row it references may be on "
                "different shards"
            )
        else:
            mine, theirs = ("sharded", "global") if plan.sharded else ("global", "sharded")
            why = f"ties a {mine} table to a {theirs} one, which live on different hosts"
        out.append(
            Blocker(
                "foreign-key",
                table.name,
                f"FOREIGN KEY {k.name} ({', '.join(k.columns)}) -> {k.ref_table}({', '.join(k.ref_columns)}) "
                f"{why}; no constraint reaches across them: drop it and check it in the app",
                [fixes.drop_constraint(table.name, k.name)],
            )
        )
    return out


def _integer_id(
    tables: dict[str, Table], plans: dict[str, TablePlan], table: Table, plan: TablePlan
) -> list[Blocker]:
    """An integer ID column (new IDs are 64-bit), and an integer key column (keys are the root's
    IDs, new ones from ``next_id()`` too); the fix of an ID also widens the non-key columns that
    reference it."""
    small = ("integer", "smallint")
    out = []
    key = next((c for c in table.columns if c.name == plan.key), None)
    if plan.kind != "root" and key is not None and key.type in small:
        out.append(
            Blocker(
                "integer-id",
                table.name,
                f"{table.name}.{key.name} (the shard key) is {key.type}: keys are {plans_root(plans)} "
                f"IDs, new ones from next_id(), which needs bigint; change it to bigint",
                [fixes.to_bigint(table.name, key.name)],
            )
        )
    if plan.id_column is None:
        return out
    column = next(c for c in table.columns if c.name == plan.id_column)
    if column.type not in small or column.name == (
        key.name if key and plan.kind != "root" else None
    ):
        return out
    fix = [fixes.to_bigint(table.name, column.name)]
    for other in sorted(tables):
        for k in fk_constraints(tables[other]):
            if (
                k.ref_table == table.name
                and k.ref_columns == [column.name]
                and k.columns[0] != plans[other].key
            ):
                fix.append(fixes.to_bigint(other, k.columns[0]))
    out.append(
        Blocker(
            "integer-id",
            table.name,
            f"{table.name}.{column.name} is {column.type}: new rows' IDs come from next_id(), which "
            f"needs bigint; change it (and the columns that reference it) to bigint",
            fix,
        )
    )
    return out


def plans_root(plans: dict[str, TablePlan]) -> str:
    return next((p.name for p in plans.values() if p.kind == "root"), "the root's")


def replication_blockers(problems: list[str], schema: str, adopted: list[str]) -> list[Blocker]:
    """``inspect.unmovable``'s findings about the adopted tables, each with its fix."""
    out = []
    for problem in problems:
        table = next(
            (
                t
                for t in sorted(adopted, key=len, reverse=True)
                if problem.startswith(f"{schema}.{t} ")
            ),
            None,
        )
        if table is None:
            continue
        if "unlogged" in problem:
            fix, how = [fixes.set_logged(table)], "make it logged"
        else:
            fix, how = (
                [fixes.replica_identity_full(table)],
                "add a primary key, or set REPLICA IDENTITY FULL",
            )
        out.append(
            Blocker(
                "replica-identity",
                table,
                f"{problem.removeprefix(schema + '.')}: logical replication could not copy its "
                f"updates and deletes; {how}",
                fix,
            )
        )
    return out


def server_blockers(facts: dict, hosts: int) -> list[Blocker]:
    """The source server's version and settings against what a logical copy to ``hosts`` hosts needs:
    a slot and a WAL sender per target host, and row filters (PostgreSQL 15)."""
    out = []
    num = facts["version_num"]
    if num < MIN_VERSION_NUM:
        out.append(
            Blocker(
                "server",
                None,
                f"PostgreSQL {num // 10000}.{num % 10000}: the copy needs 15 or later (publication "
                f"row filters); upgrade the old database first",
            )
        )
    if facts["wal_level"] != "logical":
        out.append(
            Blocker(
                "server",
                None,
                f"wal_level={facts['wal_level']}: the copy needs wal_level=logical (a restart)",
                [fixes.server_setting("wal_level", "logical")],
            )
        )
    for setting, used in (
        ("max_replication_slots", "slots_used"),
        ("max_wal_senders", "senders_used"),
    ):
        free = facts[setting] - facts[used]
        if free < hosts:
            out.append(
                Blocker(
                    "server",
                    None,
                    f"{setting}={facts[setting]} with {facts[used]} in use: the copy needs {hosts} "
                    f"free (one per host); raise it (a restart)",
                    [fixes.server_setting(setting, str(facts[used] + hosts + 2))],
                )
            )
    return out


def history_blockers(history: list[tuple]) -> list[Blocker]:
    return [
        Blocker(
            "history",
            table,
            f"{tool}'s {table} records a migration that did not finish (last: {last}): finish or "
            f"repair it with {tool} before the baseline records the history as applied",
        )
        for table, tool, _applied, last, dirty in history
        if dirty
    ]
