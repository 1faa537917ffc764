"""The Router for asyncio applications: :class:`AsyncRouter`, on psycopg's ``AsyncConnection``.

The same guarantees as :class:`~shardctl.router.Router`, by the same mechanisms: the session protocol
of router_session (each transaction opens with the shard's settings for that transaction only; one
round trip per ``execute()``; session-state statements refused behind a transaction pooler; the reset
only where ``hosts[].pooler`` says sessions are kept), the placement (topology file and redirects) of
router_placement, the pools' bookkeeping and :class:`~shardctl.router_pool.Breaker` of router_pool and
the Router's error mapping. What differs is only the waiting: connections are opened, awaited and
handed over by the event loop, and a call's client deadline is a timer of the loop that cuts the
connection's socket (the awaiting statement gets EOF at once, whatever the server does).

One AsyncRouter belongs to one event loop (its pools hold that loop's connections).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..errors import BadInput, HostUnreachable
from ..model.keywords import Unpack
from ..model.topology import Host, Topology
from ..sql import session as session_sql
from ..sql.catalog.control import (
    HAS_REDIRECTS_SQL,
    MOVED_SQLSTATE,
    REDIRECTS_SQL,
    redirects_by_shard,
)
from ._sync import _LAG_SQL, SHARD_STATE_SQL, _failure, _Fallback, _unreachable
from .placement import FOLLOW_POLL, MOVED_ERRORS, SAME, Key, RouterOptions, Routing
from .pool import PoolBase, Slot, _cut
from .session import (
    Call,
    check_server_cursor,
    check_statement,
    deallocate_text,
    forget_prepared_text,
    opened_statement,
    opening,
    outer_block,
    reset_text,
    skip_opening,
    stale_plan,
    statement_text,
)

if TYPE_CHECKING:
    from .placement import BlockTarget, CallTarget, ReadTarget

T = TypeVar("T")


class AsyncRouterConnection(psycopg.AsyncConnection):
    """:class:`~shardctl.router_session.RouterConnection` for asyncio: autocommit at rest; during a call,
    its cursors open each transaction with the call's settings."""

    begin: tuple[bytes, bytes] | None = None
    session_dirty = False
    keeps_sessions = True
    one_transaction = False

    async def begin_if_idle(self) -> None:
        """Open the call's transaction (BEGIN and the shard's settings) unless one is open."""
        texts = opening(self)
        if texts:
            plain = psycopg.AsyncCursor(self)
            for text in texts:
                await plain.execute(text, prepare=False)

    @asynccontextmanager
    async def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> AsyncIterator[psycopg.AsyncTransaction]:
        """psycopg's transaction block; in a call, inside the call's own transaction (see
        ``RouterConnection.transaction``)."""
        block = outer_block(self)
        if block == "psycopg" or block == "savepoint":
            await self.begin_if_idle()
            async with super().transaction(savepoint_name, force_rollback) as tx:
                yield tx
            return
        # the outermost block of a call: BEGIN with the settings ... COMMIT
        await self.begin_if_idle()
        try:
            async with super().transaction(savepoint_name, force_rollback) as tx:
                yield tx
        except BaseException:
            await self.rollback()
            raise
        if force_rollback:
            await self.rollback()
        else:
            await self.commit()

    async def run_statement(self, query: Any, params: Any) -> Any:
        """One statement in its own transaction, in one round trip (see ``RouterConnection.run_statement``)."""
        cur = psycopg.AsyncClientCursor(self)
        await cur.execute(statement_text(self, query), params, prepare=False)
        skip_opening(cur)
        return await cur.fetchall() if cur.description is not None else cur.rowcount


class AsyncRouterCursor(psycopg.AsyncCursor):
    """:class:`~shardctl.router_session.RouterCursor` for asyncio."""

    __slots__ = ()

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        await _before(self.connection, query)
        return await super().execute(query, params, **kwargs)

    async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        await _before(self.connection, query)
        return await super().executemany(query, params_seq, **kwargs)

    async def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        await _before(self.connection, query)
        async for record in super().stream(query, params, **kwargs):
            yield record

    @asynccontextmanager
    async def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        await _before(self.connection, statement)
        async with super().copy(statement, params, **kwargs) as copy:
            yield copy


class AsyncRouterClientCursor(AsyncRouterCursor, psycopg.AsyncClientCursor):
    """:class:`~shardctl.router_session.RouterClientCursor` for asyncio (:meth:`AsyncRouter.lend`)."""

    __slots__ = ()

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        check_statement(conn, query)
        text = opened_statement(conn, query, params is not None)
        if text is None:
            await conn.begin_if_idle()
            return await psycopg.AsyncClientCursor.execute(self, query, params, **kwargs)
        await psycopg.AsyncClientCursor.execute(self, text, params, **kwargs)
        skip_opening(self)
        return self


class AsyncRouterServerCursor(psycopg.AsyncServerCursor):
    """:class:`~shardctl.router_session.RouterServerCursor` for asyncio."""

    __slots__ = ()

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        check_server_cursor(conn, self.withhold)
        await conn.begin_if_idle()
        return await super().execute(query, params, **kwargs)


async def _before(conn: Any, query: Any) -> None:
    check_statement(conn, query)
    await conn.begin_if_idle()


async def reset_async(conn: psycopg.AsyncConnection, *, commit: bool = False) -> None:
    """router_session's ``reset`` for asyncio (the same texts)."""
    rollback, text = reset_text(conn, commit)
    plain = psycopg.AsyncCursor(conn)
    if rollback:
        await conn.rollback()
    await plain.execute(text)
    if text.startswith(session_sql.COMMIT):
        plain.nextset()
    for name in (await plain.fetchone())[0]:
        await plain.execute(deallocate_text(name))


async def _quietly(fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
    try:
        await fn(*args)
        return True
    except Exception:  # noqa: BLE001 - the connection is broken: the caller discards it
        return False


class AsyncHostPool(PoolBase):
    """:class:`~shardctl.router_pool.HostPool` for asyncio: the caller's task connects; waiters wait on
    futures of the loop, in turn: a connection given back goes straight to the first waiter."""

    def __init__(
        self,
        name: str,
        role: str,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]],
        max_size: int,
        pool_timeout: float,
    ):
        super().__init__(name, role, connect, max_size, pool_timeout, threading.Lock())
        # (future, a probe's: it connects itself)
        self._waiters: deque[tuple[asyncio.Future, bool]] = deque()

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


_tried: contextvars.ContextVar[Host | None] = contextvars.ContextVar(
    "shardctl_async_router_tried", default=None
)


class AsyncRouter(Routing):
    """:class:`~shardctl.router.Router` for asyncio: the same routing, pools, breakers, timeouts, moves
    and standby reads; its calls are awaited, its work functions are ``async def work(conn)``.

    ``async with router.connection(key) as conn``, ``await router.run(key, work)``,
    ``await router.execute(key, query, params)``, ``await router.read(key, query, params, max_lag=...)``,
    ``router.stats()``, ``await router.close()`` (or ``async with AsyncRouter(topology) as router``).
    """

    pool_class = AsyncHostPool

    def __init__(
        self,
        topology: Topology,
        options: RouterOptions | None = None,
        **settings: Any,
    ):
        """``options``, or its fields as keyword arguments (:class:`RouterOptions`)."""
        super().__init__(topology, options or RouterOptions(**settings))

    # ---- calls -----------------------------------------------------------------
    @asynccontextmanager
    async def connection(
        self,
        key: Key = None,
        **where: Unpack[BlockTarget],
    ) -> AsyncIterator[AsyncRouterConnection]:
        """``Router.connection`` for asyncio: ``async with router.connection(key) as conn``."""
        number, call = self._call("connection", key, where)
        host = self._locate(number)
        _tried.set(host)
        async with self._on_host(host, call) as conn:
            yield conn

    @asynccontextmanager
    async def lend(
        self, host: Host | str, *, timeout: float | None = SAME
    ) -> AsyncIterator[AsyncRouterConnection]:
        """``Router.lend`` for asyncio: a pooled connection to ``host``'s primary, lent to an ORM session
        (shardctl.sqlalchemy's async sessions) that sets each transaction's shard (``conn.begin``)."""
        host = self.topology.host(host) if isinstance(host, str) else host
        async with _session(
            self, self._pool(host), Call("public", self._timeout(timeout), "lend")
        ) as conn:
            # the BEGIN rides with the first statement
            conn.cursor_factory = AsyncRouterClientCursor
            try:
                yield conn
            finally:
                conn.cursor_factory = AsyncRouterCursor

    async def run(
        self,
        key: Key = None,
        work: Callable[[AsyncRouterConnection], Awaitable[T]] | None = None,
        **where: Unpack[CallTarget],
    ) -> T:
        """``await work(conn)`` in one transaction on the shard; once more on the new host if the shard
        moved meanwhile (``Router.run``: ``work`` may run twice and must only use ``conn``)."""
        if work is None:
            raise BadInput("run() needs the work to call: run(key, work) or run(work=..., id=...)")
        number, call = self._call("run", key, where)

        async def attempt(host: Host) -> T:
            async with self._on_host(host, call) as conn:
                return await work(conn)

        return await self._retrying(number, attempt)

    async def execute(
        self, key: Key = None, query: Any = None, params: Any = None, **where: Unpack[CallTarget]
    ) -> Any:
        """One statement in a transaction of its own (one round trip), following a move (``Router.execute``)."""
        return await self._statement(query, params, *self._call("execute", key, where))

    async def read(
        self, key: Key = None, query: Any = None, params: Any = None, **where: Unpack[ReadTarget]
    ) -> Any:
        """:meth:`execute` for reads, on the host's standby within ``max_lag`` seconds (``Router.read``)."""
        number, call = self._call("read", key, where)
        return await self._statement(query, params, number, call)

    async def _statement(self, query: Any, params: Any, shard: int, call: Call) -> Any:
        if query is None:
            raise BadInput("execute()/read() need the statement to run")

        async def attempt(host: Host) -> Any:
            async with self._on_host(host, call) as conn:
                return await conn.run_statement(query, params)

        return await self._retrying(shard, attempt)

    async def _retrying(self, shard: int, attempt: Callable[[Host], Awaitable[T]]) -> T:
        """``Router._retrying``: again after a stale cached plan or a move."""
        replanned = moved = False
        while True:
            host = self._locate(shard)
            _tried.set(host)
            try:
                return await attempt(host)
            except psycopg.Error as exc:
                if not replanned and stale_plan(exc):
                    replanned = True
                    continue
                if not moved and await self.follow_move(shard, exc, host):
                    moved = True
                    continue
                raise

    @asynccontextmanager
    async def _on_host(self, host: Host, call: Call) -> AsyncIterator[AsyncRouterConnection]:
        """The host's standby for a read with a lag bound (fresh enough and answering), else its primary."""
        if call.readonly and host.standby and call.max_lag is not None:
            standby = self._pool(host, standby=True)
            try:
                async with _session(self, standby, call) as conn:
                    yield conn
                    return
            except _Fallback as why:
                standby.count(f"fallbacks.{why.args[0]}")
        primary = Call(call.schema, call.timeout, call.kind, call.readonly)
        async with _session(self, self._pool(host), primary) as conn:
            yield conn

    # ---- moves -----------------------------------------------------------------
    async def follow_move(self, shard: int, exc: BaseException, tried: Host | None = None) -> bool:
        """``Router.follow_move``: True when the shard moved and its new host is known."""
        if getattr(exc, "sqlstate", None) not in MOVED_ERRORS:
            return False
        old = tried or _tried.get() or self._locate(shard)
        steps = self.placement.following(
            shard, old, getattr(exc, "sqlstate", None) == MOVED_SQLSTATE
        )
        answer: object = None
        try:
            while True:
                step = steps.send(answer)
                if step == "reload":
                    answer = self.reload()
                elif step == "ask":
                    answer = await _ask_old_host(self, old, shard)
                else:
                    answer = await asyncio.sleep(FOLLOW_POLL)
        except StopIteration as done:
            return bool(done.value)

    # ---- pools -----------------------------------------------------------------
    async def _connect(self, host: Host, standby: bool) -> AsyncRouterConnection:
        """``Router._connect`` for asyncio: the same connection settings."""
        with self._connecting(host, standby) as kwargs:
            conn = await AsyncRouterConnection.connect(
                autocommit=True, cursor_factory=AsyncRouterCursor, **kwargs
            )
        return self._pooled(conn, host, AsyncRouterServerCursor)

    async def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    async def __aenter__(self) -> AsyncRouter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _ask_old_host(router: AsyncRouter, host: Host, shard: int) -> tuple[dict | None, bool]:
    """``router._ask_old_host`` for asyncio: the old host's redirect for ``shard`` and whether it records
    the shard moved out (no answer: (None, False))."""
    try:
        async with _session(
            router, router._pool(host), Call("public", router.options.timeout, "run")
        ) as conn:
            redirect = None
            if (await (await conn.execute(HAS_REDIRECTS_SQL)).fetchone())[0]:
                rows = await (await conn.execute(REDIRECTS_SQL, ([shard],))).fetchall()
                redirect = redirects_by_shard(rows).get(shard)
            row = await (await conn.execute(SHARD_STATE_SQL, (shard,))).fetchone()
    except Exception:  # noqa: BLE001 - no answer means no evidence of a move
        return None, False
    return redirect, bool(row) and row[0] == "moved_out"


class _Deadline:
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


@asynccontextmanager
async def _session(
    router: AsyncRouter, pool: AsyncHostPool, call: Call
) -> AsyncIterator[AsyncRouterConnection]:
    """``router._session`` for asyncio: checkout, the caller's work, the reset where the server keeps
    sessions, checkin; a cut (deadline) or broken connection becomes HostUnreachable."""
    started = time.perf_counter()
    deadline = call.deadline(router.options.grace)
    try:
        slot = await pool.acquire(deadline)
    except HostUnreachable:
        _unreachable(pool, started, call)
        raise
    conn: AsyncRouterConnection = slot.conn  # type: ignore[assignment]
    watch = _Deadline(conn, deadline) if deadline is not None else None
    keeps = conn.keeps_sessions
    try:
        if keeps and slot.plan_epoch != pool.plan_epoch:
            await psycopg.AsyncCursor(conn).execute(forget_prepared_text(pool.plan_epoch))
            slot.plan_epoch = pool.plan_epoch
        if call.max_lag is not None and await _lag(router, pool, conn) > call.max_lag:
            _finish(pool, slot, watch, started, error=None, keep=True)
            raise _Fallback("lagging")
        call.ready(conn, keeps)
        try:
            yield conn
        except BaseException:
            await _quietly(conn.rollback)
            raise
        if keeps and (conn.session_dirty or not call.tracked):
            conn.begin = None
            await reset_async(conn, commit=True)  # COMMIT and the reset in one round trip
        elif conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.commit()
    except _Fallback:
        raise
    except BaseException as exc:
        conn.begin = None
        fired = watch is not None and watch.disarm()
        watch = None
        error, mapped = _failure(pool, slot, exc, fired, call.timeout, router.options.grace)  # type: ignore[arg-type]
        keep = call.keeps_after(error, conn, keeps)
        if keep is None:
            keep = await _quietly(reset_async, conn)
        _finish(pool, slot, None, started, error=error, keep=keep)
        if mapped is not exc:
            raise mapped from None
        raise
    conn.begin = None
    _finish(pool, slot, watch, started, error=None, keep=True)


def _finish(
    pool: AsyncHostPool,
    slot: Slot,
    watch: _Deadline | None,
    started: float,
    *,
    error: str | None,
    keep: bool,
) -> None:
    if watch is not None and watch.disarm():
        keep = False  # the deadline fired just as the call ended: the socket is cut
    pool.release(slot, discard=not keep)
    pool.record(time.perf_counter() - started, error)


async def _lag(router: AsyncRouter, pool: AsyncHostPool, conn: psycopg.AsyncConnection) -> float:
    now = time.monotonic()
    if pool.lag is None or now - pool.lag[0] > router.options.lag_check_interval:
        cur = await psycopg.AsyncCursor(conn).execute(_LAG_SQL)
        pool.lag = (now, float((await cur.fetchone())[0]))
    return pool.lag[1]
