"""The library API applications use: route a key to its shard and get a connection there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..engine.connections import first_line
from ..errors import BadInput, HostUnreachable, SessionStateError
from ..model.keywords import Unpack
from ..model.topology import Host, Topology
from ..sql.catalog.control import MOVED_SQLSTATE, SHARD_STATE_SQL, read_redirects
from ..sql.catalog.replication import STANDBY_LAG_SQL as _LAG_SQL
from .placement import MOVED_ERRORS, SAME, Key, RouterOptions, Routing
from .pool import HostPool, PoolBase, Slot, Watchdog, log
from .session import (
    Call,
    RouterClientCursor,
    RouterConnection,
    RouterCursor,
    RouterServerCursor,
    forget_prepared,
    quietly,
    reset,
    stale_plan,
)

if TYPE_CHECKING:
    from .placement import BlockTarget, CallTarget, ReadTarget

T = TypeVar("T")


class Router(Routing):
    """Routes keys to shards and hands out pooled connections with ``search_path`` set to the shard.

    Per host, a pool of connections opened on demand by the caller's thread, a circuit breaker
    (a refused host fails at once with libpq's reason, not after a pool wait) and, when the host
    has a ``standby:``, a second pool for :meth:`read` and ``connection(readonly=True)``.
    Every call is bounded by ``timeout`` seconds: ``statement_timeout`` on the server, and a
    client deadline (``timeout`` + ``grace``) that cuts the socket of a host that stopped answering.
    :meth:`stats` reports pools, errors, breakers and latencies. See docs/router.md.

    A call names its shard by ``key``, or by one of the keywords of
    :class:`~shardctl.router_placement.Target` (``id=``, ``shard=``); its other keywords
    (``timeout=``, ``max_lag=``, ``readonly=``) are typed beside it (``CallTarget`` and its kin).

    Shards move between hosts (``shardctl move-shard``). :meth:`run` and :meth:`execute` follow a
    move: when a statement fails because its shard has just moved away (the old tables are
    guarded and their schema renamed), they reload the topology file and retry once on the
    shard's new host. When the file does not change (another app server's copy that nobody
    updated), they read the redirect the old host recorded at the cutover (``shardctl.redirects``)
    and route the shard to the host it names, with this Router's own entry for that host (its DSN
    and ``password_env``), until the file catches up. :meth:`connection` cannot retry a ``with``
    block: its callers see that error and can call :meth:`follow_move` (True: try again).
    """

    def __init__(
        self,
        topology: Topology,
        options: RouterOptions | None = None,
        **settings: Any,
    ):
        """``options``, or its fields as keyword arguments (:class:`RouterOptions`)."""
        super().__init__(topology, options or RouterOptions(**settings))
        self._tried = threading.local()  # the host this thread's last shard_connection() went to
        self._watchdog = Watchdog()

    # ---- calls (routing: see Routing) --------------------------------------------
    @contextmanager
    def connection(
        self,
        key: Key = None,
        **where: Unpack[BlockTarget],
    ) -> Iterator[psycopg.Connection]:
        """A pooled connection to the shard's host for a block: by ``key``, by ``id`` or by ``shard``.

        Each transaction in the block runs on the shard (``search_path``) with the call's
        ``statement_timeout``, both set for that transaction only; the block's open transaction commits
        at its end (rolls back on error), and a ``commit()`` inside starts the next one on the same
        shard. ``readonly``: the host's standby when it is within ``max_lag`` seconds, else the primary
        (in a read-only transaction). The block must end within ``timeout`` seconds.
        """
        number, call = self._call("connection", key, where)
        host = self._locate(number)
        self._tried.host = host
        with self._on_host(host, number, call) as conn:
            yield conn

    @contextmanager
    def lend(self, host: Host | str, *, timeout: float | None = SAME) -> Iterator[RouterConnection]:
        """A pooled connection to ``host``'s primary, lent to an ORM session (shardctl.sqlalchemy) that sets each
        transaction's shard (``conn.begin = transaction_start(...)``); reset only if needed, never prepared."""
        host = self.topology.host(host) if isinstance(host, str) else host
        with _session(
            self, self._pool(host), Call("public", self._timeout(timeout), "lend")
        ) as conn:
            conn.cursor_factory = RouterClientCursor  # the BEGIN rides with the first statement
            try:
                yield conn
            finally:
                conn.cursor_factory = RouterCursor

    def shard_connection(self, shard: int, **kwargs: Any) -> Any:
        """``connection(shard=...)``."""
        return self.connection(shard=shard, **kwargs)

    def run(
        self,
        key: Key = None,
        work: Callable[[psycopg.Connection], T] | None = None,
        **where: Unpack[CallTarget],
    ) -> T:
        """Call ``work(conn)`` in one transaction on the shard of ``key``, ``id`` or ``shard``; if the shard
        moved meanwhile, reload the topology and call it once more on the new host.

        ``work`` may run twice (also after a migration changed a table under a prepared statement),
        but its first run was rolled back entirely: it must only use ``conn``.
        """
        if work is None:
            raise BadInput("run() needs the work to call: run(key, work) or run(work=..., id=...)")
        number, call = self._call("run", key, where)

        def attempt(host: Host) -> T:
            with self._on_host(host, number, call) as conn:
                return work(conn)

        return self._retrying(number, attempt)

    def run_shard(
        self, shard: int, work: Callable[[psycopg.Connection], T], *, timeout: float | None = SAME
    ) -> T:
        """``run(work=..., shard=...)``."""
        return self.run(work=work, shard=shard, timeout=timeout)

    def execute(
        self, key: Key = None, query: Any = None, params: Any = None, **where: Unpack[CallTarget]
    ) -> Any:
        """One statement on the shard of ``key``, ``id`` or ``shard``, in a transaction of its own (one
        round trip), following a move like :meth:`run`: the rows it returns, or the number of rows it
        changed."""
        return self._statement(query, params, *self._call("execute", key, where))

    def read(
        self, key: Key = None, query: Any = None, params: Any = None, **where: Unpack[ReadTarget]
    ) -> Any:
        """:meth:`execute` for reads, on the host's standby when it is at most ``max_lag`` seconds behind
        (else, or when the standby is down, on the primary, in a read-only transaction)."""
        number, call = self._call("read", key, where)
        return self._statement(query, params, number, call)

    def _statement(self, query: Any, params: Any, shard: int, call: Call) -> Any:
        if query is None:
            raise BadInput("execute()/read() need the statement to run")

        def attempt(host: Host) -> Any:
            with self._on_host(host, shard, call) as conn:
                return conn.run_statement(query, params)

        return self._retrying(shard, attempt)

    def _retrying(self, shard: int, attempt: Callable[[Host], T]) -> T:
        """``attempt(host)``; again after a stale cached plan (0A000 after a migration) or a move."""
        replanned = moved = False
        while True:
            host = self._locate(shard)
            self._tried.host = host
            try:
                return attempt(host)
            except psycopg.Error as exc:
                if not replanned and stale_plan(exc):
                    replanned = True
                    continue
                if not moved and self.follow_move(shard, exc, host):
                    moved = True
                    continue
                raise

    @contextmanager
    def _on_host(self, host: Host, shard: int, call: Call) -> Iterator[RouterConnection]:
        """A session on the host's standby (a read with a lag bound, when the host has a standby that is
        fresh enough and answers) or else on its primary."""
        if call.readonly and host.standby and call.max_lag is not None:
            standby = self._pool(host, standby=True)
            try:
                with _session(self, standby, call) as conn:
                    yield conn
                    return
            except _Fallback as why:
                standby.count(f"fallbacks.{why.args[0]}")
        primary = Call(call.schema, call.timeout, call.kind, call.readonly)
        with _session(self, self._pool(host), primary) as conn:
            yield conn

    # ---- moves -----------------------------------------------------------------
    def follow_move(self, shard: int, exc: BaseException, tried: Host | None = None) -> bool:
        """After ``exc`` on ``shard``: True when the shard turned out to have moved and its new host is
        known (see :meth:`Placement.follow`). ``tried`` is the host the failed statement ran on (default:
        this thread's last connection's)."""
        if getattr(exc, "sqlstate", None) not in MOVED_ERRORS:
            return False
        old = tried or getattr(self._tried, "host", None) or self._locate(shard)
        return self.placement.follow(
            shard,
            old,
            getattr(exc, "sqlstate", None) == MOVED_SQLSTATE,
            reload=self.reload,
            ask=lambda: _ask_old_host(self, old, shard),
        )

    # ---- pools (Routing._pool) ---------------------------------------------------
    def _connect(self, host: Host, standby: bool) -> RouterConnection:
        """A new autocommit connection with the Router's bounds (:meth:`Routing._connecting`)."""
        with self._connecting(host, standby) as kwargs:
            conn = RouterConnection.connect(autocommit=True, cursor_factory=RouterCursor, **kwargs)
        return self._pooled(conn, host, RouterServerCursor)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        self._watchdog.stop()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Fallback(Exception):
    """The standby cannot serve this read (args[0]: ``lagging`` or ``unreachable``): use the primary."""


def _ask_old_host(router: Router, host: Host, shard: int) -> tuple[dict | None, bool]:
    """What the host a statement failed on says of ``shard``: its redirect (where the shard went, or
    None) and whether it records the shard ``moved_out``. No answer: (None, False)."""
    try:
        with _session(
            router, router._pool(host), Call("public", router.options.timeout, "run")
        ) as conn:
            redirect = read_redirects(conn, [shard]).get(shard)
            row = conn.execute(SHARD_STATE_SQL, (shard,)).fetchone()
    except Exception:  # noqa: BLE001 - no answer means no evidence of a move
        return None, False
    return redirect, bool(row) and row[0] == "moved_out"


@contextmanager
def _session(router: Router, pool: HostPool, call: Call) -> Iterator[RouterConnection]:
    """One call on ``pool``: checkout, the caller's work (each transaction opened with the call's
    settings, see router_session), the reset where the server keeps sessions, checkin.

    Errors: a cut (deadline) or broken connection becomes HostUnreachable; SQL errors pass through.
    """
    started = time.perf_counter()
    deadline = call.deadline(router.options.grace)
    try:
        slot = pool.acquire(deadline)
    except HostUnreachable:
        _unreachable(pool, started, call)
        raise
    conn: RouterConnection = slot.conn  # type: ignore[assignment]
    watch = router._watchdog.arm(conn, deadline) if deadline is not None else None
    keeps = conn.keeps_sessions
    try:
        if keeps and slot.plan_epoch != pool.plan_epoch:
            forget_prepared(conn, pool.plan_epoch)
            slot.plan_epoch = pool.plan_epoch
        if call.max_lag is not None and _lag(router, pool, conn) > call.max_lag:
            _finish(router, pool, slot, watch, started, error=None, keep=True)
            raise _Fallback("lagging")
        call.ready(conn, keeps)
        try:
            yield conn
        except BaseException:
            quietly(conn.rollback)
            raise
        if keeps and (conn.session_dirty or not call.tracked):
            conn.begin = None
            reset(conn, commit=True)  # COMMIT and the reset in one round trip
        elif conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.commit()
    except _Fallback:
        raise
    except BaseException as exc:
        conn.begin = None
        fired = watch is not None and router._watchdog.disarm(watch)
        watch = None
        error, mapped = _failure(pool, slot, exc, fired, call.timeout, router.options.grace)
        keep = call.keeps_after(error, conn, keeps)
        if keep is None:
            keep = quietly(reset, conn)
        _finish(router, pool, slot, None, started, error=error, keep=keep)
        if mapped is not exc:
            raise mapped from None
        raise
    conn.begin = None
    _finish(router, pool, slot, watch, started, error=None, keep=True)


def _unreachable(pool: PoolBase, started: float, call: Call) -> None:
    """Count a call whose host is unreachable; a standby read falls back to the primary."""
    pool.record(time.perf_counter() - started, "unreachable")
    if call.max_lag is not None:
        raise _Fallback("unreachable") from None


def _finish(
    router: Router,
    pool: HostPool,
    slot: Slot,
    watch: int | None,
    started: float,
    *,
    error: str | None,
    keep: bool,
) -> None:
    if watch is not None and router._watchdog.disarm(watch):
        keep = False  # the deadline fired just as the call ended: the socket is cut
    pool.release(slot, discard=not keep)
    pool.record(time.perf_counter() - started, error)


def _lag(router: Router, pool: HostPool, conn: psycopg.Connection) -> float:
    now = time.monotonic()
    if pool.lag is None or now - pool.lag[0] > router.options.lag_check_interval:
        pool.lag = (now, float(psycopg.Cursor(conn).execute(_LAG_SQL).fetchone()[0]))
    return pool.lag[1]


def _failure(
    pool: HostPool, slot: Slot, exc: BaseException, fired: bool, timeout: float | None, grace: float
) -> tuple[str, BaseException]:
    """The stats kind of an error, and what the caller sees."""
    if fired:
        cause = f"no answer within {timeout + grace:g}s (timeout {timeout:g}s)"
        pool.breaker.failure(cause, probe_now=True)
        pool.drop_idle()
        return "timeout", HostUnreachable(pool.breaker.name, cause)
    conn = slot.conn
    if isinstance(exc, psycopg.OperationalError) and (
        conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK
    ):
        log.info("host %s: connection lost: %s", pool.breaker.name, first_line(exc))
        return "connection_lost", HostUnreachable(pool.breaker.name, first_line(exc))
    if stale_plan(exc):
        # every pooled connection drops its prepared statements before its next use
        pool.plan_epoch += 1
        return "stale_plan", exc
    if isinstance(exc, SessionStateError):
        return "session_state", exc
    if isinstance(exc, psycopg.Error):
        return "sql", exc
    return ("other" if isinstance(exc, Exception) else "interrupted"), exc
