"""The shard key of every table of the database being adopted.

One root table holds the key (``users.id``); every other table is:

* ``column``: it has the key as a column, named as the topology's ``routing.key`` or a column whose
  foreign key references the root's key (``blog_post.author_id -> auth_user.id``);
* ``fk-path``: no key column, but a chain of foreign keys leads to a table that has one
  (``comments.post_id -> posts.id``): sharded with its parent, once the key column is added;
* ``global``: no path to the key (settings, plans, countries): stays unsharded, on one host;
* ``history``: the app's migration tool's own table (``django_migrations``…): read for the baseline,
  not adopted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import BadInput
from ...sql.catalog.adopt import Constraint, Table

SHARDED = ("root", "column", "fk-path")
# Tables of migration tools: Rails' ``ar_internal_metadata`` beside its schema_migrations.
HISTORY_NAMES = frozenset(
    {
        "django_migrations",
        "alembic_version",
        "schema_migrations",
        "_prisma_migrations",
        "flyway_schema_history",
        "ar_internal_metadata",
        "goose_db_version",
    }
)


@dataclass
class TablePlan:
    """Where one table goes: its kind (above), its key column, the foreign-key path to the key (for
    ``fk-path``, and for ``column`` when the key column references the root), and the ID column
    whose default becomes ``next_id()``."""

    name: str
    kind: str
    key: str | None = None
    path: list[str] = field(default_factory=list)
    id_column: str | None = None
    rows: int = 0
    bytes: int = 0
    toast_bytes: int = 0

    @property
    def sharded(self) -> bool:
        return self.kind in SHARDED


def fk_constraints(table: Table) -> list[Constraint]:
    return [k for k in table.constraints if k.kind == "f"]


def primary_key(table: Table) -> list[str]:
    return next((k.columns for k in table.constraints if k.kind == "p"), [])


def id_column(table: Table) -> str | None:
    """The single-column primary key fed by a sequence (serial, bigserial or identity), if any."""
    pk = primary_key(table)
    if len(pk) != 1:
        return None
    column = next(c for c in table.columns if c.name == pk[0])
    return column.name if column.sequence else None


def find_root(tables: dict[str, Table], schema: str, key: str, root: str | None) -> tuple[str, str]:
    """The root table and its key column: ``root`` when given, else the one table that the columns
    named ``key`` reference. BadInput when there is none or several."""
    if root is None:
        referenced = {
            k.ref_table
            for t in tables.values()
            for k in fk_constraints(t)
            if k.columns == [key] and k.ref_schema == schema and len(k.ref_columns) == 1
        }
        if len(referenced) != 1:
            found = ", ".join(sorted(referenced)) or "none"
            raise BadInput(
                f"cannot tell the root table: the columns named {key} reference {found}; "
                f"give --root TABLE (the table whose primary key is the shard key)"
            )
        root = referenced.pop()
    if root not in tables:
        raise BadInput(f"--root {root}: no such table in schema {schema}")
    pk = primary_key(tables[root])
    if len(pk) != 1:
        raise BadInput(
            f"root table {root} has no single-column primary key to shard by (it has {pk or 'none'})"
        )
    return root, pk[0]


def _references_root(k: Constraint, schema: str, root: str, root_key: str) -> bool:
    return (
        k.ref_schema == schema
        and k.ref_table == root
        and len(k.columns) == 1
        and k.ref_columns == [root_key]
    )


def classify(
    tables: dict[str, Table], schema: str, key: str, root: str, root_key: str
) -> dict[str, TablePlan]:
    """Every table's :class:`TablePlan`: the root, then key columns, then foreign-key paths found
    breadth first (the shortest path wins), the rest global."""
    plans: dict[str, TablePlan] = {}
    for t in tables.values():
        plan = TablePlan(t.name, "global", rows=t.rows, bytes=t.bytes, toast_bytes=t.toast_bytes)
        plans[t.name] = plan
        if t.name in HISTORY_NAMES:
            plan.kind = "history"
            continue
        plan.id_column = id_column(t)
        if t.name == root:
            plan.kind, plan.key = "root", root_key
        elif any(c.name == key for c in t.columns):
            plan.kind, plan.key = "column", key
            via = [
                k
                for k in fk_constraints(t)
                if k.columns == [key] and _references_root(k, schema, root, root_key)
            ]
            plan.path = [f"{t.name}.{key} -> {root}.{root_key}"] if via else []
        else:
            via = [k for k in fk_constraints(t) if _references_root(k, schema, root, root_key)]
            if via:
                column = via[0].columns[0]
                plan.kind, plan.key = "column", column
                plan.path = [f"{t.name}.{column} -> {root}.{root_key}"]
    _paths(tables, plans, schema)
    return plans


def _paths(tables: dict[str, Table], plans: dict[str, TablePlan], schema: str) -> None:
    """Give each table still global the shortest foreign-key path to a sharded table, round by round."""
    while True:
        found = {}
        for name, plan in plans.items():
            if plan.kind != "global":
                continue
            for k in fk_constraints(tables[name]):
                parent = plans.get(k.ref_table) if k.ref_schema == schema else None
                if parent is not None and parent.sharded:
                    hop = f"{name}.{','.join(k.columns)} -> {parent.name}.{','.join(k.ref_columns)}"
                    found[name] = [hop, *parent.path]
                    break
        if not found:
            return
        for name, path in found.items():
            plans[name].kind, plans[name].path = "fk-path", path


def path_constraint(table: Table, plan: TablePlan) -> Constraint | None:
    """The foreign key of the first hop of ``plan``'s path (it ties the row to its parent's shard)."""
    if not plan.path:
        return None
    hop = plan.path[0]
    columns, parent = hop.split(" -> ")[0].split(".", 1)[1], hop.split(" -> ")[1].split(".", 1)[0]
    return next(
        (
            k
            for k in fk_constraints(table)
            if ",".join(k.columns) == columns and k.ref_table == parent
        ),
        None,
    )


def groups(tables: dict[str, Table], plans: dict[str, TablePlan], schema: str) -> list[list[str]]:
    """Sharded tables tied together by foreign keys that hold inside a shard (those that include the
    key, and each table's path), as connected groups: the rows a join of them needs are on one shard."""
    parent: dict[str, str] = {n: n for n, p in plans.items() if p.sharded}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for name in parent:
        for k in fk_constraints(tables[name]):
            if (
                k.ref_schema == schema
                and k.ref_table in parent
                and fk_holds(tables[name], plans, k)
            ):
                parent[find(name)] = find(k.ref_table)
    out: dict[str, list[str]] = {}
    for name in sorted(parent):
        out.setdefault(find(name), []).append(name)
    return sorted(out.values(), key=lambda g: (-len(g), g))


def fk_holds(table: Table, plans: dict[str, TablePlan], k: Constraint) -> bool:
    """Whether the foreign key ``k`` of a sharded table always finds its parent row on the same shard:
    it is the table's path to the key, or it pairs the table's key column with the parent's."""
    plan, ref = plans[table.name], plans.get(k.ref_table)
    if ref is None or not ref.sharded:
        return False
    if path_constraint(table, plan) is k:
        return True
    key = plan.key if plan.kind != "fk-path" else None
    return any(c == key and r == ref.key for c, r in zip(k.columns, k.ref_columns))


def shard_columns(tables: dict[str, Table], plans: dict[str, TablePlan], table: Table) -> set[str]:
    """The columns whose value alone places a row on one shard: the key, the ID column, and the
    foreign key of the table's path when it references its parent's key or ID (all the rows that
    share it live with that parent)."""
    plan = plans[table.name]
    out = {c for c in (plan.key, plan.id_column) if c}
    k = path_constraint(table, plan)
    parent = plans.get(k.ref_table) if k else None
    if k and parent and len(k.columns) == 1 and k.ref_columns[0] in (parent.key, parent.id_column):
        out.add(k.columns[0])
    for k in fk_constraints(table):  # (key, parent_id) -> parent(key, id): parent_id places the row
        ref = plans.get(k.ref_table)
        if ref is not None and ref.sharded and plan.key and fk_holds(table, plans, k):
            out.update(c for c, r in zip(k.columns, k.ref_columns) if r == ref.id_column)
    return out
