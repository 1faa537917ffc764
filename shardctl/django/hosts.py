"""One host's ``DATABASES`` entry."""

from __future__ import annotations

from typing import Any

import psycopg

from ..model.topology import Host

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
    entry = {
        "ENGINE": BACKEND,
        "NAME": parts.pop("dbname", ""),
        "USER": parts.pop("user", ""),
        "PASSWORD": parts.pop("password", ""),
        "HOST": parts.pop("host", ""),
        "PORT": parts.pop("port", ""),
        "CONN_MAX_AGE": conn_max_age,
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "OPTIONS": {**parts, "prepare_threshold": None},
        "SHARDCTL_HOST": host.name,
        "SHARDCTL_DSN": host.dsn,
    }
    return entry
