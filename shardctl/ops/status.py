"""``status``: one table for the fleet, a few cheap queries per host."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import HostResult, fan_out, raise_unreachable, select_hosts
from ..model.documents import Result, result_doc
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql import fingerprint
from ..sql.catalog.control import (
    applied_versions,
    last_event,
    move_records,
)
from ..sql.catalog.inspect import schema_names
from ..sql.migrations import for_topology
from ..sql.session import SERVER_VERSION
from .health import FleetHealth, HostHealth, assess, failed_lines, from_results, read_host
from .move.api import next_step
from .move.run import Move, merge_records
from .verify import per_shard_functions


@dataclass
class HostStatus:
    """What status found on one host (the ``value`` of its HostResult)."""

    dsn: str
    expected: int = 0
    server_version: str | None = None
    present: int = 0
    missing: str = ""
    unexpected: str = ""
    min_version: int | None = None
    max_version: int | None = None
    moving: str = ""
    # "shards 5,7 at V0003__x.sql": their last migrate failed
    failed: list[str] = field(default_factory=list)
    # "V0004__x.sql pending on shards 4-7": behind the version other shards of the fleet are at
    lagging: str = ""
    orphan_versions: list[int] = field(default_factory=list)
    last_event: str | None = None
    health: HostHealth | None = field(default=None, repr=False)

    @property
    def drift(self) -> bool:
        return bool(self.missing or self.unexpected or self.lagging)

    def to_dict(self) -> dict:
        return result_doc(self, omit=("health",), drift=self.drift)


@dataclass
class StatusReport(Result):
    """The result of :func:`status`: each host's shards, versions and moves, the fleet's latest
    migration version, the moves that need a command, and how many catalogs the shards have."""

    command = "status"

    hosts: list[HostResult[HostStatus]]
    seconds: float
    latest_version: int
    pending_moves: list[str] = field(default_factory=list)  # one line per move that needs a command
    # catalog fingerprints among the present shards (1: every shard alike)
    distinct_schemas: int = 0
    health: FleetHealth | None = None  # what status, plan, verify and migrate --check all report

    @property
    def ok(self) -> bool:
        healthy = self.health is None or self.health.ok
        return healthy and all(h.ok and not h.value.drift for h in self.hosts)

    def raise_for_status(self) -> StatusReport:
        """The fleet's health (``ops.health``): exit 3 when a host could not be reached or cannot
        authenticate; 4 (FleetIncomplete) when shards are missing (never created, or their schema is
        gone), failed their last migration, or lag behind the others; else 0. Shards present on the
        wrong host and moves in flight are shown, not errors."""
        doc = self.to_dict()
        raise_unreachable(self.hosts, doc)
        if self.health is not None:
            self.health.raise_for("status", doc)
        return self


def _host_status(
    conn: psycopg.Connection,
    topo: Topology,
    host: Host,
    st: HostStatus,
    known_versions: set[int],
    records: list[tuple],
    prints: set[str],
    per_shard: tuple[str, ...],
    second: fingerprint.Opener | None = None,
) -> str | None:
    """Fill ``st``; returns an error line when the host has no control schema (``second``: another
    connection to the host, for half of the fingerprints)."""
    st.server_version = conn.execute(SERVER_VERSION).fetchone()[0]
    health = st.health = read_host(conn, topo, host)
    st.missing = format_shards(health.missing)
    if not health.control:
        return "no control schema (run shardctl init)"
    rows = health.rows
    st.last_event = last_event(conn)
    # A shard is present when it is recorded *and* its schema really exists (ops.health).
    # Shard schemas no row records (strays); the recorded ones' names need no parsing.
    known = {row.schema for row in rows.values()}
    named = (topo.shard_of_schema(name) for name in schema_names(conn) if name not in known)
    real = set(named) - {None}
    owned = set(host.shards)
    present = health.present
    stray = real - set(rows)
    versions = [r.version for n, r in rows.items() if n in owned]
    st.present = len(present & owned)
    st.unexpected = format_shards((present | stray) - owned)
    st.moving = _moving(rows)
    records.extend(move_records(conn))
    by_print = fingerprint.kept(conn, topo, present, per_shard, second)
    mine = present & owned
    prints.update(fp for fp, shards in by_print.items() if mine.intersection(shards))
    if versions:
        st.min_version, st.max_version = min(versions), max(versions)
    if rows:
        st.orphan_versions = sorted(applied_versions(conn) - known_versions)
    return None


def _moving(rows: dict) -> str:
    """Shards not ``active`` here, by state: ``0-3 moved_out; 8 moving_in``."""
    by_state: dict[str, list[int]] = {}
    for n, r in rows.items():
        if r.state != "active":
            by_state.setdefault(r.state, []).append(n)
    return "; ".join(f"{format_shards(ns)} {state}" for state, ns in sorted(by_state.items()))


def pending_move_lines(topo: Topology, records: list[tuple]) -> list[str]:
    """One line per recorded move that needs a command, naming it: an unfinished move or abort, and a
    cut-over move whose source still keeps the old copies (``--cleanup``)."""
    moves: dict[str, Move] = {}
    merge_records(records, moves)
    out = []
    for move in sorted(moves.values(), key=lambda m: str(m.started_at)):
        step = next_step(topo, move) if move.active else None
        if step:
            out.append(
                f"move {move.move_id} (shards {format_shards(move.shards)} {move.source} → {move.target}, "
                f"phase {move.phase}): {step}"
            )
    return out


def status(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> StatusReport:
    """Per host: reachability, server version, shards expected vs present, versions, moves, last event."""
    started = time.perf_counter()
    files = {m.version: m.name for m in for_topology(topo)}
    known_versions = set(files)
    records: dict[str, list[tuple]] = {}  # host → its records of moves
    prints: dict[str, set[str]] = {}  # host → its shards' catalog fingerprints
    per_shard = per_shard_functions(topo)

    def work(host: Host, result: HostResult[HostStatus]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="status"
        ) as conn:
            result.error = _host_status(
                conn,
                topo,
                host,
                result.value,
                known_versions,
                records.setdefault(host.name, []),
                prints.setdefault(host.name, set()),
                per_shard,
                lambda: db.connect(
                    host, autocommit=True, connect_timeout=connect_timeout, purpose="status"
                ),
            )

    results = fan_out(
        select_hosts(topo, hosts), work, lambda h: HostStatus(h.masked_dsn, expected=len(h.shards))
    )
    pending = pending_move_lines(topo, [r for name in sorted(records) for r in records[name]])
    distinct = len(set().union(*prints.values())) if prints else 0
    health = assess(topo, from_results(results), files)
    for r in results:
        if r.value.health is not None:
            r.value.failed = failed_lines(r.value.health, files)
        behind = health.lagging.get(r.host)
        if behind:
            first = min(behind.values())
            r.value.lagging = (
                f"{files.get(first, f'V{first}')} pending on shards {format_shards(sorted(behind))}"
            )
    return StatusReport(
        results, time.perf_counter() - started, len(known_versions), pending, distinct, health
    )
