"""Where the Router finds each shard: its topology file, and the redirects that moved shards' old hosts
recorded, followed while this app server's copy of the file is stale."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

import psycopg
import psycopg.conninfo

from ..engine.connections import APPLICATION_NAME
from ..engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ..errors import BadInput, ConfigError
from ..ids.old_ids import adopted_table, root_shard, shard_of_key
from ..ids.old_ids import shard_of_id as id_shard
from ..ids.routing import placement_shard, shard_for_key
from ..model.adoption import AdoptedTable
from ..model.dsn import mask
from ..model.topology import Host, Topology
from ..sql.catalog.control import MOVED_SQLSTATE
from .pool import HostPool, PoolBase, foreign_connect_error, log
from .session import Call

# Errors a statement meets on the host a shard has just moved away from: the guard trigger on the
# old tables, the old schema's name no longer resolving (it was renamed at the cutover), and an
# upsert's conflict target on a stub view (it has no unique index: 42P10 comes before its trigger).
# Each is followed only when the old host records a redirect for the shard.
MOVED_ERRORS = frozenset({MOVED_SQLSTATE, "42P01", "3F000", "42883", "42P10"})
# What a Router call is routed by: an int or a str, which the topology's routing rule maps to a shard
# (None when the call names its shard with ``id=`` or ``shard=``)
Key: TypeAlias = int | str | None
SAME: Any = object()  # per-call argument left at the Router's default
FOLLOW_POLL = 0.05  # seconds between looks at the topology file while a move's cutover is awaited
# The shard number of the global (unsharded) tables of an adopted database: ``global_=True``.
# On the old database while it is authoritative, on ``placement.global_host`` after the cutover.
GLOBAL = -1
GLOBAL_SCHEMA = "public"  # where the global tables live on the global host


def file_owner(topology: Topology, shard: int) -> Host:
    """The host the topology file gives ``shard`` (or the global tables, :data:`GLOBAL`): the old
    database while an adoption keeps it authoritative, else the shard's owner (the global host)."""
    adoption = topology.adoption
    if adoption is not None and adoption.on_source:
        if shard != GLOBAL:
            topology.host_of(shard)  # BadInput for a shard not in the topology
        return adoption.source
    if shard == GLOBAL:
        return topology.host(topology.global_host) if topology.global_host else topology.hosts[0]
    return topology.host_of(shard)


def is_source(topology: Topology, host: Host) -> bool:
    """Whether ``host`` is the adopted old database (a fleet host may not be named like it)."""
    adoption = topology.adoption
    return (
        adoption is not None and adoption.source is not None and host.name == adoption.source.name
    )


@dataclass(frozen=True)
class IdLookup:
    """A pre-adoption ID of a non-root table: its key is looked up (:meth:`Routing.lookup_host`)."""

    table: AdoptedTable
    id: int


class Placement:
    """The topology a Router routes by, reloaded when its file changes, plus the redirects it follows."""

    def __init__(
        self, topology: Topology, *, move_wait: float = 10.0, allow_inline_password: bool = False
    ):
        self.topology = topology
        # how long to wait for the topology file to show a move's cutover
        self.move_wait = move_wait
        self.allow_inline_password = allow_inline_password
        # shards routed by their old host's redirect (stale topology file)
        self.redirects = Redirects()
        self._reload_lock = threading.Lock()
        self._file_stamp: tuple[int, int, int] | None = None  # the file as last parsed by reload()

    def locate(self, shard: int) -> Host:
        """The host serving ``shard``: a redirect followed, else the topology file's owner (the old
        database while an adoption keeps it authoritative; :func:`file_owner`)."""
        return self.redirects.host(shard) or file_owner(self.topology, shard)

    def host_named(self, name: str) -> Host:
        """The host called ``name``: a fleet host, or the adopted old database (``source``)."""
        adoption = self.topology.adoption
        if adoption is not None and adoption.source is not None and name == adoption.source.name:
            return adoption.source
        return self.topology.host(name)

    def schema_on(self, host: Host, shard: int) -> str:
        """The schema ``shard`` has on ``host``: the app's schema on the adopted old database, the
        global tables' schema for :data:`GLOBAL`, else the shard's schema."""
        adoption = self.topology.adoption
        if adoption is not None and is_source(self.topology, host):
            return adoption.schema
        if shard == GLOBAL:
            return GLOBAL_SCHEMA
        return self.topology.schema_name(shard)

    def redirect_check(self, host: Host, shard: int) -> int | None:
        """The shard whose redirect a transaction on ``host`` looks for first
        (``sql.session.redirect_check``), or None: only while the file has an adoption, and only on
        a fleet host, whether the file sends the shard there (it says ``fleet``) or a redirect of the
        old database did (it says ``source``: a copy older than the cutover). Either may be stale,
        the adoption aborted since: the fleet host then records the redirect back to the old
        database, and its tables may be refilling for the next attempt, readable under their
        names. Not after the cleanup (the file has no ``adoption.source``): there is no way back then."""
        adoption = self.topology.adoption
        if adoption is None or adoption.source is None or is_source(self.topology, host):
            return None
        return shard

    def reload(self) -> tuple[Topology, set[str]]:
        """Read the file again when it changed: (the topology, names of hosts that left or changed)."""
        if self.topology.path is None:
            return self.topology, set()
        # Many threads meet a moved shard at once, and an app server's file may never change: parse it
        # only when it did (a parse holds the GIL for every thread, writes to other shards included).
        with self._reload_lock:
            stamp = _file_stamp(self.topology.path)
            if stamp is not None and stamp == self._file_stamp:
                return self.topology, set()
            fresh = Topology.load(
                self.topology.path, allow_inline_password=self.allow_inline_password
            )
            self._file_stamp = stamp
            after, before = _host_entries(fresh), _host_entries(self.topology)
            self.topology = fresh
            changed = {name for name in before if after.get(name) != before[name]}
            changed |= self.redirects.reconcile(fresh)
        return fresh, changed

    def following(self, shard: int, old: Host, moved: bool) -> Generator[str, object, bool]:
        """Whether ``shard`` (whose statement failed on ``old``) turned out to have moved and its new
        host is known: the reloaded topology names it, or ``old`` recorded a redirect, which is then
        followed until the file catches up. Without either, waits up to ``move_wait`` seconds for the
        file to say so. As steps its caller performs (the Router's ``follow_move``, the one loop):
        yields ``"reload"`` (reload the topology), ``"ask"`` (send back the old host's answer:
        (redirect, moved_out)) or ``"wait"`` (sleep FOLLOW_POLL seconds); returns the verdict."""
        deadline = time.monotonic() + self.move_wait
        asked = False
        while True:
            yield "reload"
            new = self.locate(shard)
            if (new.name, new.dsn) != (old.name, old.dsn):
                return True
            if not asked:  # the file does not know (yet): ask the host the statement failed on
                asked = True
                redirect, moved_out = yield "ask"  # type: ignore[misc]
                if redirect is not None and redirect["host"] != old.name:
                    self.redirects.follow(shard, redirect, self.topology, old)
                    return True
                # A missing table may be an application bug: only wait if the shard really moved away.
                moved = moved or moved_out
                if not moved:
                    return False
            if self.topology.path is None or time.monotonic() >= deadline:
                return False
            yield "wait"


class Redirects:
    """The shards a Router routes by the redirect their old host recorded at a move's cutover, because
    its own topology file still names the old host (another app server's copy nobody updated). Each
    is kept until the file names another owner for the shard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # shard → (host to use, owner the file named)
        self._by_shard: dict[int, tuple[Host, str]] = {}
        self._foreign: set[str] = set()  # hosts known only from a redirect: its DSN, no password

    def host(self, shard: int) -> Host | None:
        entry = self._by_shard.get(shard)
        return None if entry is None else entry[0]

    def names(self) -> dict[int, str]:
        return {n: host.name for n, (host, _) in dict(self._by_shard).items()}

    def foreign(self, name: str) -> bool:
        return name in self._foreign

    def follow(self, shard: int, redirect: dict, topology: Topology, old: Host) -> None:
        """Route ``shard`` to the redirect's host: the topology's own entry for it (its DSN and
        ``password_env``) when there is one, else the recorded DSN, without a password."""
        name = redirect["host"]
        host = next((h for h in topology.hosts if h.name == name), None)
        adoption = topology.adoption
        if host is None and adoption is not None and adoption.source is not None:
            # an aborted adoption's fleet host sends its Routers back to the old database
            host = adoption.source if adoption.source.name == name else None
        with self._lock:
            if host is None:
                host = Host(name=name, dsn=redirect["dsn"], shards=[])
                self._foreign.add(name)
            if self._by_shard.get(shard, (None,))[0] == host:
                return  # another thread followed it already
            self._by_shard[shard] = (host, file_owner(topology, shard).name)
        log.warning(
            "shard %s moved from %s to %s (redirect recorded by %s; this Router's topology file still "
            "names %s)%s",
            shard,
            old.name,
            name,
            old.name,
            file_owner(topology, shard).name,
            f": {name} is not in this Router's topology, connecting with the recorded DSN "
            f"{mask(redirect['dsn'])} without a password"
            if name in self._foreign
            else "",
        )

    def reconcile(self, fresh: Topology) -> set[str]:
        """After the file was read again: forget the shards it caught up with (it names another owner
        than when the redirect was followed); the others go on with the file's current entry for their
        host. Returns the foreign hosts the file now has (their pools must be replaced)."""
        by_name = {h.name: h for h in fresh.hosts}
        with self._lock:
            self._by_shard = {
                n: (by_name.get(host.name, host), was)
                for n, (host, was) in self._by_shard.items()
                if file_owner(fresh, n).name == was
            }
            known = {name for name in self._foreign if name in by_name}
            self._foreign -= known
        return known


def route_old_id(topology: Topology, value: int, table: str | None) -> int | IdLookup:
    """The shard of an object by its ID: inside a ``next_id()`` ID; for a pre-adoption ID (below
    ``adoption.id_floor``) its key's: the ID itself for the root table, else a lookup's.

    Looked up while the old database is authoritative too, though any shard is the old database
    then: the call may run after the cutover's flip (its host is located later, from the file), and
    only the row's own shard finds it on the fleet."""
    adoption = topology.adoption
    if adoption is None or type(value) is not int or not adoption.is_old_id(value):
        return topology.layout.shard_of(value)
    found = adopted_table(adoption, table, value)
    shard = root_shard(found, value, topology.modulus)
    if shard is not None:
        return shard
    if not adoption.on_source and adoption.id_map is None:
        raise BadInput(
            f"{value} is a pre-adoption ID of {found.name}, and the topology's adoption names no "
            f"id_map to find its key in"
        )
    return IdLookup(found, value)


def lookup_host(topology: Topology) -> Host:
    """Where a pre-adoption ID's key is read (:class:`IdLookup`): the old database while it is
    authoritative (it holds every row, one written a moment ago too, which the id map may not have
    yet), else the id map (:func:`id_map_host`)."""
    adoption = topology.adoption
    if adoption is not None and adoption.on_source and adoption.source is not None:
        return adoption.source
    return id_map_host(topology)


def lookup_fallback(topology: Topology, host: Host, exc: BaseException) -> Host | None:
    """The id map, when a lookup on the old database (``host``) met its tables gone (``exc``: moved
    away at a cutover the file does not show yet, or renamed); None: ``exc`` stands."""
    adoption = topology.adoption
    if (
        adoption is None
        or adoption.id_map is None
        or not is_source(topology, host)
        or getattr(exc, "sqlstate", None) not in MOVED_ERRORS
    ):
        return None
    return id_map_host(topology)


def id_map_host(topology: Topology) -> Host:
    """The id map database (``adoption.id_map``, else its default place) as a host: its fleet host's
    DSN, ``dbname`` its own."""
    id_map = topology.id_map_place()
    host = topology.host(id_map.host)
    return Host(
        name=f"{host.name}/{id_map.dbname}",
        dsn=psycopg.conninfo.make_conninfo(host.dsn, dbname=id_map.dbname),
        shards=[],
        password_env=host.password_env,
        pooler=host.pooler,
    )


def _host_list(topology: Topology) -> list[Host]:
    """The fleet's hosts and, while an adoption names it, the adopted old database."""
    hosts = list(topology.hosts)
    if topology.adoption is not None and topology.adoption.source is not None:
        hosts.append(topology.adoption.source)
    return hosts


def _host_entries(topology: Topology) -> dict[str, tuple]:
    """Each host's connection settings by name, the adopted old database's included: a pool whose
    entry changed or left is closed at a reload."""
    return {h.name: (h.dsn, h.password_env, h.standby, h.pooler) for h in _host_list(topology)}


def _file_stamp(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of the topology file: a flip (rename) or an edit changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class RouterOptions:
    """The settings of a :class:`~shardctl.router.Router` or an
    :class:`~shardctl.router.AsyncRouter`: both take these fields as keyword arguments. A new
    Router option is a field here."""

    max_size: int = 8  # connections per host pool
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT  # seconds
    pool_timeout: float = 30.0  # how long a call waits for a free pooled connection, seconds
    move_wait: float = 10.0  # how long to wait for the topology file to show a move's cutover
    allow_inline_password: bool = False
    timeout: float | None = 30.0  # default bound of every call, seconds (None: unbounded)
    # the client's deadline is timeout + grace (the server's own statement_timeout fires first)
    grace: float = 0.5
    max_lag: float = 5.0  # default staleness bound of standby reads, seconds
    lag_check_interval: float = 0.2  # how often a standby's lag is measured, seconds


class Routing:
    """What :class:`~shardctl.router.Router` and :class:`~shardctl.router.AsyncRouter` share: the
    options, the routing rule (key, id or shard → shard → host) and the per-call defaults."""

    pool_class: type[PoolBase] = HostPool  # the AsyncRouter's: AsyncHostPool

    def __init__(self, topology: Topology, options: RouterOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        # the pools of hosts' primaries, and of their standbys, by host name (made by _pool)
        self._pools: dict[str, Any] = {}
        self._standby_pools: dict[str, Any] = {}
        # the host this thread's (task's) last call went to: follow_move's default
        self._tried: contextvars.ContextVar[Host | None] = contextvars.ContextVar(
            "shardctl_router_tried", default=None
        )
        # Where each shard is: the topology file, and the redirects followed while the file is stale.
        self.placement = Placement(
            topology,
            move_wait=options.move_wait,
            allow_inline_password=options.allow_inline_password,
        )

    @property
    def topology(self) -> Topology:
        return self.placement.topology

    def _pool(self, host: Host, *, standby: bool = False) -> Any:
        """The pool of ``host``'s primary (or standby), made on first use; its connections come from the
        Router's ``_connect``."""
        pools = self._standby_pools if standby else self._pools
        pool = pools.get(host.name)
        if pool is not None:
            return pool
        with self._lock:
            pool = pools.get(host.name)
            if pool is None:
                pool = pools[host.name] = self.pool_class(
                    host.name,
                    "standby" if standby else "primary",
                    functools.partial(self._connect, host, standby),  # type: ignore[attr-defined]
                    self.options.max_size,
                    self.options.pool_timeout,
                )
        return pool

    @contextmanager
    def _connecting(self, host: Host, standby: bool) -> Iterator[dict[str, Any]]:
        """What both Routers connect with: connect timeout, TCP keepalives and user timeout (a dead network is
        noticed), and no startup options (poolers refuse them; each transaction sets its own
        ``statement_timeout``). A host known only from a redirect has no password here: its failure to
        connect says so (``foreign_connect_error``)."""
        kwargs = host.connect_kwargs(
            connect_timeout=max(1, int(self.options.connect_timeout)),
            application_name=f"{APPLICATION_NAME} router",
        )
        if standby:
            kwargs["conninfo"] = host.standby
        kwargs.update(
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=int(
                1000 * max(10.0, (self.options.timeout or 0) + self.options.grace)
            ),
        )
        foreign = not standby and self.placement.redirects.foreign(host.name)
        try:
            yield kwargs
        except psycopg.OperationalError as exc:
            if not foreign:
                raise
            raise foreign_connect_error(host, exc) from None

    @staticmethod
    def _pooled(conn: Any, host: Host, server_cursor_factory: type) -> Any:
        """A new connection, marked as the Router's: its server cursors, and whether its host keeps
        server sessions (prepared statements stay off until a call allows them)."""
        conn.server_cursor_factory = server_cursor_factory
        conn.keeps_sessions = host.keeps_sessions
        conn.prepare_threshold = None
        return conn

    def shard_for(self, key: int | str, *, force_string: bool = False) -> int:
        """Integer keys: ``key % modulus``; strings: ``md5(key) mod modulus``. On an adopted fleet an
        integer key at or above the ID floor is a new ID: its bits name the shard
        (:func:`old_ids.shard_of_key`)."""
        return shard_of_key(self.topology, key, force_string=force_string)

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
        """An object's own ID names its shard; a pre-adoption ID (a root row's ID, or a key column
        holding one) is its own key: ``id % modulus`` (:func:`old_ids.shard_of_id`)."""
        return id_shard(self.topology, id_value)

    def _locate(self, shard: int) -> Host:
        """The host serving ``shard``: a redirect this Router followed, else the topology's owner.
        While an adoption names its old database (from the copy to the cleanup), the file is looked at
        first (one ``stat``): the cutover's flip, and its abort's flip back, are seen by the next
        call, reads included, which the tables left behind still answer."""
        self._look_at_file()
        return self.placement.locate(shard)

    def _look_at_file(self) -> None:
        """While an adoption names its old database, reload the topology file if it changed."""
        adoption = self.placement.topology.adoption
        if adoption is not None and adoption.source is not None:
            try:
                self.reload()
            except ConfigError as exc:  # a file edited badly: route by the last good one
                log.warning("topology file not reloaded: %s", exc)

    def lookup_host(self) -> Host:
        """Where a pre-adoption ID's key is read (:class:`IdLookup`), the file looked at first: the
        old database while it is authoritative (it holds every row, a row written a moment ago
        too, which the id map may not have yet; from the cutover's freeze on, its keys are the
        fleet's), else the id map (:meth:`id_map_host`), which the freeze waited for."""
        self._look_at_file()
        return lookup_host(self.topology)

    def redirects(self) -> dict[int, str]:
        """Shards this Router routes by a redirect (its topology file still names the old host) → host name."""
        return self.placement.redirects.names()

    def target(
        self,
        key: Key = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
    ) -> int:
        """The shard a call goes to: exactly one of ``key`` (the topology's routing rule), ``id`` (an ID
        minted by ``next_id()``: the shard inside it; a pre-adoption ID with its ``table``: see
        :meth:`route`), ``shard`` (a shard number) or ``global_`` (:data:`GLOBAL`, the global tables);
        ``force_string``: route an int ``key`` as its digits. A pre-adoption ID of a non-root table
        needs a lookup of its key: the Router's calls and ``resolve()`` make it; here it is BadInput."""
        found = self.route(
            key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
        )
        if isinstance(found, IdLookup):
            raise BadInput(
                f"{id} is a pre-adoption ID of {found.table.name}: its shard is looked up in the id "
                f"map (on the old database while it is authoritative): use the Router's calls or "
                f"resolve(id=..., table=...)"
            )
        return found

    def route(
        self,
        key: Key = None,
        *,
        id: int | None = None,
        shard: int | None = None,
        force_string: bool = False,
        table: str | None = None,
        global_: bool = False,
    ) -> int | IdLookup:
        """:meth:`target` without I/O: the shard, or the :class:`IdLookup` a pre-adoption ID of a
        non-root table needs (its key is looked up: :meth:`lookup_host`)."""
        given = [
            name
            for name, value in (
                ("key", key),
                ("id", id),
                ("shard", shard),
                ("global_", global_ or None),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise BadInput(
                f"route by exactly one of key=, id= or shard= (got {', '.join(given) or 'none'}); "
                f"global_=True for the global tables"
            )
        if key is not None:
            return self.shard_for(key, force_string=force_string)
        if global_:
            return GLOBAL
        if id is not None:
            return route_old_id(self.topology, id, table)
        if (
            isinstance(shard, bool)
            or not isinstance(shard, int)
            or not 0 <= shard < self.topology.shard_count
        ):
            raise BadInput(
                f"shard={shard!r} is not a shard of this topology (0-{self.topology.shard_count - 1})"
            )
        return shard

    def id_map_host(self) -> Host:
        """The id map database of the topology's adoption, as a host (:func:`id_map_host`)."""
        return id_map_host(self.topology)

    def shard_of_key(self, key: int | None, lookup: IdLookup) -> int:
        """The shard of the key a lookup gave for ``lookup`` (an ID-valued key, placed as
        :meth:`shard_of_id` places it; None: no such row anywhere, so any shard answers "not
        found"; the ID's own remainder is used)."""
        if key is None:
            return shard_for_key(lookup.id, self.topology.modulus)
        return self.shard_for(key)

    def _call(
        self,
        kind: str,
        shard: int,
        timeout: float | None = SAME,
        *,
        readonly: bool = False,
        max_lag: float | None = SAME,
    ) -> Call:
        """What a call of ``kind`` (``Call.kind``) asks of ``shard`` (:meth:`target`): its schema, its
        ``timeout`` and, when it reads only, its lag bound ``max_lag`` (the Router's unless given).
        The Routers' methods take these as keyword-only arguments and pass them here."""
        host = self._locate(shard)
        return Call(
            self.placement.schema_on(host, shard),
            self._timeout(timeout),
            kind,
            readonly,
            self._lag_bound(max_lag) if readonly else None,
            self.placement.redirect_check(host, shard),
        )

    def _on(self, host: Host, shard: int, call: Call) -> Call:
        """``call`` with the schema ``shard`` has on ``host`` (:meth:`Placement.schema_on`) and its
        redirect check there: a retry after the cutover of an adoption goes from the old database's
        schema to the shard's, one after an abort from the fleet to the old database."""
        schema = self.placement.schema_on(host, shard)
        checked = self.placement.redirect_check(host, shard)
        if (schema, checked) == (call.schema, call.checked):
            return call
        return dataclasses.replace(call, schema=schema, checked=checked)

    def _timeout(self, timeout: Any) -> float | None:
        return self.options.timeout if timeout is SAME else timeout

    def _lag_bound(self, max_lag: Any) -> float | None:
        return self.options.max_lag if max_lag is SAME else max_lag

    def reload(self) -> Topology:
        """Read the topology file again (when it changed); pools of hosts that left or changed DSN are closed."""
        fresh, changed = self.placement.reload()
        if changed:
            with self._lock:
                old_pools = [
                    pools.pop(name)
                    for pools in (self._pools, self._standby_pools)
                    for name in changed
                    if name in pools
                ]
            for pool in old_pools:
                pool.close()
        return fresh

    def _take_pools(self) -> list[Any]:
        """Every pool, forgotten (the Router closes them)."""
        with self._lock:
            pools = [*self._pools.values(), *self._standby_pools.values()]
            self._pools, self._standby_pools = {}, {}
        return pools

    def stats(self) -> dict[str, dict]:
        """Per host: pool usage, calls, errors by kind, breaker state and latency percentiles (ms) of
        its primary, and under ``"standby"`` the same for its standby (with the last lag seen)."""
        with self._lock:
            pools, standbys = dict(self._pools), dict(self._standby_pools)
        out: dict[str, dict] = {}
        for host in _host_list(self.topology):
            primary = pools.get(host.name) or self._unused(host.name, "primary")
            doc = primary.stats()
            standby = standbys.get(host.name) or (
                self._unused(host.name, "standby") if host.standby else None
            )
            doc["standby"] = standby.stats() if standby else None
            out[host.name] = doc
        return out

    def _unused(self, name: str, role: str) -> PoolBase:
        """A pool never used (nothing opened): for :meth:`stats`' zeros."""
        return HostPool(name, role, lambda: None, self.options.max_size, self.options.pool_timeout)  # type: ignore[arg-type,return-value]
