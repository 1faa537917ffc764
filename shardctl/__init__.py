"""shardctl: provision and operate Instagram-style sharded PostgreSQL fleets."""

from .errors import (
    BadInput,
    ConfigError,
    HostUnreachable,
    OperationFailed,
    ShardctlError,
)
from .model.layouts import Layout
from .model.topology import Host, Topology

__version__ = "0.1.0"

__all__ = [
    "BadInput",
    "ConfigError",
    "Host",
    "HostUnreachable",
    "Layout",
    "OperationFailed",
    "Router",
    "ShardctlError",
    "Topology",
    "__version__",
]


def __getattr__(name: str):
    if name == "Router":  # imported lazily: it pulls in psycopg-pool
        from .router import Router

        return Router
    raise AttributeError(name)
