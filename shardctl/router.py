"""The library API applications use: route a key to its shard and get a connection there."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from .db import APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT
from .errors import HostUnreachable
from .identifiers import quote_ident
from .routing import placement_shard, shard_for_key
from .topology import Host, Topology


class Router:
    """Routes keys to shards and hands out pooled connections with ``search_path`` set to the shard.

    Pools (psycopg-pool, one per host) open lazily on first use; :meth:`close` closes them.
    """

    def __init__(self, topology: Topology, *, max_size: int = 8, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
                 pool_timeout: float = 30.0):
        self.topology = topology
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self._pools: dict[str, ConnectionPool] = {}
        self._lock = threading.Lock()

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

    @contextmanager
    def shard_connection(self, shard: int) -> Iterator[psycopg.Connection]:
        host = self.topology.host_of(shard)
        schema = self.topology.schema_name(shard)
        pool = self._pool(host)
        try:
            ctx = pool.connection(timeout=self.pool_timeout)
            conn = ctx.__enter__()
        except psycopg.OperationalError as exc:
            from .db import first_line

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
