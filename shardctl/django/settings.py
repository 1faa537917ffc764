"""``DATABASES`` from a shardctl topology: one alias per host, each on the shardctl backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from ..model.topology import Host, Topology
from .context import configure

BACKEND = "shardctl.django.backend"


def host_database(host: Host, *, conn_max_age: int | None = 60) -> dict[str, Any]:
    """One host's ``DATABASES`` entry: its app DSN (the pooler's, when it has one), psycopg 3 on the
    shardctl backend, nothing prepared, no server-side cursors (they need a session or a transaction
    that a transaction pooler does not keep)."""
    kwargs = host.connect_kwargs("app")
    parts = psycopg.conninfo.conninfo_to_dict(kwargs.pop("conninfo"))  # type: ignore[arg-type]
    if "password" in kwargs:
        parts["password"] = kwargs.pop("password")
    kwargs.pop("client_encoding", None)  # Django sets UTF8 itself
    entry = {"ENGINE": BACKEND, "NAME": parts.pop("dbname", ""), "USER": parts.pop("user", ""),
             "PASSWORD": parts.pop("password", ""), "HOST": parts.pop("host", ""), "PORT": parts.pop("port", ""),
             "CONN_MAX_AGE": conn_max_age, "DISABLE_SERVER_SIDE_CURSORS": True,
             "OPTIONS": {**parts, "prepare_threshold": None}, "SHARDCTL_HOST": host.name, "SHARDCTL_DSN": host.dsn}
    return entry


def databases(topology: str | Path | Topology, *, default: dict[str, Any] | None = None, alias_prefix: str = "",
              conn_max_age: int | None = 60) -> dict[str, dict[str, Any]]:
    """``DATABASES`` for settings.py: an alias per host of the topology (``<alias_prefix><host name>``),
    and ``default`` (your own database for Django's unsharded tables; else the first host's database,
    outside every shard, on Django's own postgresql backend). Also configures the Router that
    :func:`on_shard`, the models and the database router use."""
    topo = configure(topology, alias_prefix=alias_prefix).topology
    out: dict[str, dict[str, Any]] = {}
    for host in topo.hosts:
        out[alias_prefix + host.name] = host_database(host, conn_max_age=conn_max_age)
    if default is None:
        default = dict(out[alias_prefix + topo.hosts[0].name], ENGINE="django.db.backends.postgresql")
        for key in ("SHARDCTL_HOST", "SHARDCTL_DSN"):
            default.pop(key)
    return {"default": default, **out}
