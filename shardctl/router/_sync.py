# Generated from shardctl/router/_async.py by tests/support/async_to_sync.py (make generate): do not edit.
# Change shardctl/router/_async.py and run `make generate`; tests/unit/test_generated.py checks it.
"""The thread twin of ``_async.py``, generated from it: see its docstring."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from ..errors import BadInput, HostUnreachable
from ..model.topology import Host, Topology
from ..sql import session as session_sql
from ..sql.catalog import router as catalog
from ..sql.catalog.control import MOVED_SQLSTATE
from .placement import (
    FOLLOW_POLL,
    GLOBAL_SCHEMA,
    MOVED_ERRORS,
    SAME,
    IdLookup,
    Key,
    RouterOptions,
    Routing,
    lookup_fallback,
)
from .pool import HostPool, PoolBase, Watchdog
from .session import (
    Call,
    Fallback,
    check_server_cursor,
    check_statement,
    deallocate_text,
    failure,
    forget_prepared_text,
    opened_statement,
    opening,
    outer_block,
    reset_text,
    skip_opening,
    stale_plan,
    statement_text,
    unreachable,
)

T = TypeVar("T")


class RouterConnection(psycopg.Connection):
    """A pooled connection of the Router's. Autocommit at rest; during a call, its cursors open each
    transaction with the call's settings (:meth:`begin_if_idle`)."""

    # the current call's BEGIN and settings (None: outside calls)
    begin: tuple[bytes, bytes] | None = None
    session_dirty = False  # a statement that may leave session state ran
    keeps_sessions = True  # the server session is ours alone (no transaction pooler)
    one_transaction = False  # run(): the whole call is one transaction

    def begin_if_idle(self) -> None:
        """Open the call's transaction (BEGIN and the shard's settings) unless one is open."""
        texts = opening(self)
        if texts:
            plain = psycopg.Cursor(self)
            for text in texts:
                plain.execute(text, prepare=False)

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[psycopg.Transaction]:
        """psycopg's transaction block; in a call, inside the call's own transaction (opened first, so
        that it carries the shard's settings). In run() it is a savepoint of the run's transaction;
        as the outermost block of another call it is the transaction: BEGIN with the settings, psycopg's
        block (a savepoint), then COMMIT (ROLLBACK on error or ``force_rollback``)."""
        outer = outer_block(self) == "outer"
        self.begin_if_idle()
        try:
            with super().transaction(savepoint_name, force_rollback) as tx:
                yield tx
        except BaseException:
            if outer:
                self.rollback()
            raise
        if outer and force_rollback:
            self.rollback()
        elif outer:
            self.commit()

    def run_statement(self, query: Any, params: Any) -> Any:
        """One statement in its own transaction, in one round trip: BEGIN, settings, the statement and
        COMMIT as one simple-protocol text, its parameters bound on the client (psycopg's ClientCursor,
        as for PgBouncer; nothing prepared). Returns its rows, or the number of rows it changed."""
        cur = psycopg.ClientCursor(self)
        cur.execute(statement_text(self, query), params, prepare=False)
        skip_opening(cur)
        return cur.fetchall() if cur.description is not None else cur.rowcount


class RouterCursor(psycopg.Cursor):
    """The Router's cursors: each statement opens the call's transaction when none is open, is refused
    when it would leave session state behind a transaction pooler, and otherwise marks the connection
    for the reset when it may leave session state (``session.check_statement``)."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _before(self.connection, query)
        return super().execute(query, params, **kwargs)

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        _before(self.connection, query)
        return super().executemany(query, params_seq, **kwargs)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _before(self.connection, query)
        yield from super().stream(query, params, **kwargs)

    @contextmanager
    def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        _before(self.connection, statement)
        with super().copy(statement, params, **kwargs) as copy:
            yield copy


class RouterClientCursor(RouterCursor, psycopg.ClientCursor):
    """The cursors of a connection lent to an ORM (:meth:`Router.lend`): parameters bound on the
    client (psycopg's ClientCursor: the simple protocol, nothing prepared), so that the statement that
    opens a transaction carries the BEGIN and the call's settings in its own text. The ORM's first
    statement of a transaction then costs one round trip, where a driver's implicit BEGIN costs one of
    its own."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        check_statement(conn, query)
        text = opened_statement(conn, query, params is not None)
        if text is None:
            conn.begin_if_idle()
            return psycopg.ClientCursor.execute(self, query, params, **kwargs)
        psycopg.ClientCursor.execute(self, text, params, **kwargs)
        skip_opening(self)
        return self


class RouterServerCursor(psycopg.ServerCursor):
    """A named cursor lives in the transaction; ``WITH HOLD`` outlives it: always reset after one, and
    refused behind a transaction pooler."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        check_server_cursor(conn, self.withhold)
        conn.begin_if_idle()
        return super().execute(query, params, **kwargs)


def _before(conn: Any, query: Any) -> None:
    check_statement(conn, query)
    conn.begin_if_idle()


def reset(conn: psycopg.Connection, *, commit: bool = False) -> None:
    """Return a connection whose server keeps sessions clean: nothing of one checkout's session reaches
    the next user (settings, temporary tables, session advisory locks, LISTENs, cursors, the user's own
    prepared statements; psycopg's stay). One round trip, with the transaction's COMMIT in front when
    ``commit`` (a failed COMMIT raises, like ``commit()``)."""
    rollback, text = reset_text(conn, commit)
    plain = psycopg.Cursor(conn)
    if rollback:
        conn.rollback()
    plain.execute(text)
    if text.startswith(session_sql.COMMIT):
        plain.nextset()
    names = plain.fetchone()
    for name in names[0]:
        plain.execute(deallocate_text(name))


def forget_prepared(conn: psycopg.Connection, epoch: int) -> None:
    """Drop the session's prepared statements, on the server and in psycopg's cache
    (``session.forget_prepared_text``: each epoch its own text)."""
    psycopg.Cursor(conn).execute(forget_prepared_text(epoch))


def _quietly(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        fn(*args)
        return True
    except Exception:  # noqa: BLE001 - the connection is broken: the caller discards it
        return False


def _rows(conn: RouterConnection, query: str, params: Any = None) -> list[tuple]:
    cur = conn.execute(query, params)
    return cur.fetchall()


class Router(Routing):
    """Routes keys to shards and hands out pooled connections with ``search_path`` set to the shard.

    Per host, a pool of connections opened on demand by the caller, a circuit breaker (a refused host
    fails at once with libpq's reason, not after a pool wait) and, when the host has a ``standby:``, a
    second pool for :meth:`read` and ``connection(readonly=True)``. Every call is bounded by
    ``timeout`` seconds: ``statement_timeout`` on the server, and a client deadline (``timeout`` +
    ``grace``) that cuts the socket of a host that stopped answering. :meth:`stats` reports pools,
    errors, breakers and latencies. See docs/router.md.

    A call names its shard by exactly one of ``key``, ``id=`` or ``shard=`` (:meth:`target`); its
    other keywords (``timeout=``, ``max_lag=``, ``readonly=``) are keyword-only arguments of the
    methods that take them, so a misspelt one is Python's own ``TypeError``.

    Shards move between hosts (``shardctl move-shard``). :meth:`run`, :meth:`execute` and :meth:`read`
    follow a move: when a statement fails because its shard has just moved away (the old tables are
    guarded and their schema renamed), they reload the topology file and retry once on the shard's new
    host. When the file does not change (another app server's copy that nobody updated), they read the
    redirect the old host recorded at the cutover (``shardctl.redirects``) and route the shard to the
    host it names, with this Router's own entry for that host (its DSN and ``password_env``), until
    the file catches up. :meth:`connection` cannot retry a ``with`` block: its callers see that error
    and can call :meth:`follow_move` (True: try again).
    """

    pool_class = HostPool

    def __init__(
        self,
        topology: Topology,
        options: RouterOptions | None = None,
        **settings: Any,
    ):
        """``options``, or its fields as keyword arguments (:class:`RouterOptions`)."""
        super().__init__(topology, options or RouterOptions(**settings))
        self._watchdog = Watchdog()

    # ---- calls (routing: see Routing) --------------------------------------------
    @contextmanager
    def connection(
        self,
        key: Key = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
        timeout: float | None = SAME,
        readonly: bool = False,
        max_lag: float | None = SAME,
    ) -> Iterator[RouterConnection]:
        """A pooled connection to the shard's host for a block: by ``key``, by ``id`` or by ``shard``.

        Each transaction in the block runs on the shard (``search_path``) with the call's
        ``statement_timeout``, both set for that transaction only; the block's open transaction commits
        at its end (rolls back on error), and a ``commit()`` inside starts the next one on the same
        shard. ``readonly``: the host's standby when it is within ``max_lag`` seconds, else the primary
        (in a read-only transaction). The block must end within ``timeout`` seconds.
        """
        number = self.resolve(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        call = self._call("block", number, timeout, readonly=readonly, max_lag=max_lag)
        host = self._locate(number)
        self._tried.set(host)
        with self._on_host(host, call) as conn:
            yield conn

    @contextmanager
    def lend(self, host: Host | str, *, timeout: float | None = SAME) -> Iterator[RouterConnection]:
        """A pooled connection to ``host``'s primary, lent to an ORM session (shardctl.sqlalchemy) that
        sets each transaction's shard (``conn.begin = transaction_start(...)``); reset only if needed,
        never prepared."""
        host = self.placement.host_named(host) if isinstance(host, str) else host
        with _session(
            self, self._pool(host), Call("public", self._timeout(timeout), "lend")
        ) as conn:
            # the BEGIN rides with the first statement
            conn.cursor_factory = RouterClientCursor
            try:
                yield conn
            finally:
                conn.cursor_factory = RouterCursor

    def resolve(
        self,
        key: Key = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
    ) -> int:
        """The shard a call goes to (:meth:`Routing.target`), with the one lookup of its key a
        pre-adoption ID of a non-root ``table`` needs (on the old database while it is
        authoritative, else in the id map): an old ID is found in at most two round trips (this one
        and the call's), never by a fan-out."""
        found = self.route(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        if isinstance(found, IdLookup):
            return self._look_up(found)
        return found

    def _look_up(self, lookup: IdLookup) -> int:
        """The shard of a pre-adoption ID's key (one round trip: :func:`_looked_up_key`)."""
        return self.shard_of_key(_looked_up_key(self, lookup), lookup)

    def shard_connection(self, shard: int, **kwargs: Any) -> Any:
        """``connection(shard=...)``."""
        return self.connection(shard=shard, **kwargs)

    def run(
        self,
        key: Key = None,
        work: Callable[[RouterConnection], T] | None = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
        timeout: float | None = SAME,
    ) -> T:
        """Call ``work(conn)`` in one transaction on the shard of ``key``, ``id`` or ``shard``; if the
        shard moved meanwhile, reload the topology and call it once more on the new host.

        ``work`` may run twice (also after a migration changed a table under a prepared statement),
        but its first run was rolled back entirely: it must only use ``conn``.
        """
        if work is None:
            raise BadInput("run() needs the work to call: run(key, work) or run(work=..., id=...)")
        number = self.resolve(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        call = self._call("run", number, timeout)

        def attempt(host: Host) -> T:
            with self._on_host(host, self._on(host, number, call)) as conn:
                return work(conn)

        return self._retrying(number, attempt)

    def execute(
        self,
        key: Key = None,
        query: Any = None,
        params: Any = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
        timeout: float | None = SAME,
    ) -> Any:
        """One statement on the shard of ``key``, ``id`` or ``shard``, in a transaction of its own (one
        round trip), following a move like :meth:`run`: the rows it returns, or the number of rows it
        changed."""
        number = self.resolve(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        return self._statement(query, params, number, self._call("statement", number, timeout))

    def read(
        self,
        key: Key = None,
        query: Any = None,
        params: Any = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
        timeout: float | None = SAME,
        max_lag: float | None = SAME,
    ) -> Any:
        """:meth:`execute` for reads, on the host's standby when it is at most ``max_lag`` seconds behind
        (else, or when the standby is down, on the primary, in a read-only transaction)."""
        number = self.resolve(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        call = self._call("statement", number, timeout, readonly=True, max_lag=max_lag)
        return self._statement(query, params, number, call)

    def _statement(self, query: Any, params: Any, shard: int, call: Call) -> Any:
        if query is None:
            raise BadInput("execute()/read() need the statement to run")

        def attempt(host: Host) -> Any:
            with self._on_host(host, self._on(host, shard, call)) as conn:
                return conn.run_statement(query, params)

        return self._retrying(shard, attempt)

    def _retrying(self, shard: int, attempt: Callable[[Host], T]) -> T:
        """``attempt(host)``; again after a stale cached plan (0A000 after a migration) or a move."""
        replanned = moved = False
        while True:
            host = self._locate(shard)
            self._tried.set(host)
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
    def _on_host(self, host: Host, call: Call) -> Iterator[RouterConnection]:
        """A session on the host's standby (a read with a lag bound, when the host has a standby that is
        fresh enough and answers) or else on its primary."""
        if call.readonly and host.standby and call.max_lag is not None:
            standby = self._pool(host, standby=True)
            try:
                with _session(self, standby, call) as conn:
                    yield conn
                    return
            except Fallback as why:
                standby.count(f"fallbacks.{why.args[0]}")
        primary = dataclasses.replace(call, max_lag=None)
        with _session(self, self._pool(host), primary) as conn:
            yield conn

    # ---- moves -----------------------------------------------------------------
    def follow_move(self, shard: int, exc: BaseException, tried: Host | None = None) -> bool:
        """After ``exc`` on ``shard``: True when the shard turned out to have moved and its new host is
        known (see :meth:`Placement.following`). ``tried`` is the host the failed statement ran on
        (default: this thread's or task's last call's)."""
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate not in MOVED_ERRORS:
            return False
        old = tried or self._tried.get() or self._locate(shard)
        steps = self.placement.following(shard, old, sqlstate == MOVED_SQLSTATE)
        answer: object = None
        try:
            while True:
                step = steps.send(answer)
                if step == "reload":
                    answer = self.reload()
                elif step == "ask":
                    answer = self._ask_old_host(old, shard)
                else:
                    answer = time.sleep(FOLLOW_POLL)
        except StopIteration as done:
            return bool(done.value)

    def _ask_old_host(self, host: Host, shard: int) -> tuple[dict | None, bool]:
        """What the host a statement failed on says of ``shard``: its redirect (where the shard went, or
        None) and whether it records the shard ``moved_out``. No answer: (None, False)."""
        redirect = None
        try:
            with _session(
                self, self._pool(host), Call("public", self.options.timeout, "run")
            ) as conn:
                if catalog.has_redirects(_rows(conn, catalog.HAS_REDIRECTS_SQL)):
                    rows = _rows(conn, catalog.REDIRECTS_SQL, ([shard],))
                    redirect = catalog.redirects_by_shard(rows).get(shard)
                if redirect is not None:  # an adopted old database has no shardctl.shards
                    return redirect, True
                state = _rows(conn, catalog.SHARD_STATE_SQL, (shard,))
        except Exception:  # noqa: BLE001 - no answer means no evidence of a move
            return None, False
        return redirect, catalog.moved_out(state)

    # ---- pools (Routing._pool) ---------------------------------------------------
    def _connect(self, host: Host, standby: bool) -> RouterConnection:
        """A new autocommit connection with the Router's bounds (:meth:`Routing._connecting`)."""
        with self._connecting(host, standby) as kwargs:
            conn = RouterConnection.connect(autocommit=True, cursor_factory=RouterCursor, **kwargs)
        return self._pooled(conn, host, RouterServerCursor)

    def close(self) -> None:
        for pool in self._take_pools():
            pool.close()
        self._watchdog.stop()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _looked_up_key(router: Router, lookup: IdLookup) -> Any:
    """The key of a pre-adoption ID, read where ``router.lookup_host()`` says (the id map's tables
    have the old database's names: one query serves both); in the id map when the old database's
    tables have gone meanwhile (``lookup_fallback``). None: no such row."""
    host = router.lookup_host()
    call = Call(GLOBAL_SCHEMA, router._timeout(SAME), "statement", True)
    query = catalog.id_map_key_query(
        router.topology.adoption.schema, lookup.table.name, lookup.table.id, lookup.table.key
    )
    try:
        with _session(router, router._pool(host), call) as conn:
            return catalog.id_map_key(conn.run_statement(query, (lookup.id,)))
    except psycopg.Error as exc:
        fallback = lookup_fallback(router.topology, host, exc)
        if fallback is None:
            raise
    with _session(router, router._pool(fallback), call) as conn:
        return catalog.id_map_key(conn.run_statement(query, (lookup.id,)))


@contextmanager
def _session(router: Router, pool: HostPool, call: Call) -> Iterator[RouterConnection]:
    """One call on ``pool``: checkout, the caller's work (each transaction opened with the call's
    settings, see ``session``), the reset where the server keeps sessions, checkin.

    Errors: a cut (deadline) or broken connection becomes HostUnreachable; SQL errors pass through.
    """
    started = time.perf_counter()
    deadline = call.deadline(router.options.grace)
    try:
        slot = pool.acquire(deadline)
    except HostUnreachable:
        unreachable(pool, started, call)
        raise
    conn: RouterConnection = slot.conn  # type: ignore[assignment]
    watch = router._watchdog.arm(conn, deadline) if deadline is not None else None
    keeps = conn.keeps_sessions
    try:
        if keeps and slot.plan_epoch != pool.plan_epoch:
            forget_prepared(conn, pool.plan_epoch)
            slot.plan_epoch = pool.plan_epoch
        if call.max_lag is not None and _lag(router, pool, conn) > call.max_lag:
            pool.end_call(slot, watch, started, error=None, keep=True)
            raise Fallback("lagging")
        call.ready(conn, keeps)
        try:
            yield conn
        except BaseException:
            _quietly(conn.rollback)
            raise
        if keeps and (conn.session_dirty or not call.tracked):
            conn.begin = None
            reset(conn, commit=True)  # COMMIT and the reset in one round trip
        elif conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.commit()
    except Fallback:
        raise
    except BaseException as exc:
        conn.begin = None
        fired = watch is not None and watch.disarm()
        watch = None
        error, mapped = failure(pool, slot, exc, fired, call.timeout, router.options.grace)
        keep = call.keeps_after(error, conn, keeps)
        if keep is None:
            keep = _quietly(reset, conn)
        pool.end_call(slot, None, started, error=error, keep=keep)
        if mapped is not exc:
            raise mapped from None
        raise
    conn.begin = None
    pool.end_call(slot, watch, started, error=None, keep=True)


def _lag(router: Router, pool: PoolBase, conn: psycopg.Connection) -> float:
    """The standby's lag, measured at most every ``lag_check_interval`` seconds."""
    now = time.monotonic()
    if pool.lag is None or now - pool.lag[0] > router.options.lag_check_interval:
        cur = psycopg.Cursor(conn).execute(catalog.STANDBY_LAG_SQL)
        pool.lag = (now, catalog.standby_lag(cur.fetchall()))
    return pool.lag[1]
