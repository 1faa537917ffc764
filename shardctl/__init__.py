"""shardctl: provision and operate Instagram-style sharded PostgreSQL fleets."""

from .errors import (
    BadInput,
    ConfigError,
    HostUnreachable,
    OperationFailed,
    PendingWork,
    ShardctlError,
)
from .model.layouts import Layout
from .model.topology import Host, Topology
from .version import __version__

__all__ = [
    "AsyncRouter",
    "BadInput",
    "ConfigError",
    "Host",
    "HostUnreachable",
    "Layout",
    "OperationFailed",
    "PendingWork",
    "Router",
    "ShardctlError",
    "Topology",
    "__version__",
    "import_history",
    "init",
    "migrate",
    "move_shards",
    "status",
    "verify",
]

# Imported on first use: they pull in psycopg, which the offline commands never load.
_LAZY = {
    "Router": ("router", "Router"),
    "AsyncRouter": ("router_async", "AsyncRouter"),
    "init": ("ops.provision", "init"),
    "import_history": ("ops.import_history", "import_history"),
    "migrate": ("ops.migrate", "migrate"),
    "verify": ("ops.verify", "verify"),
    "status": ("ops.status", "status"),
    "move_shards": ("ops.move", "move_shards"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(name)
