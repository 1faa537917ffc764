"""The topology's ``adoption:`` section: an existing database being adopted into the fleet.

While ``authoritative: source`` every shard lives on the old database (``source``) in the app's
schema, and the Router, the ORMs, ``decode-id`` and ``locate`` go there; the fleet's own commands
(``init``, ``migrate``, ``verify``, ``status``) ignore it. After the cutover (``authoritative:
fleet``) the old IDs below ``id_floor`` keep working: a root table's old ID is its key, any other
table's old ID is looked up in the id map database (``id_map``) for its key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .identifiers import MAX_IDENTIFIER_BYTES
from .numbers import echo

ADOPTION_KEYS = {"source", "schema", "authoritative", "id_floor", "tables", "globals", "id_map"}
SOURCE_KEYS = {"dsn", "admin_dsn", "password_env", "pooler"}
TABLE_KEYS = {"id", "key"}
ID_MAP_KEYS = {"host", "dbname"}
AUTHORITIES = ("source", "fleet")
SOURCE_HOST = "source"  # the name the old database goes by where a host name is shown
DEFAULT_ID_MAP_DB = "shardctl_adopt_ids"  # the id map database, unless the section names one


def default_id_map(global_host: str | None, first_host: str) -> IdMap:
    """Where the id map goes when the section names no ``id_map``: the global host (else the first
    host), database ``shardctl_adopt_ids``."""
    return IdMap(global_host or first_host, DEFAULT_ID_MAP_DB)


@dataclass(frozen=True)
class AdoptedTable:
    """One sharded table of the adopted database: its ID column (None: no single-column ID) and key."""

    name: str
    id: str | None
    key: str

    @property
    def root(self) -> bool:
        """The root table (``users``): its ID is its key, so an old ID names its shard directly."""
        return self.id is not None and self.id == self.key


@dataclass(frozen=True)
class IdMap:
    """Where old IDs are looked up for their key: database ``dbname`` on fleet host ``host``."""

    host: str
    dbname: str


@dataclass(frozen=True)
class Adoption:
    """A validated ``adoption:`` section (``Topology.adoption``; None when the file has none).

    ``source`` is the old database as a host (named ``source``, owning no shard of the fleet);
    None once ``adopt cutover --cleanup`` dropped it. ``tables`` maps each sharded table's name to
    its :class:`AdoptedTable`; ``globals`` are the unsharded tables (on ``placement.global_host``
    after the cutover)."""

    source: Any = field(hash=False)  # model.topology.Host | None (imported lazily: no cycle)
    schema: str = "public"
    authoritative: str = "source"
    id_floor: int = 0
    tables: dict[str, AdoptedTable] = field(default_factory=dict, hash=False)
    globals: tuple[str, ...] = ()
    id_map: IdMap | None = None

    @property
    def on_source(self) -> bool:
        """True while the old database is authoritative: every shard is read and written there."""
        return self.authoritative == "source"

    def is_old_id(self, value: int) -> bool:
        """Whether ``value`` is a pre-adoption ID (below ``id_floor``; new IDs are never below it)."""
        return 0 <= value < self.id_floor

    def table(self, name: str) -> AdoptedTable | None:
        return self.tables.get(name)

    def document(self) -> dict[str, Any]:
        """The section as the topology file writes it (``topology_file.write_adoption``)."""
        doc: dict[str, Any] = {}
        if self.source is not None:
            src: dict[str, Any] = {"dsn": self.source.dsn}
            if self.source.admin_dsn:
                src["admin_dsn"] = self.source.admin_dsn
            if self.source.password_env:
                src["password_env"] = self.source.password_env
            if self.source.pooler != "transaction":
                src["pooler"] = self.source.pooler
            doc["source"] = src
        doc["schema"] = self.schema
        doc["authoritative"] = self.authoritative
        doc["id_floor"] = self.id_floor
        doc["tables"] = {
            t.name: ({"id": t.id, "key": t.key} if t.id else {"key": t.key})
            for t in self.tables.values()
        }
        doc["globals"] = list(self.globals)
        if self.id_map is not None:
            doc["id_map"] = {"host": self.id_map.host, "dbname": self.id_map.dbname}
        return doc


def tables_from_plan(plan: dict[str, Any]) -> tuple[dict[str, AdoptedTable], tuple[str, ...]]:
    """The sharded tables and the global tables of an ``adopt plan`` document (``read_plan``)."""
    tables: dict[str, AdoptedTable] = {}
    globals_: list[str] = []
    for t in plan.get("tables") or []:
        if t.get("kind") == "global":
            globals_.append(t["name"])
        elif t.get("kind") in ("root", "column", "fk-path") and t.get("key"):
            tables[t["name"]] = AdoptedTable(t["name"], t.get("id_column"), t["key"])
    return tables, tuple(globals_)


def adoption_section(
    p: Any, doc: Any, hosts_validator: Any, host_names: list[str], host_type: type
) -> Adoption | None:
    """``adoption:`` validated into an :class:`Adoption` (None when absent or after a problem).

    ``p`` is the topology's ``Problems``; ``hosts_validator`` checks the source's DSNs and settings
    as it checks a host's; ``host_names`` are the fleet's hosts (``id_map.host`` names one);
    ``host_type`` is ``topology.Host`` (given, as this module is imported by ``topology``)."""
    section = p.mapping(doc, "adoption", ADOPTION_KEYS, required=False)
    if section is None:
        return None
    before = len(p.errors)
    if SOURCE_HOST in host_names:
        p.error(
            f"a host is named {SOURCE_HOST}, the name the adopted old database goes by: rename it",
            p.line_of(doc, "hosts"),
        )
    source = _source(p, section, hosts_validator, host_type)
    schema = section.get("schema", "public")
    if _name_problem(schema):
        p.error(
            f"adoption.schema must be a schema name, got {echo(schema)}",
            p.line_of(section, "schema"),
        )
    authoritative = section.get("authoritative", "source")
    if authoritative not in AUTHORITIES:
        p.error(
            f"adoption.authoritative must be source or fleet, got {echo(authoritative)}",
            p.line_of(section, "authoritative"),
        )
    elif authoritative == "source" and source is None and "source" not in section:
        p.error(
            "adoption.authoritative is source but adoption names no source (dsn of the old database)",
            p.line_of(section, "authoritative") or p.line_of(doc, "adoption"),
        )
    id_floor = section.get("id_floor")
    if isinstance(id_floor, bool) or not isinstance(id_floor, int) or not 0 < id_floor < 1 << 63:
        p.error(
            f"adoption.id_floor must be a positive integer below 2**63 (every ID below it is a "
            f"pre-adoption ID), got {echo(id_floor)}",
            p.line_of(section, "id_floor") or p.line_of(doc, "adoption"),
        )
    tables = _tables(p, section)
    globals_ = _globals(p, section, tables)
    id_map = _id_map(p, section, host_names)
    if len(p.errors) > before:
        return None
    return Adoption(
        source=source,
        schema=schema,
        authoritative=authoritative,
        id_floor=id_floor,
        tables=tables,
        globals=globals_,
        id_map=id_map,
    )


def _source(p: Any, section: Any, hosts_validator: Any, host_type: type) -> Any:
    """``adoption.source`` as a Host named ``source`` (no fleet shards), or None."""
    if "source" not in section:
        return None
    node = p.mapping(section, "source", SOURCE_KEYS)
    if node is None:
        return None
    dsn = node.get("dsn")
    if not isinstance(dsn, str) or not dsn.strip():
        p.error(
            "adoption.source needs a dsn (a libpq connection string to the old database)",
            p.line_of(section, "source"),
        )
        return None
    hosts_validator.check_dsn("adoption.source", "dsn", dsn, p.line_of(node, "dsn"))
    settings = hosts_validator.settings("adoption.source", node)
    settings.pop("max_jobs", None)
    dsns = hosts_validator.purpose_dsns("adoption.source", node)
    return host_type(
        name=SOURCE_HOST, dsn=dsn, shards=[], admin_dsn=dsns.get("admin_dsn"), **settings
    )


def _name_problem(value: Any) -> str | None:
    """Why ``value`` is not a table, column or database name (any a quoted identifier can be)."""
    if not isinstance(value, str) or not value:
        return f"must be a name, got {echo(value)}"
    if len(value.encode()) > MAX_IDENTIFIER_BYTES or "\x00" in value:
        return f"is not a PostgreSQL name: {echo(value)}"
    return None


def _tables(p: Any, section: Any) -> dict[str, AdoptedTable]:
    """``adoption.tables``: {table: {id: column, key: column}}, every name a safe identifier."""
    node = section.get("tables")
    if not isinstance(node, dict) or not node:
        p.error(
            "adoption.tables must map each sharded table to its columns, e.g. "
            "{users: {id: id, key: id}, posts: {id: id, key: user_id}}",
            p.line_of(section, "tables") or p.line_of(section),
        )
        return {}
    out: dict[str, AdoptedTable] = {}
    for name, cols in node.items():
        line = p.line_of(node, name)
        why = _name_problem(name)
        if why:
            p.error(f"adoption.tables: table {echo(name)} {why}", line)
            continue
        if not isinstance(cols, dict):
            p.error(f"adoption.tables.{name} must be a mapping like {{id: id, key: user_id}}", line)
            continue
        p.unknown_keys(cols, TABLE_KEYS, f"adoption.tables.{name}")
        key, id_col = cols.get("key"), cols.get("id")
        bad = [
            (k, v, _name_problem(v))
            for k, v in (("key", key), ("id", id_col))
            if v is not None or k == "key"
        ]
        bad = [(k, v, why) for k, v, why in bad if why]
        for k, v, why in bad:
            p.error(
                f"adoption.tables.{name}.{k}: column {echo(v)} {why}", p.line_of(cols, k) or line
            )
        if not bad:
            out[name] = AdoptedTable(name, id_col, key)
    return out


def _globals(p: Any, section: Any, tables: dict[str, AdoptedTable]) -> tuple[str, ...]:
    node = section.get("globals", [])
    if node is None:
        return ()
    if not isinstance(node, list) or any(_name_problem(n) for n in node):
        p.error(
            "adoption.globals must be a list of table names (the unsharded tables)",
            p.line_of(section, "globals"),
        )
        return ()
    both = [n for n in node if n in tables]
    if both:
        p.error(
            f"adoption.globals: {', '.join(both)} is also in adoption.tables (a table is sharded or "
            f"global, not both)",
            p.line_of(section, "globals"),
        )
    return tuple(node)


def _id_map(p: Any, section: Any, host_names: list[str]) -> IdMap | None:
    """``adoption.id_map``: a fleet host and a database name, or None when absent."""
    if "id_map" not in section:
        return None
    node = p.mapping(section, "id_map", ID_MAP_KEYS)
    if node is None:
        return None
    host, dbname = node.get("host"), node.get("dbname")
    ok = True
    if not isinstance(host, str) or (host_names and host not in host_names):
        p.error(
            f"adoption.id_map.host must name a host ({', '.join(host_names)}), got {echo(host)}",
            p.line_of(node, "host") or p.line_of(section, "id_map"),
        )
        ok = False
    why = _name_problem(dbname)
    if why:
        p.error(
            f"adoption.id_map.dbname: database {echo(dbname)} {why}",
            p.line_of(node, "dbname") or p.line_of(section, "id_map"),
        )
        ok = False
    return IdMap(host, dbname) if ok else None
