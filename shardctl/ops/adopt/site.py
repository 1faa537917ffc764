"""Where an adoption's cutover acts: the old database (the topology's ``adoption.source``), the fleet
hosts that receive its rows, the tables on each side and the names of the replication objects
(forward: ``shardctl_adopt_<host>_<tag>``, made by ``adopt copy``; back:
``shardctl_adopt_back_<host>_<tag>``, made by the cutover for ``--abort``; the id map's:
``shardctl_adopt_ids_<tag>``; the tag is the run's, see ``state.slot_name``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput
from ...model.adoption import Adoption
from ...model.topology import Host, Topology
from ...router.placement import GLOBAL
from ...sql.catalog import adopt_copy as copy_catalog
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import control, inspect
from ..move.run import Progress
from .state import run_tag, slot_name


@dataclass
class Site:
    """The topology's adoption, with what each step needs to reach and name."""

    topo: Topology
    adoption: Adoption
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    progress: Progress = field(default=lambda step, done, total, note: None)
    notes: list[str] = field(default_factory=list)
    routed_tables: list[str] = field(default_factory=list)  # see routed()
    tag: str = ""  # of the replication objects' names: the run's, read by run_state()

    @classmethod
    def of(
        cls, topo: Topology, connect_timeout: int, progress: Progress | None, need_source: bool
    ) -> Site:
        adoption = topo.adoption
        if adoption is None:
            raise BadInput(
                "the topology has no adoption section: run `shardctl adopt copy` first (it writes it)"
            )
        if need_source and adoption.source is None:
            raise BadInput(
                "adoption.source is gone from the topology (cleaned up): nothing to cut over or abort"
            )
        return cls(topo, adoption, connect_timeout, progress or (lambda s, d, t, n: None))

    # ---- hosts -------------------------------------------------------------------------------
    @property
    def source(self) -> Host:
        return self.adoption.source

    @property
    def schema(self) -> str:
        return self.adoption.schema

    @property
    def global_host(self) -> Host:
        return self.topo.host(self.topo.global_host or self.topo.hosts[0].name)

    def fleet_hosts(self) -> list[Host]:
        """Every fleet host that receives rows: those owning shards, and the global tables' host."""
        glob = self.global_host.name
        return [h for h in self.topo.hosts if h.shards or (h.name == glob and self.globals)]

    def subscriber_hosts(self) -> list[Host]:
        """The servers whose subscriptions the cutover's freeze waits for: the fleet hosts (the
        copy's) and the id map's (it may be none of them)."""
        hosts = self.fleet_hosts()
        place = self.topo.id_map_place()
        if place.host not in {h.name for h in hosts}:
            hosts.append(self.topo.host(place.host))
        return hosts

    def redirect_back(self, conn: psycopg.Connection, host: Host) -> None:
        """On ``host`` (``conn``), a redirect for each of its :meth:`redirected` shards back to the
        old database, in the app's schema there (an abort's; upserted)."""
        shards, source = self.redirected(host), self.source
        control.write_redirects(
            conn, shards, [self.schema] * len(shards), source.name, source.dsn, "adoption"
        )

    def connect(self, host: Host, autocommit: bool = True) -> psycopg.Connection:
        return db.connect(
            host,
            autocommit=autocommit,
            connect_timeout=self.connect_timeout,
            purpose="adopt cutover",
        )

    # ---- tables ------------------------------------------------------------------------------
    @property
    def tables(self) -> list[str]:
        return sorted(self.adoption.tables)

    @property
    def globals(self) -> list[str]:
        return list(self.adoption.globals)

    def source_tables(self) -> list[tuple[str, str]]:
        """Every adopted table on the old database: the sharded ones, then the global ones."""
        return [(self.schema, t) for t in self.tables + self.globals]

    def routed(self, detail: dict) -> list[str]:
        """The sharded tables ``adopt copy`` routes by trigger (no partitioned parent: their shard
        tables' types differ), as its run recorded them."""
        return [t for t in detail.get("routed") or [] if t in self.adoption.tables]

    def parents(self, host: Host, moved: bool = False) -> list[tuple[str, str]]:
        """What ``host`` holds under the old database's names: a partitioned parent per sharded table
        (for a table ``adopt copy`` routes by trigger, its routed table; when the host owns shards;
        in :data:`MOVED_SCHEMA` from the cutover, ``moved``), and on the global host each global
        table's mirror (``cutover.mirror_globals``), always in :data:`MOVED_SCHEMA`: the old
        database's global tables move there at the cutover too."""
        where = catalog.MOVED_SCHEMA if moved else self.schema
        out = [(where, t) for t in self.tables] if host.shards else []
        if host.name == self.global_host.name:
            out += [(catalog.MOVED_SCHEMA, t) for t in self.globals]
        return out

    def routed_shard_tables(self, host: Host) -> list[tuple[str, str]]:
        """``host``'s shard tables of the tables routed by trigger (not partitions of a parent)."""
        return [(self.topo.schema_name(n), t) for n in host.shards for t in self.routed_tables]

    def routed_partitions(self, host: Host) -> list[tuple[str, str]]:
        """The partitions (one per shard of ``host``) of its tables routed by trigger."""
        return [
            copy_catalog.routed_partition(t, n) for n in host.shards for t in self.routed_tables
        ]

    def located(self, conn: psycopg.Connection, host: Host | None = None) -> list[tuple[str, str]]:
        """Where the adopted tables are now on ``conn``'s database (the old database, or fleet host
        ``host``'s parents): in the app's schema before the cutover, in :data:`MOVED_SCHEMA` after
        it; then the global tables (on the old database, there too; on the global host, the tables
        the app uses, in its schema: their mirrors are not listed)."""
        sharded = [] if host is not None and not host.shards else self.tables
        names = sharded + (self.globals if host is None else [])
        where = catalog.table_schemas(conn, names, [catalog.MOVED_SCHEMA, self.schema])
        out = [(where[t], t) for t in names if t in where]
        if host is not None and host.name == self.global_host.name:
            out += [(self.schema, t) for t in self.globals]
        return out

    def redirected(self, host: Host) -> list[int]:
        """The shards whose redirects name ``host`` (or are recorded on it): its own, and the Routers'
        number for the global tables (:data:`GLOBAL`) on the global host."""
        glob = [GLOBAL] if self.globals and host.name == self.global_host.name else []
        return list(host.shards) + glob

    def shard_tables(self, host: Host) -> list[tuple[str, str]]:
        """The shard tables of ``host`` that are partitions of the parents, and its global tables."""
        out = [(self.topo.schema_name(n), t) for n in host.shards for t in self.tables]
        if host.name == self.global_host.name:
            out += [(self.schema, t) for t in self.globals]
        return out

    def shard_table_names(self, conn: psycopg.Connection, host: Host) -> dict[tuple[str, str], str]:
        """Each of ``host``'s :meth:`shard_tables` (on ``conn``) → the name it has there now: its
        own, or the one an abort gave it (``catalog.aborted_name``); absent ones are left out."""
        items = self.shard_tables(host)
        hidden = {(s, t): catalog.aborted_name(t) for s, t in items}
        present = set(inspect.tables(conn, sorted({s for s, _ in items}), "rp"))
        out = {}
        for s, t in items:
            if (s, t) in present:
                out[s, t] = t
            elif (s, hidden[s, t]) in present:
                out[s, t] = hidden[s, t]
        return out

    # ---- names (the run's tag: call run_state() first) ---------------------------------------
    def forward(self, host: Host) -> str:
        """``adopt copy``'s publication, slot and subscription for ``host``."""
        return slot_name(host.name, self.tag)

    def back(self, host: Host) -> str:
        """The way back's publication, slot and subscription for ``host``."""
        return slot_name(f"back_{host.name}", self.tag)

    def id_map(self) -> str:
        """The id map's publication and slot (old database) and subscription (id map database)."""
        return slot_name("ids", self.tag)

    def forward_names(self) -> list[str]:
        return [self.forward(h) for h in self.fleet_hosts()]

    def back_names(self) -> list[str]:
        return [self.back(h) for h in self.fleet_hosts()]

    # ---- the run's record --------------------------------------------------------------------
    def run_state(self, src: psycopg.Connection) -> tuple[str, dict]:
        state = catalog.read_run(src)
        if state is None:
            raise BadInput(
                f"no adoption run is recorded on the old database ({self.source.name}): run "
                f"`shardctl adopt copy` first"
            )
        self.routed_tables = self.routed(state[1])
        self.tag = run_tag(state[1])
        return state

    def note(self, message: str) -> None:
        self.notes.append(message)
