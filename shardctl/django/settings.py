"""``DATABASES`` from a shardctl topology: one alias per host, each on the shardctl backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model.topology import Topology
from .context import configure
from .hosts import host_database


def databases(
    topology: str | Path | Topology,
    *,
    default: dict[str, Any] | None = None,
    alias_prefix: str = "",
    conn_max_age: int | None = 60,
) -> dict[str, dict[str, Any]]:
    """``DATABASES`` for settings.py: an alias per host of the topology (``<alias_prefix><host name>``),
    and ``default`` (your own database for Django's unsharded tables; else the first host's database,
    outside every shard, on Django's own postgresql backend). Also configures the Router that
    :func:`on_shard`, the models and the database router use."""
    topo = configure(topology, alias_prefix=alias_prefix).topology
    out: dict[str, dict[str, Any]] = {}
    for host in topo.hosts:
        out[alias_prefix + host.name] = host_database(host, conn_max_age=conn_max_age)
    if default is None:
        default = dict(
            out[alias_prefix + topo.hosts[0].name], ENGINE="django.db.backends.postgresql"
        )
        for key in ("SHARDCTL_HOST", "SHARDCTL_DSN"):
            default.pop(key)
    return {"default": default, **out}
