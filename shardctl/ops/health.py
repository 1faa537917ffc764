"""The fleet's health: the one answer ``status``, ``plan``, ``verify`` and ``migrate --check`` give.

Three things make a fleet unfit for any other check, and each command reports them the same way,
with the same exit code and a one-line cause that names the fix:

- a host that cannot be reached or cannot authenticate (its ``password_env`` unset, its password
  refused): exit 3 (``HostUnreachable``; ``engine.connections.connect`` words the cause);
- shards missing (never created, or their schema is gone): exit 4 (``FleetIncomplete``, "run shardctl
  init");
- versions mixed: shards behind the highest version applied anywhere in the fleet (a host that was
  down during ``migrate``, a run that stopped) or stopped by a failed migration: exit 4 ("V0004 …
  pending on shards …: run shardctl migrate"). A lagging host is named as lagging, never as hundreds
  of shards whose schema differs.

A fleet whose every shard is at one version below the newest migration file is healthy: that is work
pending, which ``migrate --check`` alone reports (exit 1).

Per host it costs four small queries (:func:`read_host`), which the commands run on the connection they
already hold; ``verify`` calls :func:`fleet_health`, which opens its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import HostResult, fan_out, raise_unreachable, select_hosts
from ..engine.ledger import recorded_failures
from ..errors import FleetIncomplete
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql.catalog.control import ShardRow, control_exists, schemaless_shards, shard_list
from ..sql.migrations import for_topology


@dataclass
class HostHealth:
    """What one host's control schema says about its shards (``rows``: every shard it records)."""

    host: str
    reachable: bool = True
    error: str | None = None  # why the host could not be read (unreachable, cannot authenticate)
    control: bool = True  # the control schema exists
    rows: dict[int, ShardRow] = field(default_factory=dict, repr=False)
    present: set[int] = field(
        default_factory=set, repr=False
    )  # recorded shards whose schema exists
    missing: list[int] = field(default_factory=list)  # owned shards not recorded, or schema gone
    failed: dict[int, int] = field(default_factory=dict)  # shard → the version it failed at


def read_host(conn: psycopg.Connection, topo: Topology, host: Host) -> HostHealth:
    """Read ``host``'s shards, the ones missing and the ones a migrate left failed (four queries). A
    shard is present when it is recorded and its schema, named as the topology names it, exists (a
    moved shard's renamed old copy is not it)."""
    health = HostHealth(host.name)
    owned = set(host.shards)
    health.rows = shard_list(conn)  # {} without a control schema
    if not health.rows and not control_exists(conn):
        health.control = False
        health.missing = sorted(owned)
        return health
    gone = schemaless_shards(conn)
    name = topo.schema_name
    # an active shard's row names its schema as the topology does; a moved one's, its renamed copy
    health.present = {
        n
        for n, row in health.rows.items()
        if n not in gone and (row.state == "active" or row.schema == name(n))
    }
    health.missing = sorted(owned - health.present)
    health.failed = {
        shard: version
        for shard, version in recorded_failures(conn).items()
        if shard in owned & health.present and health.rows[shard].version < version
    }
    return health


def failed_lines(health: HostHealth, files: dict[int, str]) -> list[str]:
    """``shards 5,7 at V0003__x.sql``, per version: the host's shards a migrate left failed."""
    by_version: dict[int, list[int]] = {}
    for shard, version in health.failed.items():
        by_version.setdefault(version, []).append(shard)
    return [
        f"shards {format_shards(sorted(s))} at {files.get(v, f'V{v}')}"
        for v, s in sorted(by_version.items())
    ]


def unreachable(host: str, error: str | None) -> HostHealth:
    return HostHealth(host, reachable=False, error=error)


@dataclass
class FleetHealth:
    """Every host's health and the findings that make the fleet incomplete (one line each)."""

    hosts: list[HostHealth]
    findings: list[str] = field(default_factory=list)
    flagged: set[str] = field(default_factory=set)  # the hosts the findings name
    top: int = 0  # the highest version applied to any present shard
    # host → shard → the first version it lacks that other shards have
    lagging: dict[str, dict[int, int]] = field(default_factory=dict)

    @property
    def reachable(self) -> bool:
        return all(h.reachable for h in self.hosts)

    @property
    def ok(self) -> bool:
        return self.reachable and not self.findings

    def healthy_hosts(self) -> list[str]:
        """The hosts with nothing to report (read, no shard missing, failed or lagging)."""
        return [h.host for h in self.hosts if h.reachable and h.host not in self.flagged]

    def level_hosts(self) -> list[str]:
        """The hosts read whose shards are all at the fleet's version (none failed or lagging):
        the ones whose shards can be compared with each other and with the reference."""
        return [
            h.host
            for h in self.hosts
            if h.reachable and not h.failed and not self.lagging.get(h.host)
        ]

    def to_dict(self) -> dict:
        down = [f"{h.host}: {h.error}" for h in self.hosts if not h.reachable]
        return {"ok": self.ok, "findings": down + self.findings}

    def add(self, host: str, line: str) -> None:
        self.findings.append(f"{host}: {line}")
        self.flagged.add(host)

    def raise_for(self, command: str, report: object | None = None) -> None:
        """HostUnreachable (exit 3) for hosts that could not be read, else FleetIncomplete (exit 4)
        naming every finding; nothing when the fleet is healthy."""
        raise_unreachable(self.hosts, report)  # type: ignore[arg-type] - HostHealth has its fields
        if self.findings:
            raise FleetIncomplete(f"{command}: " + "; ".join(self.findings), report=report)


def assess(
    topo: Topology,
    hosts: list[HostHealth],
    files: dict[int, str] | None = None,
    shards: list[int] | None = None,
) -> FleetHealth:
    """The fleet's findings from each host's health: missing, failed, then lagging shards, host by
    host. ``files``: version → migration file name (default: the topology's); ``shards``: only these
    are named (the versions they are measured against are the whole fleet's)."""
    if files is None:
        files = {m.version: m.name for m in for_topology(topo)}
    scope = None if shards is None else set(shards)
    active: dict[str, dict[int, int]] = {}  # host → its active shards' versions (failed ones aside)
    for h in hosts:
        owned = set(topo.host(h.host).shards) - set(h.missing)
        active[h.host] = {
            n: r.version
            for n, r in h.rows.items()
            if r.state == "active" and n in owned and n not in h.failed
        }
    top = max((v for versions in active.values() for v in versions.values()), default=0)
    health = FleetHealth(hosts, top=top)

    def named(items: list[int]) -> list[int]:
        return sorted(n for n in items if scope is None or n in scope)

    for h in hosts:
        missing = named(h.missing)
        if missing:
            health.add(h.host, f"shards {format_shards(missing)} missing (run shardctl init)")
        failed = HostHealth(h.host, failed={n: v for n, v in h.failed.items() if named([n])})
        for line in failed_lines(failed, files):
            health.add(h.host, f"{line} failed (fix it, then re-run shardctl migrate)")
        behind = {n: v + 1 for n, v in active.get(h.host, {}).items() if v < top}
        health.lagging[h.host] = behind
        if named(list(behind)):
            first = min(behind.values())
            health.add(
                h.host,
                f"{files.get(first, f'V{first}')} pending on shards "
                f"{format_shards(named(list(behind)))} while other shards are at V{top} "
                f"(run shardctl migrate)",
            )
    return health


def fleet_health(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> FleetHealth:
    """Read every selected host (one connection each, in parallel) and assess the fleet."""

    def work(host: Host, result: HostResult[HostHealth]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="health"
        ) as conn:
            result.value = read_host(conn, topo, host)

    results = fan_out(select_hosts(topo, hosts), work)
    return assess(topo, from_results(results))


def from_results(results: list[HostResult]) -> list[HostHealth]:
    """Each result's health: its ``value`` (a HostHealth, or a value holding one as ``health``), or
    what its failure says when the host could not be read."""
    out = []
    for r in results:
        health = getattr(r.value, "health", r.value)
        if not r.reachable or not isinstance(health, HostHealth):
            out.append(unreachable(r.host, r.error) if not r.reachable else HostHealth(r.host))
            continue
        out.append(health)
    return out
