"""The one fan-out: run a piece of work on every host in parallel, one ``HostResult`` per host.

Every fleet command (init, migrate, add-shard, verify, status, grow's checks) goes through
``fan_out``; the usual failures (host unreachable, connection lost, lock busy, a database error)
become the result's fields, and ``raise_for_status`` turns the worst of them into the matching
exception (exit 3 before exit 1).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

import psycopg

from . import connections as db
from .executor import ConnectionLost, HostRunner, RunOptions, ShardOutcome, ShardPlan
from .ledger import ensure_control_schema, log_event  # noqa: F401 - re-exported for ops/move
from ..errors import HostUnreachable, OperationFailed, ShardctlError
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql.catalog import ShardRow, control_exists, shard_list  # noqa: F401 - re-exported

T = TypeVar("T")
ProgressFactory = Callable[[str, int], Callable[[int], None]]

read_shards = shard_list  # the name ops/move uses


@dataclass
class HostResult(Generic[T]):
    """What one command did on one host: reachability, a one-line error, time, and its own ``value``."""

    host: str
    reachable: bool = True
    error: str | None = None
    seconds: float = 0.0
    value: T | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and not self.error

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"host": self.host, "reachable": self.reachable, "error": self.error,
                             "seconds": round(self.seconds, 3)}
        if hasattr(self.value, "to_dict"):
            d.update(self.value.to_dict())
        elif is_dataclass(self.value):
            d.update(asdict(self.value))
        return d


def for_each_host(hosts: list[Host], work: Callable[[Host], T]) -> list[T]:
    """Run ``work`` for every host in parallel, in host order (no error handling: see ``fan_out``)."""
    if len(hosts) <= 1:
        return [work(h) for h in hosts]
    with ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="shardctl-host") as pool:
        return list(pool.map(work, hosts))


def fan_out(hosts: list[Host], work: Callable[[Host, HostResult[T]], None],
            value: Callable[[Host], T] | None = None) -> list[HostResult[T]]:
    """Run ``work(host, result)`` on every host in parallel; ``value`` makes each result's initial value.

    ``work`` fills ``result.value``; an exception it raises becomes ``result.error`` (and
    ``reachable=False`` when the host could not be reached or went away).
    """
    def one(host: Host) -> HostResult[T]:
        result: HostResult[T] = HostResult(host.name, value=value(host) if value else None)
        started = time.perf_counter()
        try:
            work(host, result)
        except HostUnreachable as exc:
            result.reachable, result.error = False, exc.reason
        except ConnectionLost as exc:
            result.reachable, result.error = False, f"connection lost: {exc}"
        except ShardctlError as exc:  # LockBusy, a refusal (drift, no control schema…)
            result.error = str(exc)
        except psycopg.Error as exc:
            result.error = db.first_line(exc)
        result.seconds = time.perf_counter() - started
        return result

    return for_each_host(hosts, one)


def raise_unreachable(results: Iterable[HostResult], report: object | None = None) -> None:
    down = [r for r in results if not r.reachable]
    if down:
        raise HostUnreachable(", ".join(r.host for r in down), down[0].error or "unreachable", report=report)


def raise_for_status(command: str, results: list[HostResult], problems: Iterable[str] = (),
                     report: object | None = None) -> None:
    """Raise for the worst outcome: HostUnreachable (exit 3), then OperationFailed (exit 1) naming
    ``problems`` and every host's error."""
    raise_unreachable(results, report)
    parts = list(problems) + [f"host {r.host}: {r.error}" for r in results if r.error]
    if parts:
        raise OperationFailed(f"{command}: " + "; ".join(parts), report=report)


def select_hosts(topo: Topology, names: list[str] | None) -> list[Host]:
    return [topo.host(n) for n in names] if names else list(topo.hosts)


# ---- init / migrate / add-shard: shards applied by the executor --------------------------

@dataclass
class ApplyOutcome:
    """The shards one host's executor run created, migrated, failed or did not start."""

    created: list[int] = field(default_factory=list)
    migrated: dict[int, list[int]] = field(default_factory=dict)
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    not_started: list[int] = field(default_factory=list)
    control_created: bool = False
    retried: int = 0  # shards applied after waiting out another transaction's lock

    def absorb(self, outcomes: list[ShardOutcome]) -> None:
        for o in outcomes:
            if not o.started:
                self.not_started.append(o.shard)
                continue
            if o.created:
                self.created.append(o.shard)
            if o.applied and not o.created:
                self.migrated[o.shard] = o.applied
            self.retried += 1 if o.retries and o.ok else 0
            if o.error:
                self.failed.append({"shard": o.shard, "schema": o.schema, "version": o.failed_version,
                                    "error": o.error, "created": o.created, "applied": o.applied})

    @property
    def changed(self) -> bool:
        return bool(self.created or self.migrated or self.control_created or any(f["applied"] for f in self.failed))

    def to_dict(self) -> dict:
        return {"created": format_shards(self.created), "created_count": len(self.created),
                "migrated": {str(k): v for k, v in self.migrated.items()}, "migrated_count": len(self.migrated),
                "unchanged": self.unchanged, "failed": self.failed, "not_started": format_shards(self.not_started),
                "control_created": self.control_created, "retried": self.retried}


@dataclass
class FleetReport:
    """The result of init / add-shard (and the base of migrate's): one HostResult[ApplyOutcome] per host."""

    command: str
    hosts: list[HostResult[ApplyOutcome]]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def outcome(self, host: HostResult[ApplyOutcome]) -> ApplyOutcome:
        return host.value if host.value is not None else ApplyOutcome()

    @property
    def unreachable(self) -> list[HostResult]:
        return [h for h in self.hosts if not h.reachable]

    @property
    def failed(self) -> list[dict]:
        return [dict(f, host=h.host) for h in self.hosts for f in self.outcome(h).failed]

    @property
    def errors(self) -> list[HostResult]:
        return [h for h in self.hosts if h.reachable and h.error]

    @property
    def not_started(self) -> int:
        return sum(len(self.outcome(h).not_started) for h in self.hosts)

    def total(self, name: str) -> int:
        """Shards created / migrated over every host."""
        return sum(len(getattr(self.outcome(h), name)) for h in self.hosts)

    @property
    def changed(self) -> bool:
        return any(self.outcome(h).changed for h in self.hosts)

    @property
    def ok(self) -> bool:
        return not self.unreachable and not self.failed and not self.errors and not self.not_started

    def to_dict(self) -> dict:
        return {"command": self.command, "ok": self.ok, "changed": self.changed, "seconds": round(self.seconds, 3),
                "hosts": [h.to_dict() for h in self.hosts], **self.extra}

    def problems(self) -> list[str]:
        parts = [f"{len(self.failed)} shard(s) failed"] if self.failed else []
        if self.not_started:
            parts.append(f"{self.not_started} shard(s) not started")
        return parts

    def raise_for_status(self) -> "FleetReport":
        """Raise the error matching the worst outcome (exit 3 > 1)."""
        raise_for_status(self.command, self.hosts, self.problems(), report=self.to_dict())
        return self


def apply_plans(host: Host, plans: list[ShardPlan], options: RunOptions, stop: threading.Event,
                outcome: ApplyOutcome, progress: ProgressFactory | None) -> None:
    tick = progress(host.name, len(plans)) if progress else None
    runner = HostRunner(host, options, stop, tick)
    outcome.absorb(runner.run(plans))
