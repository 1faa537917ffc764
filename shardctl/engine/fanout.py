"""The one fan-out: run a piece of work on every host in parallel, one ``HostResult`` per host.

Every fleet command (init, migrate, add-shard, verify, status, grow's checks) goes through
``fan_out``; the usual failures (host unreachable, connection lost, lock busy, a database error)
become the result's fields, and ``raise_for_status`` turns the worst of them into the matching
exception (exit 3 before exit 1).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Generic, TypeVar

import psycopg
from psycopg import conninfo as pg_conninfo

from ..errors import HostUnreachable, Interrupted, OperationFailed, ShardctlError
from ..model.documents import json_value, result_doc
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql.catalog.capacity import connection_headroom, server_cores
from . import connections as db
from .executor import INTERRUPTED, ConnectionLost, HostRunner, RunOptions, ShardOutcome, ShardPlan

T = TypeVar("T")
H = TypeVar("H")
ProgressFactory = Callable[[str, int], Callable[[int], None]]


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
        """The host's own fields, then its value's document (its ``to_dict()``, or a dataclass's
        fields), merged in."""
        d = result_doc(self, omit=("value",))
        if hasattr(self.value, "to_dict") or is_dataclass(self.value):
            d.update(json_value(self.value))
        return d


def for_each_host(hosts: list[H], work: Callable[[H], T]) -> list[T]:
    """Run ``work`` for every host (a topology's, or a sandbox's) in parallel, in host order; the first
    error in host order is raised once every host is done (no error handling: see ``fan_out``)."""
    if len(hosts) <= 1:
        return [work(h) for h in hosts]
    with ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="shardctl-host") as pool:
        return list(pool.map(work, hosts))


def fan_out(
    hosts: list[Host],
    work: Callable[[Host, HostResult[T]], None],
    value: Callable[[Host], T] | None = None,
) -> list[HostResult[T]]:
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


@dataclass
class CtrlC:
    """Whether Ctrl-C stopped the run (``stop_on_ctrl_c``)."""

    pressed: bool = False


@contextmanager
def stop_on_ctrl_c(stop: threading.Event | None = None) -> Iterator[CtrlC]:
    """For the block (a fleet run that changes shards): Ctrl-C (SIGINT) stops the run at the next
    batch boundary instead of raising in the middle of it. Every runner finishes the transaction in
    hand (so each shard is complete or absent), starts no other, and the operation returns its report,
    which names the shards not started; ``pressed`` tells the caller (its result raises
    ``Interrupted``, exit 130). A second Ctrl-C raises KeyboardInterrupt at once (a transaction in
    flight then rolls back). Outside the main thread, signals cannot be handled: nothing changes."""
    ctrl_c = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    previous = signal.getsignal(signal.SIGINT)
    restore = previous if previous is not None else signal.default_int_handler

    def on_sigint(signum: int, frame: object) -> None:
        if ctrl_c.pressed:
            signal.signal(signal.SIGINT, restore)
            raise KeyboardInterrupt
        ctrl_c.pressed = True
        INTERRUPTED.set()
        if stop is not None:
            stop.set()

    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, restore)
        INTERRUPTED.clear()


def host_error(result: HostResult) -> str:
    """``result``'s error, naming its host once (an error that already starts with the host keeps it)."""
    error = result.error or "unreachable"
    prefix = f"host {result.host}"
    if error == prefix or error.startswith((prefix + ":", prefix + " ")):
        return error
    return f"{prefix}: {error}"


def raise_unreachable(
    results: Iterable[HostResult], report: object | None = None, others: Iterable[str] = ()
) -> None:
    """Raise HostUnreachable for the hosts that could not be reached, with each distinct reason once
    (and ``others``, the run's other failures, after them)."""
    down = [r for r in results if not r.reachable]
    if not down:
        return
    reasons = list(dict.fromkeys(r.error or "unreachable" for r in down))
    reason = (
        reasons[0]
        if len(reasons) == 1
        else "; ".join(f"{r.host}: {r.error or 'unreachable'}" for r in down)
    )
    raise HostUnreachable(
        ", ".join(r.host for r in down), "; ".join([reason, *others]), report=report
    )


def raise_for_status(
    command: str,
    results: list[HostResult],
    problems: Iterable[str] = (),
    report: object | None = None,
) -> None:
    """Raise for the worst outcome: HostUnreachable (exit 3), then OperationFailed (exit 1). The one
    message names ``problems`` and every host's error, each host once."""
    problems = list(problems)
    errors = [host_error(r) for r in results if r.reachable and r.error]
    raise_unreachable(results, report, others=problems + errors)
    if problems or errors:
        raise OperationFailed(f"{command}: " + "; ".join(problems + errors), report=report)


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
    host_applied: list[int] = field(default_factory=list)  # host-level versions this run applied
    retried: int = 0  # shards applied after waiting out another transaction's lock
    jobs: int = 1  # streams (connections) that applied shards on the host
    jobs_rule: str = ""  # why that many (see docs/performance.md)

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
                self.failed.append(
                    {
                        "shard": o.shard,
                        "schema": o.schema,
                        "version": o.failed_version,
                        "error": o.error,
                        "created": o.created,
                        "applied": o.applied,
                    }
                )

    @property
    def changed(self) -> bool:
        return bool(
            self.created
            or self.migrated
            or self.control_created
            or self.host_applied
            or any(f["applied"] for f in self.failed)
        )

    def to_dict(self) -> dict:
        return {
            "created": format_shards(self.created),
            "created_count": len(self.created),
            "migrated": {str(k): v for k, v in self.migrated.items()},
            "migrated_count": len(self.migrated),
            "unchanged": self.unchanged,
            "failed": self.failed,
            "not_started": format_shards(self.not_started),
            "control_created": self.control_created,
            "host_applied": self.host_applied,
            "retried": self.retried,
            "jobs": self.jobs,
            "jobs_rule": self.jobs_rule,
        }


@dataclass
class HostLevelFigures:
    """The host-level migrations of an init: how many there are, and the versions applied per host."""

    latest: int = 0
    applied: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class InitFigures:
    """What init (and add-shard, which runs it) reports beside the hosts: the version every shard
    reached, the shards whose schema had been dropped and were built again (host → range), and the
    host-level migrations."""

    latest_version: int = 0
    recreated: dict[str, str] = field(default_factory=dict)
    host_level: HostLevelFigures = field(default_factory=HostLevelFigures)


@dataclass
class FleetReport:
    """The result of init / add-shard (and the base of migrate's): one HostResult[ApplyOutcome] per host."""

    command: str
    hosts: list[HostResult[ApplyOutcome]]
    seconds: float = 0.0
    extra: InitFigures | None = None  # init's and add-shard's own figures
    interrupted: bool = False  # Ctrl-C stopped the run at a batch boundary (stop_on_ctrl_c)

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

    @property
    def rerun(self) -> str:
        """What finishes an interrupted run: the command again."""
        return f"shardctl {self.command}"

    def total(self, name: str) -> int:
        """Shards created / migrated over every host."""
        return sum(len(getattr(self.outcome(h), name)) for h in self.hosts)

    @property
    def changed(self) -> bool:
        return any(self.outcome(h).changed for h in self.hosts)

    @property
    def ok(self) -> bool:
        return (
            not self.interrupted
            and not self.unreachable
            and not self.failed
            and not self.errors
            and not self.not_started
        )

    def to_dict(self) -> dict:
        return {
            "command": self.command,
            "ok": self.ok,
            "changed": self.changed,
            "seconds": round(self.seconds, 3),
            "hosts": [h.to_dict() for h in self.hosts],
            "interrupted": self.interrupted,
            **(asdict(self.extra) if self.extra is not None else {}),
        }

    def problems(self) -> list[str]:
        parts = []
        # the first failure, named by its migration file when the caller set one (ops/)
        if self.failed:
            f = self.failed[0]
            where = f" at {f['file']}" if f.get("file") else ""
            parts.append(
                f"{len(self.failed)} shard(s) failed (first: shard {f['shard']} on {f['host']}{where}: "
                f"{f['error']})"
            )
        if self.not_started:
            parts.append(f"{self.not_started} shard(s) not started")
        return parts

    def raise_for_interrupt(self) -> None:
        """Interrupted (exit 130) when Ctrl-C stopped the run: what was done and what was not."""
        if not self.interrupted:
            return
        done = self.total("created") + self.total("migrated")
        raise Interrupted(
            f"{self.command}: interrupted (Ctrl-C): stopped at a shard boundary; {done} shard(s) "
            f"done, {self.not_started} not started; every shard is complete or absent: run "
            f"{self.rerun} again to finish",
            report=self.to_dict(),
        )

    def raise_for_status(self) -> FleetReport:
        """Raise the error matching the worst outcome (Ctrl-C 130 > exit 3 > 1)."""
        self.raise_for_interrupt()
        raise_for_status(self.command, self.hosts, self.problems(), report=self.to_dict())
        return self


# ---- parallel streams per host ----------------------------------------------------------

# a default never opens more streams per host than this (--jobs / max_jobs may)
MAX_DEFAULT_JOBS = 16
REMOTE_DEFAULT_JOBS = 4  # a remote server that will not tell its cores
LOCAL_NAMES = {"", "localhost", "127.0.0.1", "::1"}
# A stream costs a connection and a backend warming its caches: below this many shards per stream a
# run stays on one connection (and small runs keep their simple, strictly ordered behaviour).
MIN_SHARDS_PER_STREAM = 64


@dataclass
class Jobs:
    """How many streams (connections) apply shards on one host, and why."""

    count: int
    rule: str


def _is_local(host: Host) -> bool:
    """Whether shardctl reaches the host on this machine (a Unix socket or a loopback address)."""
    try:
        params = pg_conninfo.conninfo_to_dict(host.dsn_for("admin"))  # libpq's own parser
    except psycopg.ProgrammingError:  # a DSN problem surfaces when connecting, not here
        return False
    where = str(params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST") or "")
    return all(part.startswith("/") or part in LOCAL_NAMES for part in where.split(","))


def host_jobs(host: Host, conn: psycopg.Connection, requested: int | None = None) -> Jobs:
    """Streams for ``host`` (the rule, as docs/performance.md gives it): ``requested`` (``--jobs``),
    else the server's cores
    (asked when the role may read /proc/cpuinfo), else this machine's for a local server, else
    REMOTE_DEFAULT_JOBS; a default is capped at MAX_DEFAULT_JOBS. Then bounded by ``hosts[].max_jobs``
    and by half the server's free connection slots (the other half stays for the application)."""
    if requested:
        count, rule = requested, "--jobs"
    else:
        cores = server_cores(conn)
        if cores:
            count, rule = cores, "server cores"
        elif _is_local(host):
            count, rule = os.cpu_count() or 1, "local cores"
        else:
            count, rule = REMOTE_DEFAULT_JOBS, "remote default"
        count = min(count, MAX_DEFAULT_JOBS)
    if host.max_jobs and host.max_jobs < count:
        count, rule = host.max_jobs, "hosts[].max_jobs"
    free = max(1, connection_headroom(conn) // 2)
    if free < count:
        count, rule = free, "connection headroom"
    return Jobs(max(1, count), rule)


class _HostStop:
    """The run's stop event as one host's streams see it: a failed shard stops the whole run (as with
    one stream), while a lost connection stops only this host's other streams (the other hosts go on)."""

    def __init__(self, run: threading.Event):
        self.run = run
        self.host = threading.Event()

    def is_set(self) -> bool:
        return self.host.is_set() or self.run.is_set()

    def set(self) -> None:
        self.run.set()


class _Source:
    """Hands out disjoint chunks of a host's plans to its streams (pulled lazily from a generator)."""

    def __init__(self, plans: Iterable[ShardPlan], chunk: int, stop: _HostStop, keep_going: bool):
        self._plans = iter(plans)
        self._chunk = chunk
        self._stop = stop
        self._keep_going = keep_going
        self._lock = threading.Lock()

    def next(self) -> list[ShardPlan]:
        with self._lock:
            if INTERRUPTED.is_set() or (self._stop.is_set() and not self._keep_going):
                return []
            return list(itertools.islice(self._plans, self._chunk))

    def rest(self) -> list[ShardOutcome]:
        with self._lock:
            return [ShardOutcome(p.shard, p.schema, started=False) for p in self._plans]


def run_streams(
    name: str, streams: int, work: Callable[[int], None], halt: threading.Event
) -> list[BaseException]:
    """Run ``work(k)`` for k in 0..streams-1, each in a thread of its own (inline for one stream), and
    return what they raised. The first failure sets ``halt``, which the other streams check between
    batches, so they finish the batch in hand and stop."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # noqa: BLE001 - returned to the caller, after the other streams stop
            halt.set()
            errors.append(exc)

    if streams == 1:
        guarded(0)
        return errors
    threads = [
        threading.Thread(target=guarded, args=(k,), name=f"shardctl-{name}-{k}", daemon=True)
        for k in range(streams)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def apply_plans(
    host: Host,
    plans: Iterable[ShardPlan],
    options: RunOptions,
    stop: threading.Event,
    outcome: ApplyOutcome,
    progress: ProgressFactory | None,
    *,
    total: int | None = None,
    jobs: int = 1,
) -> None:
    """Apply ``plans`` on ``host`` in ``jobs`` parallel streams, each its own ``HostRunner`` (connection).

    Plans may be a generator (``total`` then says how many): streams pull disjoint chunks of it, so
    only the chunks in flight are rendered and held. Every shard stays atomic (the runner's own
    transactions); the first failure sets ``stop`` for every stream (unless continue_on_error), and
    plans never handed out are reported not started. A lost connection stops the host's other streams,
    then propagates (the host is reported unreachable; other hosts go on)."""
    if total is None:
        plans = list(plans)
        total = len(plans)
    tick = progress(host.name, total) if progress else None
    if tick is not None and jobs > 1:
        lock = threading.Lock()
        inner = tick

        def tick(n: int) -> None:
            with lock:
                inner(n)

    batch = max(1, options.batch_size)
    streams = max(1, min(jobs, -(-total // batch), total // MIN_SHARDS_PER_STREAM))
    # Chunks: a few per stream, so the streams end together; at most recycle_after (a connection's life).
    chunk = max(batch, min(max(1, options.recycle_after), -(-total // (streams * 4))))
    outcome.jobs = streams
    halt = _HostStop(stop)
    source = _Source(plans, chunk, halt, options.continue_on_error)
    absorb_lock = threading.Lock()

    def stream(k: int) -> None:
        runner = HostRunner(host, options, halt, tick)  # type: ignore[arg-type] - duck-typed Event
        try:
            while True:
                part = source.next()
                if not part:
                    return
                done = runner.run(part, keep_open=True)
                with absorb_lock:
                    outcome.absorb(done)
        finally:
            runner.close()

    errors = run_streams(host.name, streams, stream, halt.host)
    outcome.absorb(source.rest())
    if errors:
        raise next((e for e in errors if isinstance(e, ConnectionLost)), errors[0])
