"""The Router's per-host machinery: a small connection pool, a circuit breaker and a call watchdog, each
with its bookkeeping written once (:class:`PoolBase`, :class:`Breaker`) and only the waiting twice:
threads (:class:`HostPool`, :class:`Watchdog`) or the event loop (:class:`AsyncHostPool`,
:class:`AsyncWatchdog`).

Why not psycopg-pool: its checkout waits for background workers that retry a refused host until
``pool_timeout`` (logging a warning per attempt), and it cannot tell the caller *why* no
connection came. Here the caller connects in its own thread, so a refused host fails at once with
libpq's reason; the breaker then fails the next calls without trying, until one caller probes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from ..engine.connections import first_line
from ..errors import HostUnreachable
from ..model.dsn import mask
from ..model.topology import Host

log = logging.getLogger("shardctl.router")
# A library must not print on the application's stderr: without this handler, logging's
# "last resort" would print every warning when the application configured no logging.
log.addHandler(logging.NullHandler())

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
LATENCY_SAMPLES = 2048


class Slot:
    """One pooled connection, and when its prepared statements were last dropped."""

    __slots__ = ("conn", "created", "plan_epoch")

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.plan_epoch = 0  # HostPool.plan_epoch when its prepared statements were last dropped
        self.created = time.monotonic()

    def healthy(self) -> bool:
        """Usable without a round trip: open, idle, and nothing unread on the socket.

        An idle connection receives nothing; a readable socket means the server closed it (a restart
        sends the FATAL ``57P01`` then EOF) or something unexpected arrived: either way, drop it.
        """
        conn = self.conn
        if conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            return False
        if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        try:
            # not select(): file descriptors above 1023 are common in big apps
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError, psycopg.Error):
            return False

    def close(self) -> None:
        try:
            if isinstance(self.conn, psycopg.AsyncConnection):
                self.conn.pgconn.finish()  # what its close() does, without awaiting (nothing to wait for)
            else:
                self.conn.close()
        except Exception:  # noqa: BLE001, S110 - closing a broken connection may fail; it is gone either way
            pass


class Breaker:
    """Per-host circuit breaker: after a failure, calls fail at once until a probe may run.

    ``open``: calls fail fast until ``retry_at``; then the first caller becomes the probe
    (``half-open``) and connects itself while the others keep failing fast. Its success closes the
    breaker; its failure opens it again with a doubled back-off (``base`` up to ``cap`` seconds).
    """

    def __init__(self, name: str, base: float = 0.25, cap: float = 5.0):
        self.name = name
        self.base, self.cap = base, cap
        self.state = CLOSED
        self.cause = ""
        self.since = time.time()
        self.retry_at = 0.0
        self.failures = 0  # consecutive failures
        self.opened = 0  # times it opened
        self._lock = threading.Lock()

    def enter(self) -> bool:
        """Before a call: True if this caller is the probe; raises HostUnreachable while open."""
        if self.state == CLOSED:
            return False
        with self._lock:
            if self.state == CLOSED:
                return False
            now = time.monotonic()
            if self.state == OPEN and now >= self.retry_at:
                self.state = HALF_OPEN
                return True
            wait = (
                "a probe is under way"
                if self.state == HALF_OPEN
                else f"next probe in {max(0.0, self.retry_at - now):.1f}s"
            )
        raise HostUnreachable(self.name, f"{self.cause} (circuit open, {wait})")

    def success(self) -> None:
        if self.state == CLOSED:
            return
        with self._lock:
            if self.state != CLOSED:
                log.info("host %s: reachable again, circuit closed", self.name)
            self.state, self.failures, self.since = CLOSED, 0, time.time()

    def failure(self, cause: str, *, probe_now: bool = False) -> None:
        """Open the breaker. ``probe_now``: let the next call probe at once (used after a timeout,
        which may have been the call's own slowness rather than the host's)."""
        with self._lock:
            self.failures += 1
            delay = 0.0 if probe_now else min(self.cap, self.base * 2 ** (self.failures - 1))
            if self.state == CLOSED:
                self.opened += 1
                self.since = time.time()
                log.warning("host %s: %s; circuit open", self.name, cause)
            self.state, self.cause, self.retry_at = OPEN, cause, time.monotonic() + delay

    def abandon_probe(self) -> None:
        """The probe ended without a verdict on the host (e.g. the pool was full): let another try."""
        with self._lock:
            if self.state == HALF_OPEN:
                self.state = OPEN

    def snapshot(self) -> dict:
        return {
            "state": self.state,
            "cause": self.cause or None,
            "since": self.since,
            "consecutive_failures": self.failures,
            "times_opened": self.opened,
        }


class PoolBase:
    """What :class:`HostPool` and :class:`AsyncHostPool` share: the idle connections, the size, the
    breaker, the counters; the waiting for a connection is each one's own (``_new_guard``, ``_wake``).
    ``connect()`` opens a connection (the asyncio pool awaits what it returns)."""

    def __init__(
        self,
        name: str,
        role: str,
        connect: Callable[[], Any],
        max_size: int,
        pool_timeout: float,
    ):
        self.name, self.role = name, role
        self._connect = connect
        self.max_size = max_size
        self.pool_timeout = pool_timeout
        self.breaker = Breaker(name if role == "primary" else f"{name} (standby)")
        self.closed = False
        self._idle: deque[Slot] = deque()
        self._size = 0
        self._waiting = 0
        self._guard = self._new_guard()  # the lock of the fields above
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.counts: Counter[str] = Counter()  # calls, connects, replaced_idle, errors by kind
        self.lag: tuple[float, float] | None = None  # standby: (checked at, seconds behind)
        self.plan_epoch = 0  # bumped when a migration made a prepared statement stale (0A000)

    def _new_guard(self) -> Any:
        """The lock of the pool's fields, and what its waiters wait on."""
        raise NotImplementedError

    def _wake(self, n: int = 1) -> None:
        """Let ``n`` waiters look again (called holding the guard)."""
        raise NotImplementedError

    def _take_idle(self) -> Slot | None:
        stale = []
        with self._guard:
            slot = None
            while self._idle:
                # most recently used first: warm caches, fewer backends
                candidate = self._idle.pop()
                if candidate.healthy():
                    slot = candidate
                    break
                stale.append(candidate)
                self._size -= 1
            if stale:
                self.counts["replaced_idle"] += len(stale)
                log.info(
                    "host %s: replaced %d dead idle connection(s)", self.breaker.name, len(stale)
                )
                self._wake(len(stale))
        for old in stale:
            old.close()
        return slot

    def _claim(self, probe: bool, limit: float) -> float | None:
        """Under the guard: None when a place for a new connection is reserved (the caller connects),
        0 when an idle connection came back (take it), else how long to wait. Raises HostUnreachable
        when the pool is closed or no connection came within the limit."""
        if self.closed:
            raise HostUnreachable(self.name, "the router was closed")
        if self._size < self.max_size:
            self._size += 1
            return None
        if not probe and self._idle:
            return 0.0
        left = limit - time.monotonic()
        if left <= 0:
            self.counts["errors.pool_timeout"] += 1
            raise HostUnreachable(
                self.name,
                f"no free connection within {self.pool_timeout:g}s (all {self.max_size} in use)",
            )
        return left

    def _limit(self, deadline: float | None) -> float:
        limit = time.monotonic() + self.pool_timeout
        return limit if deadline is None else min(limit, deadline)

    @contextmanager
    def _checkout(self) -> Iterator[bool]:
        """The breaker's word on a checkout: whether it is the probe (a failed probe is given back);
        HostUnreachable at once while the breaker is open."""
        probe = self.breaker.enter()
        try:
            yield probe
        except BaseException:
            if probe:
                self.breaker.abandon_probe()
            raise

    @contextmanager
    def _new_connection(self) -> Iterator[None]:
        """Around the caller's connection attempt (a place it claimed): if it fails, the place is freed
        and a server's refusal raises HostUnreachable (anything else is raised again)."""
        try:
            yield
        except BaseException as exc:
            with self._guard:
                self._size -= 1
                self._wake()
            if isinstance(exc, psycopg.Error):
                cause = first_line(exc)
                self.count("errors.connect")
                self.breaker.failure(cause)
                raise HostUnreachable(self.breaker.name, cause) from None
            raise

    def _opened(self, conn: object) -> Slot:
        self.count("connects")
        self.breaker.success()
        slot = Slot(conn)  # type: ignore[arg-type]
        slot.plan_epoch = self.plan_epoch
        return slot

    def _reusable(self, slot: Slot, discard: bool) -> bool:
        conn = slot.conn
        return (
            not discard
            and not self.closed
            and not conn.closed
            and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )

    def release(self, slot: Slot, *, discard: bool = False) -> None:
        """Back to the pool, or closed when ``discard``, broken, or the pool is closed."""
        keep = self._reusable(slot, discard)
        with self._guard:
            if keep:
                self._idle.append(slot)
            else:
                self._size -= 1
            self._wake()
        if not keep:
            slot.close()

    def drop_idle(self) -> None:
        """Close every idle connection (after the host stopped answering: they would hang too)."""
        with self._guard:
            idle, self._idle = list(self._idle), deque()
            self._size -= len(idle)
            self._wake(len(idle) or 1)
        for slot in idle:
            slot.close()

    def close(self) -> None:
        with self._guard:
            self.closed = True
        self.drop_idle()

    # ---- observability -----------------------------------------------------------------------
    def count(self, what: str) -> None:
        with self._guard:
            self.counts[what] += 1

    def record(self, seconds: float, error: str | None = None) -> None:
        with self._guard:
            self.latencies.append(seconds)
            self.counts["calls"] += 1
            if error:
                self.counts[f"errors.{error}"] += 1

    def end_call(
        self, slot: Slot, watch: Any, started: float, *, error: str | None, keep: bool
    ) -> None:
        """A call ends: its deadline disarmed, its connection back (or discarded), its latency and
        error kind counted."""
        if watch is not None and watch.disarm():
            keep = False  # the deadline fired just as the call ended: the socket is cut
        self.release(slot, discard=not keep)
        self.record(time.perf_counter() - started, error)

    def stats(self) -> dict:
        with self._guard:
            size, idle, waiting = self._size, len(self._idle), self._waiting
        lat = sorted(self.latencies)
        errors = {k.split(".", 1)[1]: v for k, v in self.counts.items() if k.startswith("errors.")}
        fallbacks = {
            k.split(".", 1)[1]: v for k, v in self.counts.items() if k.startswith("fallbacks.")
        }
        doc = {
            "role": self.role,
            "size": size,
            "in_use": size - idle,
            "idle": idle,
            "max_size": self.max_size,
            "waiting": waiting,
            "calls": self.counts["calls"],
            "connects": self.counts["connects"],
            "replaced_idle": self.counts["replaced_idle"],
            "errors": errors,
            "errors_total": sum(errors.values()),
            "breaker": self.breaker.snapshot(),
            "latency_ms": _percentiles(lat),
        }
        if self.role == "standby":
            doc["lag_s"] = None if self.lag is None else round(self.lag[1], 3)
            doc["fallbacks"] = fallbacks  # reads sent to the primary instead: lagging / unreachable
        return doc


class HostPool(PoolBase):
    """Connections to one server (a host's primary or its standby), opened on demand in the caller's thread."""

    def _new_guard(self) -> threading.Condition:
        self._cond = threading.Condition(threading.Lock())
        return self._cond

    def _wake(self, n: int = 1) -> None:
        self._cond.notify(n)

    # ---- checkout ----------------------------------------------------------------------------
    def acquire(self, deadline: float | None = None) -> Slot:
        """A healthy connection: an idle one, else a new one (the caller connects), else wait for one.

        Raises HostUnreachable at once while the breaker is open, or with the connection error.
        """
        with self._checkout() as probe:
            slot = None if probe else self._take_idle()
            return self._new_or_wait(deadline, probe) if slot is None else slot

    def _new_or_wait(self, deadline: float | None, probe: bool) -> Slot:
        limit = self._limit(deadline)
        while True:
            with self._cond:
                wait = self._claim(probe, limit)
                if wait is None:
                    break
                if wait > 0:
                    self._waiting += 1
                    self._cond.wait(wait)
                    self._waiting -= 1
            if not probe:
                slot = self._take_idle()
                if slot is not None:
                    return slot
        with self._new_connection():
            conn = self._connect()
        return self._opened(conn)


class AsyncHostPool(PoolBase):
    """:class:`HostPool` for asyncio: the caller's task connects; waiters wait on
    futures of the loop, in turn: a connection given back goes straight to the first waiter."""

    def _new_guard(self) -> threading.Lock:
        # waiting: (future, a probe's: it connects itself)
        self._waiters: deque[tuple[asyncio.Future, bool]] = deque()
        return threading.Lock()

    def _wake(self, n: int = 1) -> None:
        """Let ``n`` waiters look again (a place for a new connection freed)."""
        for waiter, _ in list(self._waiters):
            if n <= 0:
                break
            if not waiter.done():
                waiter.set_result(None)
                n -= 1

    def release(self, slot: Slot, *, discard: bool = False) -> None:
        """``HostPool.release``; a reusable connection goes to the first waiter (not a probe) if any."""
        if self._reusable(slot, discard):
            with self._guard:
                for waiter, probe in self._waiters:
                    if not probe and not waiter.done():
                        waiter.set_result(slot)
                        return
        super().release(slot, discard=discard)

    async def acquire(self, deadline: float | None = None) -> Slot:
        """A healthy connection: an idle one, else a new one, else wait for one (HostPool.acquire)."""
        with self._checkout() as probe:
            slot = None if probe or self._waiters else self._take_idle()  # waiters first
            return await self._new_or_wait(deadline, probe) if slot is None else slot

    def _claim_now(self, probe: bool, limit: float) -> float | None:
        with self._guard:
            return self._claim(probe, limit)

    async def _new_or_wait(self, deadline: float | None, probe: bool) -> Slot:
        limit = self._limit(deadline)
        # Until a place for a new connection is claimed: wait for a connection given back (the
        # waiter is handed it), or take an idle one. (HostPool claims and waits under one lock hold.)
        while (wait := self._claim_now(probe, limit)) is not None:
            if wait > 0 and (slot := await self._wait(wait, probe)) is not None:
                return slot
            if not probe and (slot := self._take_idle()) is not None:
                return slot
        with self._new_connection():
            conn = await self._connect()
        return self._opened(conn)

    async def _wait(self, seconds: float, probe: bool) -> Slot | None:
        """Wait in turn, at most ``seconds``: a connection handed over, or None (look again)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        with self._guard:
            self._waiters.append((waiter, probe))
            self._waiting += 1
        timer = loop.call_later(seconds, lambda: waiter.done() or waiter.set_result(None))
        try:
            await waiter
        except BaseException:  # cancelled: a connection handed over meanwhile goes to the next one
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                self.release(waiter.result())
            raise
        finally:
            timer.cancel()
            with self._guard:
                self._waiting -= 1
                self._waiters.remove((waiter, probe))
                if not waiter.done():
                    waiter.cancel()
        return waiter.result() if waiter.done() and not waiter.cancelled() else None


def _percentiles(sorted_seconds: list[float]) -> dict:
    if not sorted_seconds:
        return {"samples": 0, "p50": None, "p90": None, "p99": None, "max": None}
    n = len(sorted_seconds)

    def at(q: float) -> float:
        return round(sorted_seconds[min(n - 1, int(q * n))] * 1000, 3)

    return {
        "samples": n,
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": round(sorted_seconds[-1] * 1000, 3),
    }


class Watchdog:
    """Cuts the socket of a call that outlives its deadline (a frozen server or a silent network
    answers nothing, and no server-side timeout can fire there). One thread per Router, started on
    first use; arming and disarming a call is a dict operation."""

    def __init__(self, tick: float = 0.05):
        self.tick = tick
        self._armed: dict[int, tuple[float, psycopg.Connection]] = {}
        self._fired: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, conn: psycopg.Connection, deadline: float) -> Armed:
        """Watch ``conn`` until ``deadline`` (``time.monotonic()``)."""
        key = id(conn)
        with self._lock:
            self._armed[key] = (deadline, conn)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="shardctl-router-watchdog", daemon=True
                )
                self._thread.start()
        return Armed(self, key)

    def disarm(self, key: int) -> bool:
        """Stop watching; True if the deadline had already fired (the connection is cut)."""
        with self._lock:
            self._armed.pop(key, None)
            if key in self._fired:
                self._fired.discard(key)
                return True
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            with self._lock:
                for key, (deadline, conn) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        self._fired.add(key)
                        _cut(conn)

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(timeout=1)


class Armed:
    """One call watched by a :class:`Watchdog`."""

    __slots__ = ("_key", "_watchdog")

    def __init__(self, watchdog: Watchdog, key: int):
        self._watchdog, self._key = watchdog, key

    def disarm(self) -> bool:
        """Stop watching; True if the deadline had already fired (the connection is cut)."""
        return self._watchdog.disarm(self._key)


class AsyncWatchdog:
    """:class:`Watchdog` for asyncio: each call's deadline is a timer of the running loop."""

    def arm(self, conn: psycopg.AsyncConnection, deadline: float) -> LoopDeadline:
        return LoopDeadline(conn, deadline)

    def stop(self) -> None:
        """Nothing runs between calls (each timer ends with its call)."""


class LoopDeadline:
    """A call's client deadline: a timer of the loop that cuts the connection's socket (the statement
    awaiting it gets EOF at once, even from a frozen server)."""

    __slots__ = ("fired", "handle")

    def __init__(self, conn: psycopg.AsyncConnection, deadline: float):
        self.fired = False
        self.handle = asyncio.get_running_loop().call_later(
            max(0.0, deadline - time.monotonic()), self._fire, conn
        )

    def _fire(self, conn: psycopg.AsyncConnection) -> None:
        self.fired = True
        _cut(conn)  # type: ignore[arg-type]

    def disarm(self) -> bool:
        """Stop the timer; True if it had fired (the connection is cut)."""
        self.handle.cancel()
        return self.fired


def _cut(conn: psycopg.Connection) -> None:
    """Shut the connection's socket down: the thread blocked reading it gets EOF at once."""
    try:
        dup = os.dup(conn.fileno())
    except (OSError, psycopg.Error):
        return
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def foreign_connect_error(host: Host, exc: BaseException) -> psycopg.OperationalError:
    """A failed connection to a host known only from a redirect, saying why there was no password."""
    return psycopg.OperationalError(
        f"{first_line(exc)} (host {host.name} is not in this Router's topology file: a shard moved there and the "
        f"Router connected with the DSN the old host recorded, {mask(host.dsn)}, without a password; add "
        f"{host.name} to this app server's topology file)"
    )
