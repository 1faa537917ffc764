"""The library API applications use: route a key to its shard and get a connection there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from .engine.connections import APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT
from .errors import HostUnreachable
from .model.identifiers import quote_ident
from .sql.catalog import MOVED_SQLSTATE
from .ids.routing import placement_shard, shard_for_key
from .model.topology import Host, Topology

T = TypeVar("T")
# Errors a statement meets on the host a shard has just moved away from: the guard trigger on the
# old tables, and the old schema's name no longer resolving (it was renamed at the cutover).
MOVED_ERRORS = frozenset({MOVED_SQLSTATE, "42P01", "3F000", "42883"})


class Router:
    """Routes keys to shards and hands out pooled connections with ``search_path`` set to the shard.

    Pools (psycopg-pool, one per host) open lazily on first use; :meth:`close` closes them.

    Shards move between hosts (``shardctl move-shard``). :meth:`run` and :meth:`execute` follow a
    move: when a statement fails because its shard has just moved away (the old tables are
    guarded and their schema renamed), they reload the topology file and retry once on the
    shard's new host. :meth:`connection` cannot retry a ``with`` block: its callers see that error
    and can call :meth:`follow_move` (True: the topology was reloaded, try again).
    """

    def __init__(self, topology: Topology, *, max_size: int = 8, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
                 pool_timeout: float = 30.0, move_wait: float = 10.0, allow_inline_password: bool = False):
        self.topology = topology
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.move_wait = move_wait  # how long to wait for the topology file to show a move's cutover
        self.allow_inline_password = allow_inline_password
        self._pools: dict[str, ConnectionPool] = {}
        self._lock = threading.Lock()
        self._tried = threading.local()  # the host this thread's last shard_connection() went to

    # ---- routing ---------------------------------------------------------------
    def shard_for(self, key: int | str, *, force_string: bool = False) -> int:
        """Integer keys: ``key % modulus``; strings: ``md5(key) mod modulus``."""
        return shard_for_key(key, self.topology.modulus, force_string=force_string)

    def host_for(self, key: int | str, *, force_string: bool = False) -> Host:
        return self.topology.host_of(self.shard_for(key, force_string=force_string))

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

    # ---- connections -----------------------------------------------------------
    @contextmanager
    def connection(self, key: int | str, *, force_string: bool = False) -> Iterator[psycopg.Connection]:
        """A pooled connection to the key's host, ``search_path`` set to its shard schema.

        Like ``ConnectionPool.connection()``: commits on success, rolls back on error, then
        returns the connection to the pool with its settings reset.
        """
        with self.shard_connection(self.shard_for(key, force_string=force_string)) as conn:
            yield conn

    def run(self, key: int | str, work: Callable[[psycopg.Connection], T], *, force_string: bool = False) -> T:
        """Call ``work(conn)`` in one transaction on the key's shard; if the shard moved meanwhile,
        reload the topology and call it once more on the new host.

        ``work`` may run twice, but its first run was rolled back entirely: it must only use ``conn``
        (no side effects outside the database it cannot repeat).
        """
        return self.run_shard(self.shard_for(key, force_string=force_string), work)

    def run_shard(self, shard: int, work: Callable[[psycopg.Connection], T]) -> T:
        """:meth:`run` for a shard number (e.g. from :meth:`shard_of_id`)."""
        tried = None
        try:
            with self.shard_connection(shard) as conn:
                tried = self._tried.host
                return work(conn)
        except psycopg.Error as exc:
            if not self.follow_move(shard, exc, tried):
                raise
        with self.shard_connection(shard) as conn:
            return work(conn)

    def execute(self, key: int | str, query: Any, params: Any = None, *, force_string: bool = False) -> Any:
        """One statement on the key's shard, following a move like :meth:`run`: the rows it
        returns, or the number of rows it changed."""
        def work(conn: psycopg.Connection) -> Any:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else cur.rowcount

        return self.run(key, work, force_string=force_string)

    def reload(self) -> Topology:
        """Read the topology file again; pools of hosts that left or changed DSN are closed."""
        if self.topology.path is None:
            return self.topology
        fresh = Topology.load(self.topology.path, allow_inline_password=self.allow_inline_password)
        keep = {h.name: (h.dsn, h.password_env) for h in fresh.hosts}
        with self._lock:
            before = {h.name: (h.dsn, h.password_env) for h in self.topology.hosts}
            self.topology = fresh
            stale = [name for name in self._pools if keep.get(name) is None or keep[name] != before.get(name)]
            old_pools = [self._pools.pop(name) for name in stale]
        for pool in old_pools:
            pool.close()
        return fresh

    def follow_move(self, shard: int, exc: BaseException, tried: Host | None = None) -> bool:
        """After ``exc`` on ``shard``: True when the shard turned out to have moved and the reloaded
        topology now names its new host (waiting up to ``move_wait`` seconds for the file to say so).
        ``tried`` is the host the failed statement ran on (default: this thread's last connection's)."""
        state = getattr(exc, "sqlstate", None)
        if state not in MOVED_ERRORS or self.topology.path is None:
            return False
        # Not the current topology's owner: another thread may have reloaded it already.
        old = tried or getattr(self._tried, "host", None) or self.topology.host_of(shard)
        moved = state == MOVED_SQLSTATE
        deadline = time.monotonic() + self.move_wait
        while True:
            fresh = self.reload()
            new = fresh.host_of(shard)
            if (new.name, new.dsn) != (old.name, old.dsn):
                return True
            if not moved:
                # A missing table may be an application bug: only wait if the shard really moved away.
                moved = self._moved_away(old, shard)
                if not moved:
                    return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _moved_away(self, host: Host, shard: int) -> bool:
        try:
            with self._pool(host).connection(timeout=self.pool_timeout) as conn:
                row = conn.execute("SELECT state FROM shardctl.shards WHERE shard_id = %s", (shard,)).fetchone()
        except Exception:  # noqa: BLE001 - no answer means no evidence of a move
            return False
        return bool(row) and row[0] == "moved_out"

    @contextmanager
    def shard_connection(self, shard: int) -> Iterator[psycopg.Connection]:
        host = self.topology.host_of(shard)
        schema = self.topology.schema_name(shard)
        self._tried.host = host
        pool = self._pool(host)
        try:
            ctx = pool.connection(timeout=self.pool_timeout)
            conn = ctx.__enter__()
        except psycopg.OperationalError as exc:
            from .engine.connections import first_line

            raise HostUnreachable(host.name, first_line(exc)) from None
        except Exception as exc:  # psycopg_pool.PoolTimeout
            raise HostUnreachable(host.name, f"no connection from the pool: {exc}") from None
        try:
            conn.execute("SELECT set_config('search_path', %s, false)", (f"{schema}, public",))
            yield conn
        except BaseException as exc:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            ctx.__exit__(None, None, None)

    def _pool(self, host: Host) -> ConnectionPool:
        pool = self._pools.get(host.name)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(host.name)
            if pool is None:
                kwargs = host.connect_kwargs(connect_timeout=self.connect_timeout,
                                             application_name=f"{APPLICATION_NAME} router")
                conninfo = kwargs.pop("conninfo")
                pool = ConnectionPool(conninfo, kwargs=kwargs, min_size=1, max_size=self.max_size, open=False,
                                      reset=_reset, name=f"shardctl-{host.name}")
                pool.open(wait=False)
                self._pools[host.name] = pool
        return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What ``DISCARD ALL`` does, less ``DEALLOCATE ALL`` (psycopg keeps its own prepared statements
# and, after the first time, would not notice them gone), and allowed in a transaction.
_RESET_SQL = ("SELECT coalesce(array_agg(name::text), '{}') FROM pg_prepared_statements WHERE name !~ '^_pg3_';"
              "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
              "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES")


def _reset(conn: psycopg.Connection) -> None:
    """Return connections clean: nothing of one checkout's session reaches the next user.

    Settings, and temporary tables too: ``pg_temp`` comes first in the search path, so a temp
    table left behind would capture another shard's reads and writes. Session advisory locks,
    LISTENs, cursors and the user's own prepared statements go as well; psycopg's prepared
    statements stay (PostgreSQL re-plans them when the search path changes).
    """
    names = conn.execute(_RESET_SQL).fetchone()[0]
    for name in names:
        conn.execute(f"DEALLOCATE {quote_ident(name)}")
    conn.commit()
