"""The id map of an adoption: where a pre-adoption ID of a non-root table finds its key.

Old rows keep their IDs, which name no shard. The root table's old ID is its key (``id % N``); any
other table's key is looked up in the id map database (``adoption.id_map``: ``dbname`` on a fleet
host), which holds ``public.<table>(<id> PRIMARY KEY, <key>)`` per sharded table with an ID column,
filled by PostgreSQL's logical replication from the old database: publication
``shardctl_adopt_ids_<tag>`` (:func:`id_map_name`) with column lists ``(<id>, <key>)`` there,
subscription of the same name here (its initial copy is narrow: two columns). Inserts, deletes
and key changes replicate by themselves.

A column list must cover the table's replica identity, or the app's UPDATEs on the old database
fail ("column list ... does not cover the replica identity"). The copy gives tables whose identity
lacks their key ``REPLICA IDENTITY FULL``; for those, :func:`ensure_id_map` builds a unique index on
(id, key) concurrently and makes it the replica identity instead (it holds the key, as the copy's
row filters need; both columns are NOT NULL once the plan's blockers are fixed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, OperationFailed
from ...model.adoption import AdoptedTable, IdMap, tables_from_plan
from ...model.topology import Host, Topology
from ...sql import databases
from ...sql.catalog import adopt_cutover as cut_catalog
from ...sql.catalog import adopt_ids as catalog
from ...sql.catalog import replication
from ..move.run import peer_conninfo
from .state import load_run, run_tag, slot_name


def id_map_name(src: psycopg.Connection) -> str:
    """The id map's publication and slot on the old database ``src``, and its subscription in the
    id map database: named with the tag of the run recorded there (``state.slot_name``)."""
    return slot_name("ids", run_tag(load_run(src)))


@dataclass
class IdMapResult:
    """What :func:`ensure_id_map` set up: the id map's place, its tables, and what to know."""

    id_map: IdMap
    tables: list[str] = field(default_factory=list)
    identity_indexes: list[str] = field(default_factory=list)  # replica identities made here
    notes: list[str] = field(default_factory=list)


def mapped_tables(tables: dict[str, AdoptedTable]) -> list[AdoptedTable]:
    """The tables whose old IDs need the id map: every sharded table with an ID column but the root."""
    return [t for t in tables.values() if t.id is not None and not t.root]


def _plan_tables(topo: Topology, plan: Any) -> tuple[dict[str, AdoptedTable], str]:
    """(tables, schema) from the plan (a plan document or an AdoptPlan), else the topology's."""
    if plan is not None:
        doc = plan if isinstance(plan, dict) else plan.document()
        return tables_from_plan(doc)[0], doc.get("schema", "public")
    if topo.adoption is None:
        raise BadInput("ensure_id_map needs the plan or a topology with an adoption section")
    return dict(topo.adoption.tables), topo.adoption.schema


def ensure_id_map(
    topology: Topology,
    source: Host,
    plan: Any = None,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> IdMapResult:
    """Set up the id map (idempotent: a re-run after a kill finishes the job): the database and its
    tables on the id map host, the publication with column lists and its slot on ``source``, the
    subscription (with its initial copy). ``plan``: the adopt plan (document or result), else the
    topology's adoption section. Returns the :class:`IdMapResult`; the rows arrive asynchronously
    (:func:`wait_id_map` waits for them)."""
    tables, schema = _plan_tables(topology, plan)
    place = topology.id_map_place()
    host = topology.host(place.host)
    result = IdMapResult(place, tables=[t.name for t in mapped_tables(tables)])
    if not result.tables:
        result.notes.append("no table needs the id map (only the root table has old IDs)")
        return result
    src = db.connect(source, autocommit=True, connect_timeout=connect_timeout, purpose="adopt ids")
    try:
        name = id_map_name(src)
        types = _source_side(src, name, schema, mapped_tables(tables), result)
        with db.connect(host, autocommit=True, connect_timeout=connect_timeout) as admin:
            databases.ensure_database(admin, place.dbname)
        ids = db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, database=place.dbname
        )
        try:
            for t in mapped_tables(tables):
                catalog.create_id_table(
                    ids, schema, t.name, t.id, types[t.name][0], t.key, types[t.name][1]
                )
            if not replication.slot_exists(src, name):
                replication.create_slot(src, name)
            if not replication.subscriptions(ids, [name]):
                replication.create_subscription(ids, name, peer_conninfo(source))
            else:
                replication.start_subscription(ids, name)
        finally:
            ids.close()
    except psycopg.Error as exc:
        raise OperationFailed(f"adopt: setting up the id map: {db.first_line(exc)}") from None
    finally:
        src.close()
    return result


def _source_side(
    src: psycopg.Connection,
    name: str,
    schema: str,
    tables: list[AdoptedTable],
    result: IdMapResult,
) -> dict[str, tuple[str, str]]:
    """On the old database: replica identities the column lists cover, and the publication. Returns
    each table's (id type, key type)."""
    types: dict[str, tuple[str, str]] = {}
    entries: list[tuple[str, str, str]] = []
    for t in tables:
        cols = catalog.columns(src, schema, t.name)
        if t.id not in cols or t.key not in cols:
            raise BadInput(f"adopt: table {schema}.{t.name} has no column {t.id} or {t.key}")
        types[t.name] = (cols[t.id][0], cols[t.key][0])
        _cover_identity(src, schema, t, cols, result)
        entries.append((t.name, t.id, t.key))
    exists = replication.publication_exists(src, name)
    catalog.ids_publication(src, name, schema, entries, exists=exists)
    return types


def identity_index_name(table: str) -> str:
    return f"shardctl_ids_{table}"[:63]


def _cover_identity(
    src: psycopg.Connection,
    schema: str,
    t: AdoptedTable,
    cols: dict[str, tuple[str, bool]],
    result: IdMapResult,
) -> None:
    """Make the column list (id, key) cover the table's replica identity: a unique index on them
    becomes it, unless the identity is already within them (BadInput for a nullable column, which
    the plan names as a blocker)."""
    ident = catalog.identity(src, schema, t.name)
    if ident.kind in ("d", "i") and ident.columns and set(ident.columns) <= {t.id, t.key}:
        return
    if not (cols[t.id][1] and cols[t.key][1]):
        raise BadInput(
            f"adopt: {schema}.{t.name}: {t.id} and {t.key} must be NOT NULL for the id map "
            f"(adopt plan names the fix)"
        )
    index = identity_index_name(t.name)
    if catalog.index_valid(src, schema, index) is False:  # a killed concurrent build left it
        catalog.drop_index(src, schema, index)
    catalog.create_identity_index(src, schema, t.name, index, [t.id, t.key])
    catalog.set_identity(src, schema, t.name, index)
    result.identity_indexes.append(index)


def wait_id_map(
    topology: Topology,
    source: Host,
    *,
    timeout: float = 60.0,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Wait until the id map's subscription has copied its tables and replayed what the old database
    had written when the wait began (OperationFailed after ``timeout`` seconds)."""
    place = topology.id_map_place()
    host = topology.host(place.host)
    deadline = time.monotonic() + timeout
    with db.connect(source, autocommit=True, connect_timeout=connect_timeout) as src:
        name = id_map_name(src)
        lsn = replication.wal_insert_lsn(src)
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, database=place.dbname
        ) as ids:
            while True:
                state = replication.sync_state(ids, [name])
                ready = state["tables"] and state["ready"] == state["tables"]
                if ready and replication.replayed(src, [name], lsn):
                    return
                if time.monotonic() > deadline:
                    raise OperationFailed(
                        f"adopt: the id map did not catch up in {timeout:g}s ({state['states']})"
                    )
                time.sleep(0.05)


def move_id_map(
    topology: Topology, moved: str, *, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
) -> list[str]:
    """At the cutover, the id map's tables follow the old database's (they move to schema ``moved``):
    its subscription applies by the published name, which is the moved one for every change made
    after the old database's freeze (the fleet's writes coming back). A view under each old name
    keeps the readers' query. Idempotent; nothing without an id map database. Returns the moved."""
    place = topology.id_map_place()
    host = topology.host(place.host)
    schema = topology.adoption.schema
    with db.connect(host, autocommit=True, connect_timeout=connect_timeout) as admin:
        if not databases.database_exists(admin, place.dbname):
            return []
    names = [t.name for t in mapped_tables(topology.adoption.tables)]
    with db.connect(
        host, autocommit=True, connect_timeout=connect_timeout, database=place.dbname
    ) as ids:
        where = cut_catalog.table_schemas(ids, names, [schema, moved])
        todo = [t for t in names if where.get(t) == schema]
        if todo:
            with ids.transaction():
                cut_catalog.ensure_schema(ids, moved)
                ids.execute(cut_catalog.set_schema_sql([(schema, t) for t in todo], moved))
                for t in todo:
                    ids.execute(cut_catalog.view_over_sql(schema, t, moved))
    return todo


def drop_id_map(
    topology: Topology,
    source: Host | None,
    *,
    keep_data: bool = False,
    schema: str | None = None,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Undo :func:`ensure_id_map`: the subscription, the publication(s), the slot and the replica
    identity indexes made for it on the old database; with ``keep_data`` (``--cleanup``: old IDs live
    forever) the id map database and its rows stay, else (``--abort``) the database goes too.
    ``source`` None: the old database is gone; only the id map's side is undone (every id map
    subscription in its database: the run's tag is recorded on the old database). ``schema``:
    where the adopted tables are on the old database (default: the adoption's schema)."""
    place = topology.id_map_place()
    host = topology.host(place.host)
    name = None
    if source is not None:
        with db.connect(source, autocommit=True, connect_timeout=connect_timeout) as src:
            name = id_map_name(src)
    with db.connect(host, autocommit=True, connect_timeout=connect_timeout) as admin:
        exists = databases.database_exists(admin, place.dbname)
    if exists:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, database=place.dbname
        ) as ids:
            # "detached" when the old database cannot be reached: its slot is dropped below, or
            # went with it
            for sub in [name] if name else catalog.subscriptions_from(ids, slot_name("ids")):
                replication.drop_subscription(ids, sub)
    if source is not None and name is not None:
        _drop_source_side(topology, source, name, connect_timeout, schema)
    if exists and not keep_data:
        with db.connect(host, autocommit=True, connect_timeout=connect_timeout) as admin:
            databases.drop_database(admin, place.dbname)


def _drop_source_side(
    topology: Topology, source: Host, name: str, connect_timeout: int, schema: str | None = None
) -> None:
    schema = schema or (topology.adoption.schema if topology.adoption else "public")
    tables = mapped_tables(topology.adoption.tables) if topology.adoption else []
    with db.connect(source, autocommit=True, connect_timeout=connect_timeout) as src:
        replication.drop_publications(src, [name])
        if replication.slot_exists(src, name):
            replication.end_slot_holder(src, name)
            replication.drop_slot(src, name)
        for t in tables:
            index = identity_index_name(t.name)
            ident = catalog.identity(src, schema, t.name)
            if ident.index is not None and ident.index.split(".")[-1] == index:
                catalog.set_identity(src, schema, t.name, None)
            catalog.drop_index(src, schema, index)


def lookup_key(
    topology: Topology,
    table: AdoptedTable,
    value: int,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
) -> Any:
    """The key of pre-adoption ID ``value`` of ``table`` (None: no such row), read where the Router
    reads it (``placement.lookup_host``): on the old database while it is authoritative, else in the
    id map; in the id map too when the old database's tables have gone (``lookup_fallback``)."""
    from ...router.placement import id_map_host, lookup_fallback, lookup_host
    from ...sql.catalog import router as queries

    query = queries.id_map_key_query(topology.adoption.schema, table.name, table.id, table.key)

    def read(host: Host) -> Any:
        with db.connect(host, connect_timeout=connect_timeout, purpose="decode-id") as conn:
            return queries.id_map_key(conn.execute(query, (value,)).fetchall())

    host = lookup_host(topology)
    try:
        return read(host)
    except psycopg.Error as exc:
        if lookup_fallback(topology, host, exc) is None:
            raise
    return read(id_map_host(topology))
