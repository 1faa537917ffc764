"""Growing the fleet: ``add-host`` (an empty host) and ``add-shard`` (new logical shards on a host).

Invariant: a key that already maps to a shard keeps mapping to it. The routing
modulus is pinned in the topology before the shard count grows, and new
objects go where ``placement.new_objects`` says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..engine import connections as db
from ..engine import host_ledger
from ..engine.executor import RunOptions
from ..engine.fanout import FleetReport, HostResult, fan_out, raise_for_status, raise_unreachable
from ..engine.ledger import ensure_control_schema, log_event
from ..errors import BadInput
from ..model.documents import result_doc
from ..model.ranges import MAX_SHARDS, format_shards, parse_shards
from ..model.topology import Host, Topology
from ..model.topology_file import TopologyFile
from ..sql.catalog import inspect
from ..sql.catalog.control import shard_list
from ..sql.host_migrations import host_for_topology
from .provision import init


@dataclass
class AddHostResult:
    """What ``add_host`` did: the host (its DSN masked), whether its control schema was created, the
    host-level migrations applied, and the topology file written. A failure raises instead."""

    host: str
    dsn: str
    control_created: bool
    host_level_applied: list[int]
    topology: str
    command: str = "add-host"

    @property
    def ok(self) -> bool:
        return True

    def to_dict(self) -> dict:
        return result_doc(self)

    def raise_for_status(self) -> AddHostResult:
        return self


@dataclass
class AddShardResult(FleetReport):
    """What ``add_shard`` did: ``init``'s report for the host, plus the new shards, the fleet's migration
    version they were brought to, the routing modulus, the new shard count, and whether the topology
    file was written (only when every new shard is ready)."""

    new_shards: str = ""
    host: str = ""
    version: int | None = None
    modulus: int = 0
    shard_count: int = 0
    topology_written: bool = False

    @property
    def rerun(self) -> str:
        """The topology is written only once every new shard is ready, so the same command (the same
        ``--count`` or ``--ids``) opens the same shards and finishes them; a bare init would not."""
        return "the same shardctl add-shard command"

    def to_dict(self) -> dict:
        doc = {
            **super().to_dict(),
            "new_shards": self.new_shards,
            "host": self.host,
            "version": self.version,
            "modulus": self.modulus,
            "shard_count": self.shard_count,
        }
        if self.topology_written:
            doc["topology_written"] = True
        return doc


def topology_path(topology: Topology | str | os.PathLike) -> Path:
    """The file behind ``topology`` (a loaded Topology or a path): growing the fleet rewrites it."""
    if isinstance(topology, Topology):
        if topology.path is None:
            raise BadInput(
                "this topology was not loaded from a file; growing the fleet rewrites its file"
            )
        return topology.path
    return Path(topology)


def add_host(
    topology: Topology | str | os.PathLike,
    name: str,
    dsn: str,
    *,
    password_env: str | None = None,
    standby: str | None = None,
    allow_inline_password: bool = False,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> AddHostResult:
    """Add an empty host to the topology file (``topology``: a loaded Topology or its path) and create
    its control schema.

    The file is written only after the host was reached and prepared.
    """
    edit = TopologyFile(topology_path(topology), allow_inline_password=allow_inline_password)
    if any(isinstance(h, dict) and h.get("name") == name for h in edit.doc.get("hosts") or []):
        raise BadInput(f"host {name!r} is already in the topology")
    edit.add_host(name, dsn, password_env=password_env, standby=standby)
    topo = edit.validate()  # exit 2 before touching anything
    host = topo.host(name)
    host_level = host_for_topology(topo)
    for m in host_level:  # a file that does not render fails before anything is touched
        m.sql(topo, name)
    with db.host_lock(host, connect_timeout=connect_timeout, purpose="add-host") as conn:
        created = ensure_control_schema(conn, topo)
        stray = shard_list(conn)
        if stray:
            raise BadInput(
                f"host {name} already holds shards {format_shards(stray)} of another fleet; "
                f"add an empty host"
            )
        # The host-level history (extensions, shared types) now, so shards moved or added here later
        # find it in place.
        applied = host_ledger.apply(conn, topo, host, host_level)
        log_event(conn, "add-host", [], {"name": name, "host_level": applied})
    edit.save()
    return AddHostResult(
        host=name,
        dsn=host.masked_dsn,
        control_created=created,
        host_level_applied=applied,
        topology=str(edit.path),
    )


def new_shard_ids(topo: Topology, count: int | None, ids: str | None) -> list[int]:
    """The shard numbers to open: ``count`` more after the current count, or explicit ``ids``. Bounds
    (the layout's shard bits) are checked before any list of shards is built."""
    if (count is None) == (ids is None):
        raise BadInput("give either --count N or --ids RANGE")
    limit = min(topo.layout.max_shards, MAX_SHARDS)
    beyond = f"beyond the {topo.layout.name} layout's {topo.layout.bits('shard')} shard bits (at most {limit} shards"
    if count is not None:
        room = max(limit - topo.shard_count, 0)
        if count > room:
            raise BadInput(
                f"--count {count} goes {beyond}; the fleet has {topo.shard_count}, so at most {room} more)"
            )
        if count < 1:
            raise BadInput(f"--count must be positive, got {count}")
        wanted = list(range(topo.shard_count, topo.shard_count + count))
    else:
        try:
            wanted = parse_shards(ids, limit=limit)
        except ValueError as exc:
            raise BadInput(f"--ids: {exc}: {beyond})") from None
    owned = [n for n in wanted if n < topo.shard_count]
    if owned:
        owners = sorted({topo.host_of(n).name for n in owned})
        raise BadInput(
            f"shards {format_shards(owned)} already exist (owned by {', '.join(owners)}); "
            f"add-shard opens new shards from {topo.shard_count} on"
        )
    gap = sorted(set(range(topo.shard_count, max(wanted) + 1)) - set(wanted))
    if gap:
        raise BadInput(
            f"shards {format_shards(gap)} would be owned by no host; new shards must follow on "
            f"from {topo.shard_count} without gaps"
        )
    return wanted


def shards_hold_data(
    topo: Topology, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
) -> list[str]:
    """Hosts on which any shard table has a row (exact: EXISTS per table, batched)."""

    def work(host: Host, result: HostResult[bool]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="data check"
        ) as conn:
            schemas = [topo.schema_name(n) for n in host.shards]
            tables = inspect.tables(conn, schemas, "rp")
            for i in range(0, len(tables), 500):
                if inspect.any_rows(conn, tables[i : i + 500]):
                    result.value = True
                    return

    results = fan_out([h for h in topo.hosts if h.shards], work, lambda h: False)
    raise_for_status("data check", results)
    return [r.host for r in results if r.value]


def add_shard(
    topology: Topology | str | os.PathLike,
    host_name: str,
    *,
    count: int | None = None,
    ids: str | None = None,
    modulus: int | None = None,
    place_new: bool = False,
    allow_inline_password: bool = False,
    options: RunOptions | None = None,
    progress=None,
) -> AddShardResult:
    """Open new logical shards on ``host_name``: provision them like ``init`` at the fleet's current
    migration version, then record them in the topology file (``topology``: a loaded Topology or its
    path; written only when every new shard is ready, else the error raised carries the report)."""
    # a copy: the caller's options are not changed
    options = replace(options or RunOptions(), purpose="add-shard")
    options.connect_timeout = options.connect_timeout or db.DEFAULT_CONNECT_TIMEOUT
    path = topology_path(topology)
    topo = (
        topology
        if isinstance(topology, Topology)
        else Topology.load(path, allow_inline_password=allow_inline_password)
    )
    topo.host(host_name)  # unknown host: exit 2
    wanted = new_shard_ids(topo, count, ids)
    if modulus is not None and modulus != topo.modulus:
        holders = shards_hold_data(topo, options.connect_timeout)
        if holders:
            raise BadInput(
                f"refusing to change the routing modulus from {topo.modulus} to {modulus}: shards on "
                f"{', '.join(holders)} hold data, and their keys would map to other shards"
            )
    edit = TopologyFile(path, allow_inline_password=allow_inline_password)
    edit.pin_modulus(modulus if modulus is not None else topo.modulus)
    edit.set_count(max(wanted) + 1)
    edit.set_host_shards(host_name, sorted(edit.host_shards(host_name) + wanted))
    if place_new:
        edit.set_new_objects(wanted)
    new_topo = edit.validate()

    version = fleet_version(topo, options.connect_timeout)
    report = init(
        new_topo,
        hosts=[host_name],
        options=options,
        progress=progress,
        target=version,
    )
    result = AddShardResult(
        command="add-shard",
        hosts=report.hosts,
        seconds=report.seconds,
        extra=report.extra,
        interrupted=report.interrupted,
        new_shards=format_shards(wanted),
        host=host_name,
        version=version,
        modulus=new_topo.modulus,
        shard_count=new_topo.shard_count,
    )
    result.raise_for_status()
    edit.save()
    result.topology_written = True
    return result


def fleet_version(topo: Topology, connect_timeout: int) -> int | None:
    """The highest migration version any existing shard is at (None for an empty fleet)."""

    def work(host: Host, result: HostResult[int | None]) -> None:
        if host.shards:
            with db.connect(
                host, autocommit=True, connect_timeout=connect_timeout, purpose="add-shard"
            ) as conn:
                rows = shard_list(conn)
            owned = set(host.shards)
            result.value = max((r.version for n, r in rows.items() if n in owned), default=None)

    results = fan_out(topo.hosts, work)
    raise_unreachable(results)  # a host that answers with an error has no version to offer
    found = [r.value for r in results if r.value is not None]
    return max(found) if found else None
