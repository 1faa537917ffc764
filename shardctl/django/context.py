"""The shard a thread (or asyncio task) works on: a context variable set by :func:`on_shard`, and the
shardctl Router this Django project routes with. No Django import here: settings.py may use it."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput, ShardMoved
from ..model.topology import Host, Topology
from ..router import Router
from ..router.placement import Key
from .hosts import host_database


@dataclass(frozen=True, slots=True)
class Target:
    """Where statements go: the shard, its schema, its host and that host's Django alias, and the
    shard whose redirect each transaction looks for first (``Placement.redirect_check``)."""

    shard: int
    schema: str
    host: Host
    alias: str
    checked: int | None = None


_current: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "shardctl_django_shard", default=None
)
_lock = threading.Lock()
_state: dict[str, Any] = {"router": None, "path": None, "prefix": ""}
_aliases: dict[tuple[str, str], str] = {}  # (host name, dsn) -> its alias, once checked
_targets: dict[
    int, Target
] = {}  # shard -> its Target, valid while the placement gives the same Host


def configure(topology: str | Path | Topology, *, alias_prefix: str = "") -> Router:
    """The shardctl Router the Django integration routes with (``databases()`` calls this)."""
    topo = topology if isinstance(topology, Topology) else Topology.load(topology)
    with _lock:
        old = _state["router"]
        _state.update(router=Router(topo), path=topo.path, prefix=alias_prefix)
        _aliases.clear()
        _targets.clear()
    if old is not None:
        old.close()
    return _state["router"]


def router() -> Router:
    """The configured Router (``databases(path)`` or ``settings.SHARDCTL_TOPOLOGY``)."""
    r = _state["router"]
    if r is None:
        from django.conf import settings  # only when a Django project forgot to call databases()

        path = getattr(settings, "SHARDCTL_TOPOLOGY", None)
        if path is None:
            raise BadInput(
                "shardctl.django is not configured: DATABASES = shardctl.django.databases(path) "
                "in settings.py, or settings.SHARDCTL_TOPOLOGY"
            )
        r = configure(path)
    return r


def alias_of(host: Host, shard: int) -> str:
    """The Django database alias of a host (``<prefix><host name>``); a host met only through a move's
    redirect (or whose DSN changed) is registered with Django on first use. A DSN that changed under
    an atomic block on ``shard`` raises :class:`~shardctl.errors.ShardMoved` (retry the request)."""
    alias = _aliases.get((host.name, host.dsn))
    if alias is not None:
        return alias
    alias = _state["prefix"] + host.name
    from django.db import connections

    known = connections.settings.get(alias)
    if known is None or known.get("SHARDCTL_DSN") != host.dsn:
        with _lock:
            fresh = dict(host_database(host), ALIAS=alias)
            connections.settings[alias] = _complete(fresh)
            for seen in [k for k in _aliases if k[0] == host.name]:  # a DSN met before may return
                del _aliases[seen]
            if known is not None:  # the host's DSN changed: this thread reconnects
                stale = getattr(connections._connections, alias, None)
                if stale is not None and stale.in_atomic_block:
                    # closing it would end the block without its commit and without an error:
                    # the block's writes would be lost while the request reports success
                    raise ShardMoved(shard, host.name)
                if stale is not None:
                    stale.close()
                    delattr(connections._connections, alias)
    _aliases[(host.name, host.dsn)] = alias
    return alias


def _complete(entry: dict) -> dict:
    """An alias's settings with Django's defaults (what ConnectionHandler.configure_settings fills in)."""
    entry.pop("ALIAS", None)
    for key, value in (
        ("ATOMIC_REQUESTS", False),
        ("AUTOCOMMIT", True),
        ("CONN_MAX_AGE", 0),
        ("CONN_HEALTH_CHECKS", False),
        ("OPTIONS", {}),
        ("TIME_ZONE", None),
        ("NAME", ""),
        ("USER", ""),
        ("PASSWORD", ""),
        ("HOST", ""),
        ("PORT", ""),
        ("TEST", {}),
    ):
        entry.setdefault(key, value)
    return entry


def target(
    key: Key = None,
    *,
    id: int | None = None,
    shard: int | None = None,
    force_string: bool = False,
    table: str | None = None,
    global_: bool = False,
) -> Target:
    """The shard of exactly one of ``key`` (the topology's routing rule), ``id`` (an ID minted by
    ``next_id()``, or a pre-adoption ID with its ``table``), ``shard`` or ``global_`` (the global
    tables; the Router's keywords: ``force_string`` too), with its host as of now."""
    r = router()
    number = r.resolve(
        key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
    )
    return shard_target(number)


def shard_target(number: int) -> Target:
    """The Target of shard ``number`` (a shard of the topology, or the global tables), with its host
    as of now. Every ORM call routes through here, so the Target is kept until the placement gives
    the shard another Host (a move followed, the topology file reloaded, an adoption's flip)."""
    r = router()
    host = r._locate(number)
    known = _targets.get(number)
    if known is not None and known.host is host:
        return known
    made = Target(
        number,
        r.placement.schema_on(host, number),
        host,
        alias_of(host, number),
        r.placement.redirect_check(host, number),
    )
    _targets[number] = made
    return made


def current() -> Target | None:
    """The shard this thread or task is on (the innermost :func:`on_shard`), or None."""
    return _current.get()


@contextmanager
def on_shard(
    key: Key = None,
    *,
    id: int | None = None,
    shard: int | None = None,
    force_string: bool = False,
    table: str | None = None,
    global_: bool = False,
) -> Iterator[Target]:
    """Run the block's ORM calls on one shard: by ``key``, ``id`` (with ``table`` for a pre-adoption
    ID), ``shard`` or ``global_`` (:func:`target`). Nestable: an inner block wins, and the outer
    one's shard is back when it ends (also on an exception)."""
    chosen = target(
        key, id=id, shard=shard, force_string=force_string, table=table, global_=global_
    )
    with _bound(_current, chosen) as on:
        yield on


@contextmanager
def no_shard() -> Iterator[None]:
    """A block on no shard (what the middleware gives each request)."""
    with _bound(_current, None):
        yield


@contextmanager
def _bound(var: contextvars.ContextVar[Any], value: Any) -> Iterator[Any]:
    """``var`` is ``value`` for the block; its value before is back when the block ends (also on an
    exception)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


_collecting: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "shardctl_django_collecting", default=False
)


def collecting() -> bool:
    """True while ``shardctl_makemigrations`` collects the sharded models' SQL."""
    return _collecting.get()


@contextmanager
def collecting_sql() -> Iterator[None]:
    with _bound(_collecting, True):
        yield
