"""The library API applications use: route a key to its shard and get a connection there."""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .engine.connections import APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT, first_line
from .errors import HostUnreachable
from .ids.routing import placement_shard, shard_for_key
from .model.identifiers import quote_ident
from .model.topology import Host, Topology
from .router_pool import HostPool, Redirects, Slot, Watchdog, foreign_connect_error, log
from .sql.catalog import MOVED_SQLSTATE, read_redirects

T = TypeVar("T")
# Errors a statement meets on the host a shard has just moved away from: the guard trigger on the
# old tables, and the old schema's name no longer resolving (it was renamed at the cutover).
MOVED_ERRORS = frozenset({MOVED_SQLSTATE, "42P01", "3F000", "42883"})
SAME: Any = object()  # per-call argument left at the Router's default


class Router:
    """Routes keys to shards and hands out pooled connections with ``search_path`` set to the shard.

    Per host, a pool of connections opened on demand by the caller's thread, a circuit breaker
    (a refused host fails at once with libpq's reason, not after a pool wait) and, when the host
    has a ``standby:``, a second pool for :meth:`read` and ``connection(readonly=True)``.
    Every call is bounded by ``timeout`` seconds: ``statement_timeout`` on the server, and a
    client deadline (``timeout`` + ``grace``) that cuts the socket of a host that stopped answering.
    :meth:`stats` reports pools, errors, breakers and latencies. See README.md (The Router in production).

    Shards move between hosts (``shardctl move-shard``). :meth:`run` and :meth:`execute` follow a
    move: when a statement fails because its shard has just moved away (the old tables are
    guarded and their schema renamed), they reload the topology file and retry once on the
    shard's new host. When the file does not change (another app server's copy that nobody
    updated), they read the redirect the old host recorded at the cutover (``shardctl.redirects``)
    and route the shard to the host it names, with this Router's own entry for that host (its DSN
    and ``password_env``), until the file catches up. :meth:`connection` cannot retry a ``with``
    block: its callers see that error and can call :meth:`follow_move` (True: try again).
    """

    def __init__(self, topology: Topology, *, max_size: int = 8, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
                 pool_timeout: float = 30.0, move_wait: float = 10.0, allow_inline_password: bool = False,
                 timeout: float | None = 30.0, grace: float = 0.5, max_lag: float = 5.0,
                 lag_check_interval: float = 0.2):
        self.topology = topology
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.move_wait = move_wait  # how long to wait for the topology file to show a move's cutover
        self.allow_inline_password = allow_inline_password
        self.timeout = timeout      # default bound of every call, seconds (None: unbounded)
        self.grace = grace          # client deadline = timeout + grace (the server's own timeout fires first)
        self.max_lag = max_lag      # default staleness bound of standby reads, seconds
        self.lag_check_interval = lag_check_interval
        self._pools: dict[str, HostPool] = {}
        self._lock = threading.Lock()
        self._tried = threading.local()  # the host this thread's last shard_connection() went to
        self._watchdog = Watchdog()
        self._redirects = Redirects()  # shards routed by their old host's redirect (stale topology file)
        self._reload_lock = threading.Lock()
        self._file_stamp: tuple[int, int, int] | None = None  # the file as last parsed by reload()

    # ---- routing ---------------------------------------------------------------
    def shard_for(self, key: int | str, *, force_string: bool = False) -> int:
        """Integer keys: ``key % modulus``; strings: ``md5(key) mod modulus``."""
        return shard_for_key(key, self.topology.modulus, force_string=force_string)

    def host_for(self, key: int | str, *, force_string: bool = False) -> Host:
        return self._locate(self.shard_for(key, force_string=force_string))

    def schema_for(self, key: int | str, *, force_string: bool = False) -> str:
        return self.topology.schema_name(self.shard_for(key, force_string=force_string))

    def allocate_shard(self, key: int | str, *, force_string: bool = False) -> int:
        """Shard for a *new* object: ``placement.new_objects`` when the topology has it, else :meth:`shard_for`.

        Existing objects keep their shard: their own IDs name it (:meth:`shard_of_id`).
        """
        if self.topology.new_objects:
            return placement_shard(key, self.topology.new_objects, force_string=force_string)
        return self.shard_for(key, force_string=force_string)

    def shard_of_id(self, id_value: int) -> int:
        """An object's own ID names its shard."""
        return self.topology.layout.decode(id_value)["shard"]

    def _locate(self, shard: int) -> Host:
        """The host serving ``shard``: a redirect this Router followed, else the topology's owner."""
        return self._redirects.host(shard) or self.topology.host_of(shard)

    def redirects(self) -> dict[int, str]:
        """Shards this Router routes by a redirect (its topology file still names the old host) → host name."""
        return self._redirects.names()

    # ---- calls -----------------------------------------------------------------
    @contextmanager
    def connection(self, key: int | str, *, force_string: bool = False, readonly: bool = False,
                   max_lag: float | None = SAME, timeout: float | None = SAME) -> Iterator[psycopg.Connection]:
        """A pooled connection to the key's host, ``search_path`` set to its shard schema.

        Commits on success, rolls back on error, then returns the connection to the pool with its
        session reset. ``readonly``: the host's standby when it is within ``max_lag`` seconds, else
        the primary (in a read-only transaction). The block must end within ``timeout`` seconds.
        """
        with self.shard_connection(self.shard_for(key, force_string=force_string), readonly=readonly,
                                   max_lag=max_lag, timeout=timeout) as conn:
            yield conn

    @contextmanager
    def shard_connection(self, shard: int, *, readonly: bool = False, max_lag: float | None = SAME,
                         timeout: float | None = SAME) -> Iterator[psycopg.Connection]:
        """:meth:`connection` for a shard number."""
        host = self._locate(shard)
        self._tried.host = host
        with self._on_host(host, shard, timeout, readonly, max_lag, transaction=True) as conn:
            yield conn

    def run(self, key: int | str, work: Callable[[psycopg.Connection], T], *, force_string: bool = False,
            timeout: float | None = SAME) -> T:
        """Call ``work(conn)`` in one transaction on the key's shard; if the shard moved meanwhile,
        reload the topology and call it once more on the new host.

        ``work`` may run twice (also after a migration changed a table under a prepared statement),
        but its first run was rolled back entirely: it must only use ``conn``.
        """
        return self.run_shard(self.shard_for(key, force_string=force_string), work, timeout=timeout)

    def run_shard(self, shard: int, work: Callable[[psycopg.Connection], T], *, timeout: float | None = SAME) -> T:
        """:meth:`run` for a shard number (e.g. from :meth:`shard_of_id`)."""
        def attempt(host: Host) -> T:
            with self._on_host(host, shard, timeout, False, None, transaction=True, tracked=True) as conn:
                return work(conn)

        return self._retrying(shard, attempt)

    def execute(self, key: int | str, query: Any, params: Any = None, *, force_string: bool = False,
                timeout: float | None = SAME) -> Any:
        """One statement on the key's shard, in autocommit, following a move like :meth:`run`: the rows
        it returns, or the number of rows it changed."""
        return self._statement(self.shard_for(key, force_string=force_string), query, params, timeout, False, None)

    def read(self, key: int | str, query: Any, params: Any = None, *, force_string: bool = False,
             max_lag: float | None = SAME, timeout: float | None = SAME) -> Any:
        """:meth:`execute` for reads, on the host's standby when it is at most ``max_lag`` seconds behind
        (else, or when the standby is down, on the primary)."""
        return self._statement(self.shard_for(key, force_string=force_string), query, params, timeout, True, max_lag)

    def _statement(self, shard: int, query: Any, params: Any, timeout: Any, readonly: bool, max_lag: Any) -> Any:
        def attempt(host: Host) -> Any:
            if readonly and host.standby:
                ctx = self._on_host(host, shard, timeout, readonly, max_lag, transaction=False, tracked=True)
            else:  # the common case, without the standby layer
                ctx = _session(self, self._pool(host), self.topology.schema_name(shard),
                               self.timeout if timeout is SAME else timeout, False, True, readonly, None)
            with ctx as conn:
                cur = conn.execute(query, params)
                return cur.fetchall() if cur.description is not None else cur.rowcount

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
                if not replanned and _stale_plan(exc):
                    replanned = True
                    continue
                if not moved and self.follow_move(shard, exc, host):
                    moved = True
                    continue
                raise

    @contextmanager
    def _on_host(self, host: Host, shard: int, timeout: Any, readonly: bool, max_lag: Any, *,
                 transaction: bool, tracked: bool = False) -> Iterator[psycopg.Connection]:
        """A session on the host's standby (``readonly`` and fresh enough) or else its primary."""
        timeout = self.timeout if timeout is SAME else timeout
        schema = self.topology.schema_name(shard)
        if readonly and host.standby:
            lag_bound = self.max_lag if max_lag is SAME else max_lag
            standby = self._pool(host, standby=True)
            try:
                with _session(self, standby, schema, timeout, transaction, tracked, readonly, lag_bound) as conn:
                    yield conn
                    return
            except _Fallback as why:
                standby.count(f"fallbacks.{why.args[0]}")
        with _session(self, self._pool(host), schema, timeout, transaction, tracked, readonly, None) as conn:
            yield conn

    # ---- moves -----------------------------------------------------------------
    def reload(self) -> Topology:
        """Read the topology file again; pools of hosts that left or changed DSN are closed."""
        if self.topology.path is None:
            return self.topology
        # Many threads meet a moved shard at once, and an app server's file may never change: parse it
        # only when it did (a parse holds the GIL for every thread, writes to other shards included).
        with self._reload_lock:
            stamp = _file_stamp(self.topology.path)
            if stamp is not None and stamp == self._file_stamp:
                return self.topology
            fresh = Topology.load(self.topology.path, allow_inline_password=self.allow_inline_password)
            self._file_stamp = stamp
            after = {h.name: (h.dsn, h.password_env, h.standby) for h in fresh.hosts}
            with self._lock:
                before = {h.name: (h.dsn, h.password_env, h.standby) for h in self.topology.hosts}
                self.topology = fresh
                changed = {name for name in before if after.get(name) != before[name]}
                changed |= self._redirects.reconcile(fresh)
                # Pool keys: the host's name, and "<name> standby" for its standby's pool.
                stale = [key for key in self._pools if key.split(" ")[0] in changed]
                old_pools = [self._pools.pop(key) for key in stale]
        for pool in old_pools:
            pool.close()
        return fresh

    def follow_move(self, shard: int, exc: BaseException, tried: Host | None = None) -> bool:
        """After ``exc`` on ``shard``: True when the shard turned out to have moved and its new host is
        known: the reloaded topology names it, or the host the statement failed on recorded a redirect
        (then the shard is routed there until the file catches up). Without either, waits up to
        ``move_wait`` seconds for the file to say so. ``tried`` is the host the failed statement ran on
        (default: this thread's last connection's)."""
        state = getattr(exc, "sqlstate", None)
        if state not in MOVED_ERRORS:
            return False
        # Not the current owner: another thread may have reloaded or followed a redirect already.
        old = tried or getattr(self._tried, "host", None) or self._locate(shard)
        moved = state == MOVED_SQLSTATE
        deadline = time.monotonic() + self.move_wait
        asked = False
        while True:
            self.reload()
            new = self._locate(shard)
            if (new.name, new.dsn) != (old.name, old.dsn):
                return True
            if not asked:  # the file does not know (yet): ask the host the statement failed on
                asked = True
                redirect, moved_out = _ask_old_host(self, old, shard)
                if redirect is not None and redirect["host"] != old.name:
                    self._redirects.follow(shard, redirect, self.topology, old)
                    return True
                # A missing table may be an application bug: only wait if the shard really moved away.
                moved = moved or moved_out
                if not moved:
                    return False
            if self.topology.path is None or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    # ---- pools -----------------------------------------------------------------
    def _pool(self, host: Host, *, standby: bool = False) -> HostPool:
        key = f"{host.name} standby" if standby else host.name
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = HostPool(host.name, "standby" if standby else "primary",
                                functools.partial(self._connect, host, standby), self.max_size, self.pool_timeout)
                self._pools[key] = pool
        return pool

    def _connect(self, host: Host, standby: bool) -> psycopg.Connection:
        """A new autocommit connection with the Router's bounds: connect timeout, TCP keepalives and
        user timeout (a dead network is noticed), and ``statement_timeout`` as the session default."""
        kwargs = host.connect_kwargs(connect_timeout=max(1, int(self.connect_timeout)),
                                     application_name=f"{APPLICATION_NAME} router")
        foreign = self._redirects.foreign(host.name) and not standby
        if standby:
            kwargs["conninfo"] = host.standby
        options = conninfo_to_dict(kwargs["conninfo"]).get("options", "")
        kwargs.update(keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                      tcp_user_timeout=int(1000 * max(10.0, (self.timeout or 0) + self.grace)),
                      options=f"{options} -c statement_timeout={_ms(self.timeout)}".strip())
        try:
            conn = psycopg.connect(autocommit=True, cursor_factory=_TrackingCursor, **kwargs)
        except psycopg.OperationalError as exc:
            if not foreign:
                raise
            raise foreign_connect_error(host, exc) from None
        conn.server_cursor_factory = _TrackingServerCursor
        conn.session_dirty = False  # set by the cursors: a statement that may leave session state ran
        return conn

    def stats(self) -> dict[str, dict]:
        """Per host: pool usage, calls, errors by kind, breaker state and latency percentiles (ms) of
        its primary, and under ``"standby"`` the same for its standby (with the last lag seen)."""
        with self._lock:
            pools = dict(self._pools)
        out: dict[str, dict] = {}
        for host in self.topology.hosts:
            primary = pools.get(host.name) or self._unused(host.name, "primary")
            doc = primary.stats()
            standby = pools.get(f"{host.name} standby") or (self._unused(host.name, "standby") if host.standby else None)
            doc["standby"] = standby.stats() if standby else None
            out[host.name] = doc
        return out

    def _unused(self, name: str, role: str) -> HostPool:
        """A pool never used (nothing opened): for :meth:`stats`' zeros."""
        return HostPool(name, role, lambda: None, self.max_size, self.pool_timeout)  # type: ignore[arg-type,return-value]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        self._watchdog.stop()

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Fallback(Exception):
    """The standby cannot serve this read (args[0]: ``lagging`` or ``unreachable``): use the primary."""


def _ask_old_host(router: Router, host: Host, shard: int) -> tuple[dict | None, bool]:
    """What the host a statement failed on says of ``shard``: its redirect (where the shard went, or
    None) and whether it records the shard ``moved_out``. No answer: (None, False)."""
    try:
        with _session(router, router._pool(host), "public", router.timeout, False, False, False, None) as conn:
            redirect = read_redirects(conn, [shard]).get(shard)
            row = conn.execute("SELECT state FROM shardctl.shards WHERE shard_id = %s", (shard,)).fetchone()
    except Exception:  # noqa: BLE001 - no answer means no evidence of a move
        return None, False
    return redirect, bool(row) and row[0] == "moved_out"


def _ms(seconds: float | None) -> int:
    return 0 if seconds is None else max(1, int(seconds * 1000))


_BEGIN = "BEGIN"
_SETTINGS_SQL = "SELECT set_config('search_path', {}, false), set_config('statement_timeout', {}, false)"
_PREPARE_SQL = _SETTINGS_SQL.format("%s", "%s")
# Behind by the age of the last replayed transaction, unless everything received is replayed.
_LAG_SQL = ("SELECT CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() "
            "THEN 0 ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), "
            "1e9) END")


@contextmanager
def _session(router: Router, pool: HostPool, schema: str, timeout: float | None, transaction: bool, tracked: bool,
             readonly: bool, max_lag: float | None) -> Iterator[psycopg.Connection]:
    """One call on ``pool``: checkout, search_path and statement_timeout (only when they change),
    the caller's work (in a transaction when ``transaction``), the reset, checkin. ``tracked``
    (``execute()``, ``read()``, ``run()``): the connection's cursors check each statement as it runs,
    and the reset follows only one that could leave session state (:func:`_leaves_no_state`);
    otherwise (``connection()`` blocks) it always follows.

    Errors: a cut (deadline) or broken connection becomes HostUnreachable; SQL errors pass through.
    """
    started = time.perf_counter()
    deadline = None if timeout is None else time.monotonic() + timeout + router.grace
    try:
        slot = pool.acquire(deadline)
    except HostUnreachable:
        pool.record(time.perf_counter() - started, "unreachable")
        if max_lag is not None:
            raise _Fallback("unreachable") from None
        raise
    conn = slot.conn
    watch = router._watchdog.arm(conn, deadline) if deadline is not None else None
    try:
        # run(): one transaction, the Router's own BEGIN on the autocommit connection (psycopg sends none of
        # its own then), in the same round trip as the session settings when they change. connection()
        # blocks are the caller's to shape (after a commit inside, the next statement opens the next
        # transaction): psycopg's own transactions.
        begin = transaction and tracked and max_lag is None
        _prepare(slot, pool, schema, _ms(timeout), _ms(router.timeout), begin)
        if max_lag is not None and _lag(router, pool, conn) > max_lag:
            _finish(router, pool, slot, watch, started, error=None, keep=True)
            raise _Fallback("lagging")
        conn.session_dirty = False  # from here on, the caller's statements only
        if transaction:
            conn.prepare_threshold = None   # no prepared statements to go stale when a migration alters a table
            if not begin:
                conn.autocommit = False
                conn.read_only = True if readonly else None
            try:
                yield conn
            except BaseException:
                _quietly(conn.rollback)
                raise
            if conn.session_dirty or not tracked:
                _reset(slot, commit=True)  # COMMIT and the reset in one round trip
            else:
                conn.commit()
                _back_to_autocommit(conn)
        else:
            yield conn
            if conn.session_dirty or not tracked:
                _reset(slot)
    except _Fallback:
        raise
    except BaseException as exc:
        fired = watch is not None and router._watchdog.disarm(watch)
        watch = None
        error, mapped = _failure(pool, slot, exc, fired, timeout, router.grace)
        # The connection stays pooled unless it is cut, broken or was interrupted mid-call.
        keep = error in ("sql", "stale_plan", "other") and (
            (tracked and not transaction and not conn.session_dirty) or _quietly(_reset, slot))
        _finish(router, pool, slot, None, started, error=error, keep=keep)
        if mapped is not exc:
            raise mapped from None
        raise
    _finish(router, pool, slot, watch, started, error=None, keep=True)


def _finish(router: Router, pool: HostPool, slot: Slot, watch: int | None, started: float, *,
            error: str | None, keep: bool) -> None:
    if watch is not None and router._watchdog.disarm(watch):
        keep = False  # the deadline fired just as the call ended: the socket is cut
    pool.release(slot, discard=not keep)
    pool.record(time.perf_counter() - started, error)


def _prepare(slot: Slot, pool: HostPool, schema: str, timeout_ms: int, default_ms: int, begin: bool) -> None:
    """The session's search path and statement timeout, when they change; with ``begin``, a BEGIN too, in
    the same round trip (one simple-protocol text, values inlined as literals; never prepared)."""
    if slot.plan_epoch != pool.plan_epoch:
        forget_prepared(slot.conn, pool.plan_epoch)
        slot.plan_epoch = pool.plan_epoch
    want = None if timeout_ms == default_ms else timeout_ms
    if slot.schema == schema and slot.timeout_ms == want:
        if begin:
            slot.conn.execute(_BEGIN, prepare=False)
        return
    params = (f"{schema}, public", str(default_ms if want is None else want))
    if begin:
        slot.conn.execute(sql.SQL(_BEGIN + "; " + _SETTINGS_SQL).format(*map(sql.Literal, params)), prepare=False)
    else:
        slot.conn.execute(_PREPARE_SQL, params)
    slot.schema, slot.timeout_ms = schema, want


def forget_prepared(conn: psycopg.Connection, epoch: int) -> None:
    """Drop the session's prepared statements, on the server and in psycopg's cache.

    psycopg clears its cache when a statement's tag is DEALLOCATE ALL, but only the first time it
    sees that query text on a connection (psycopg 3.3: a text it has counted before skips the
    check), so each epoch sends its own text; a repeated text left psycopg executing
    statements the server had dropped ("prepared statement _pg3_1 does not exist").
    """
    conn.execute(f"DEALLOCATE ALL /* plan epoch {int(epoch)} */")


def _lag(router: Router, pool: HostPool, conn: psycopg.Connection) -> float:
    now = time.monotonic()
    if pool.lag is None or now - pool.lag[0] > router.lag_check_interval:
        pool.lag = (now, float(conn.execute(_LAG_SQL).fetchone()[0]))
    return pool.lag[1]


def _failure(pool: HostPool, slot: Slot, exc: BaseException, fired: bool, timeout: float | None,
             grace: float) -> tuple[str, BaseException]:
    """The stats kind of an error, and what the caller sees."""
    if fired:
        cause = f"no answer within {timeout + grace:g}s (timeout {timeout:g}s)"
        pool.breaker.failure(cause, probe_now=True)
        pool.drop_idle()
        return "timeout", HostUnreachable(pool.breaker.name, cause)
    conn = slot.conn
    if isinstance(exc, psycopg.OperationalError) and (conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK):
        log.info("host %s: connection lost: %s", pool.breaker.name, first_line(exc))
        return "connection_lost", HostUnreachable(pool.breaker.name, first_line(exc))
    if _stale_plan(exc):
        pool.plan_epoch += 1  # every pooled connection drops its prepared statements before its next use
        return "stale_plan", exc
    if isinstance(exc, psycopg.Error):
        return "sql", exc
    return ("other" if isinstance(exc, Exception) else "interrupted"), exc


def _stale_plan(exc: BaseException) -> bool:
    return getattr(exc, "sqlstate", None) == "0A000" and "cached plan must not change result type" in str(exc)


def _quietly(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        fn(*args)
        return True
    except Exception:  # noqa: BLE001 - the connection is broken: the caller discards it
        return False


# What ``DISCARD ALL`` does, less ``DEALLOCATE ALL`` (psycopg keeps its own prepared statements
# and, after the first time, would not notice them gone), and allowed in a transaction.
_RESET_SQL = ("SELECT coalesce(array_agg(name::text), '{}') FROM pg_prepared_statements WHERE name !~ '^_pg3_';"
              "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
              "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES")


def _reset(slot: Slot, *, commit: bool = False) -> None:
    """Return connections clean: nothing of one checkout's session reaches the next user.

    Settings, and temporary tables too: ``pg_temp`` comes first in the search path, so a temp
    table left behind would capture another shard's reads and writes. Session advisory locks,
    LISTENs, cursors and the user's own prepared statements go as well; psycopg's prepared
    statements stay (PostgreSQL re-plans them when the search path changes). One round trip,
    with the transaction's COMMIT in front when ``commit`` (a failed COMMIT raises, like ``commit()``).
    """
    conn = slot.conn
    slot.schema = slot.timeout_ms = None
    status = conn.pgconn.transaction_status
    if commit and status in (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR):
        cur = conn.execute("COMMIT; " + _RESET_SQL)  # no BEGIN is sent: a transaction is open
        cur.nextset()
    else:
        if status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.autocommit = True
        cur = conn.execute(_RESET_SQL)
    names = cur.fetchone()[0]
    _back_to_autocommit(conn)
    for name in names:
        conn.execute(f"DEALLOCATE {quote_ident(name)}")


def _back_to_autocommit(conn: psycopg.Connection) -> None:
    """The pooled connection's resting state after a transaction (with or without the reset; without it,
    the search path and timeout set for the transaction stay, and the next use of the shard skips them)."""
    conn.autocommit = True
    conn.read_only = None
    conn.prepare_threshold = 5


class _TrackingCursor(psycopg.Cursor):
    """The Router's cursors: a statement that may leave session state marks the connection for the reset
    (the same test as :meth:`Router.execute`'s; :func:`_leaves_no_state`)."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _track(self.connection, query)
        return super().execute(query, params, **kwargs)

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        _track(self.connection, query)
        return super().executemany(query, params_seq, **kwargs)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _track(self.connection, query)
        return super().stream(query, params, **kwargs)

    def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        _track(self.connection, statement)
        return super().copy(statement, params, **kwargs)


class _TrackingServerCursor(psycopg.ServerCursor):
    """A named cursor may be WITH HOLD, which outlives the transaction: always reset after one."""

    __slots__ = ()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.connection.session_dirty = True
        return super().execute(query, params, **kwargs)


def _track(conn: psycopg.Connection, query: Any) -> None:
    if not _leaves_no_state(query):
        conn.session_dirty = True


_STARTS_CLEAN = re.compile(r"\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(insert|update|delete|select|with|values|table|merge)\b",
                           re.IGNORECASE | re.DOTALL)
# Words with which a query can leave session state behind (settings, temp tables, advisory locks,
# LISTEN, cursors, prepared statements, roles). A false alarm only costs the reset round trip.
_SESSION_WORDS = re.compile(r"set_config|advisory|temp|listen|prepare|declare|role|authorization|setseed|dblink|"
                            r"\bset\s+(?:session|local)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=2048)
def _text_leaves_no_state(text: str) -> bool:
    return bool(_STARTS_CLEAN.match(text)) and not _SESSION_WORDS.search(text)


def _leaves_no_state(query: Any) -> bool:
    """True when one autocommit statement cannot leave session state: the reset can be skipped."""
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    if not isinstance(query, str):
        return False  # sql.Composed and friends: not worth rendering here; reset to be safe
    return _text_leaves_no_state(query)


def _file_stamp(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of the topology file: a flip (rename) or an edit changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
