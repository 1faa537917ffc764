"""Shared fleet plumbing: per-host state from the control schema, parallel hosts, reports."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TypeVar

import psycopg

from . import connections as db
from .executor import ConnectionLost, HostRunner, RunOptions, ShardOutcome, ShardPlan
from ..errors import HostUnreachable, LockBusy, ShardctlError
from ..model.ranges import format_shards
from ..sql.render import render_control
from ..model.topology import Host, Topology

T = TypeVar("T")
ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass
class ShardRow:
    shard: int
    schema: str
    state: str
    version: int


def control_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('shardctl.migrations') IS NOT NULL").fetchone()[0]


def ensure_control_schema(conn: psycopg.Connection, topo: Topology | None = None) -> bool:
    """Create the control schema if missing (call under the host lock). True if it was created."""
    if control_exists(conn):
        return False
    with conn.transaction():
        conn.execute(render_control(topo))
    return True


def read_shards(conn: psycopg.Connection) -> dict[int, ShardRow]:
    """Every shard recorded on the host, with its migration version: one query."""
    if not control_exists(conn):
        return {}
    rows = conn.execute(
        """SELECT s.shard_id, s.schema_name, s.state, coalesce(max(m.version), 0)
             FROM shardctl.shards s LEFT JOIN shardctl.migrations m USING (shard_id)
            GROUP BY 1, 2, 3"""
    ).fetchall()
    return {r[0]: ShardRow(r[0], r[1], r[2], r[3]) for r in rows}


def log_event(conn: psycopg.Connection, kind: str, shards: list[int], detail: dict[str, Any]) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO shardctl.events (kind, shards, detail) VALUES (%s, %s, %s::jsonb)",
                     (kind, format_shards(shards) if shards else None, json.dumps(detail, default=str)))


@dataclass
class HostReport:
    """What one command did on one host."""

    host: str
    reachable: bool = True
    error: str | None = None
    seconds: float = 0.0
    created: list[int] = field(default_factory=list)
    migrated: dict[int, list[int]] = field(default_factory=dict)
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    not_started: list[int] = field(default_factory=list)
    control_created: bool = False

    def absorb(self, outcomes: list[ShardOutcome]) -> None:
        for o in outcomes:
            if not o.started:
                self.not_started.append(o.shard)
                continue
            if o.created:
                self.created.append(o.shard)
            if o.applied and not o.created:
                self.migrated[o.shard] = o.applied
            if o.error:
                self.failed.append({"shard": o.shard, "schema": o.schema, "version": o.failed_version,
                                    "error": o.error, "created": o.created, "applied": o.applied})

    @property
    def changed(self) -> bool:
        return bool(self.created or self.migrated or self.control_created or any(f["applied"] for f in self.failed))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["created"] = format_shards(self.created)
        d["created_count"] = len(self.created)
        d["migrated_count"] = len(self.migrated)
        d["migrated"] = {str(k): v for k, v in self.migrated.items()}
        d["not_started"] = format_shards(self.not_started)
        return d


@dataclass
class FleetReport:
    command: str
    hosts: list[HostReport]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def unreachable(self) -> list[HostReport]:
        return [h for h in self.hosts if not h.reachable]

    @property
    def failed(self) -> list[dict]:
        return [dict(f, host=h.host) for h in self.hosts for f in h.failed]

    @property
    def errors(self) -> list[HostReport]:
        return [h for h in self.hosts if h.reachable and h.error]

    @property
    def changed(self) -> bool:
        return any(h.changed for h in self.hosts)

    @property
    def ok(self) -> bool:
        return not self.unreachable and not self.failed and not self.errors and \
            not any(h.not_started for h in self.hosts)

    def to_dict(self) -> dict:
        return {"command": self.command, "ok": self.ok, "changed": self.changed, "seconds": round(self.seconds, 3),
                "hosts": [h.to_dict() for h in self.hosts], **self.extra}

    def raise_for_status(self) -> "FleetReport":
        """Raise the error matching the worst outcome (exit 3 > 1)."""
        from ..errors import OperationFailed

        if self.unreachable:
            names = ", ".join(h.host for h in self.unreachable)
            first = self.unreachable[0]
            raise HostUnreachable(names, first.error or "unreachable", report=self.to_dict())
        if self.failed or self.errors or any(h.not_started for h in self.hosts):
            parts = []
            if self.failed:
                parts.append(f"{len(self.failed)} shard(s) failed")
            for h in self.errors:
                parts.append(f"host {h.host}: {h.error}")
            stopped = sum(len(h.not_started) for h in self.hosts)
            if stopped:
                parts.append(f"{stopped} shard(s) not started")
            raise OperationFailed(f"{self.command}: " + "; ".join(parts), report=self.to_dict())
        return self


def for_each_host(hosts: list[Host], work: Callable[[Host], T]) -> list[T]:
    """Run ``work`` for every host in parallel, in host order."""
    if len(hosts) <= 1:
        return [work(h) for h in hosts]
    with ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="shardctl-host") as pool:
        return list(pool.map(work, hosts))


def select_hosts(topo: Topology, names: list[str] | None) -> list[Host]:
    return [topo.host(n) for n in names] if names else list(topo.hosts)


def run_on_host(host: Host, report: HostReport, body: Callable[[], None]) -> HostReport:
    """Run ``body`` for a host, turning the usual failures into the report's fields."""
    started = time.perf_counter()
    try:
        body()
    except HostUnreachable as exc:
        report.reachable, report.error = False, exc.reason
    except ConnectionLost as exc:
        report.reachable, report.error = False, f"connection lost: {exc}"
    except LockBusy as exc:
        report.error = str(exc)
    except ShardctlError as exc:
        report.error = str(exc)
    except psycopg.Error as exc:
        report.error = db.first_line(exc)
    report.seconds = time.perf_counter() - started
    return report


def apply_plans(host: Host, plans: list[ShardPlan], options: RunOptions, stop: threading.Event,
                report: HostReport, progress: ProgressFactory | None) -> None:
    tick = progress(host.name, len(plans)) if progress else None
    runner = HostRunner(host, options, stop, tick)
    report.absorb(runner.run(plans))
