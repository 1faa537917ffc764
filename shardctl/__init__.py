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

# The fleet operations: each takes a Topology (add_host / add_shard: a Topology loaded from its file, or
# the path) and returns a typed result with ``ok``, ``to_dict()`` and ``raise_for_status()`` (which raises
# the error the CLI maps to its exit code). docs/architecture.md#library-api lists them.
_OPERATIONS = {
    "init": ("ops.provision", "init"),
    "migrate": ("ops.migrate", "migrate"),
    "plan": ("ops.plan", "plan"),
    "verify": ("ops.verify", "verify"),
    "status": ("ops.status", "status"),
    "add_host": ("ops.grow", "add_host"),
    "add_shard": ("ops.grow", "add_shard"),
    "redeploy": ("ops.redeploy", "redeploy"),
    "rebalance_plan": ("ops.rebalance", "plan_report"),
    "rebalance": ("ops.rebalance", "apply"),
    "move_shards": ("ops.move", "move_shards"),
    "abort_move": ("ops.move", "abort_move"),
    "cleanup_move": ("ops.move", "cleanup_move"),
    "move_status": ("ops.move", "move_status"),
    "check_against_base": ("ops.gate", "check_against_base"),
    "import_history": ("ops.import_history", "import_history"),
}
_RESULTS = {
    "FleetReport": ("engine.fanout", "FleetReport"),
    "MigrateResult": ("ops.migrate", "MigrateResult"),
    "PlanResult": ("ops.plan", "PlanResult"),
    "VerifyReport": ("ops.verify", "VerifyReport"),
    "StatusReport": ("ops.status", "StatusReport"),
    "AddHostResult": ("ops.grow", "AddHostResult"),
    "AddShardResult": ("ops.grow", "AddShardResult"),
    "RedeployReport": ("ops.redeploy", "RedeployReport"),
    "RebalancePlan": ("ops.rebalance", "RebalancePlan"),
    "RebalanceResult": ("ops.rebalance", "RebalanceResult"),
    "GateResult": ("ops.gate", "GateResult"),
    "ImportResult": ("ops.import_history", "ImportResult"),
    "RunOptions": ("engine.executor", "RunOptions"),
    "MoveReport": ("ops.move", "MoveReport"),
    "MoveStatus": ("ops.move", "MoveStatus"),
    "MoveOptions": ("ops.move", "MoveOptions"),
}

# Imported on first use: they pull in psycopg, which the offline commands never load.
_LAZY = {
    "Router": ("router", "Router"),
    "AsyncRouter": ("router_async", "AsyncRouter"),
    "RouterOptions": ("router_placement", "RouterOptions"),
    **_OPERATIONS,
    **_RESULTS,
}

__all__ = [
    "AddHostResult",
    "AddShardResult",
    "AsyncRouter",
    "BadInput",
    "ConfigError",
    "FleetReport",
    "GateResult",
    "Host",
    "HostUnreachable",
    "ImportResult",
    "Layout",
    "MigrateResult",
    "MoveOptions",
    "MoveReport",
    "MoveStatus",
    "OperationFailed",
    "PendingWork",
    "PlanResult",
    "RebalancePlan",
    "RebalanceResult",
    "RedeployReport",
    "Router",
    "RouterOptions",
    "RunOptions",
    "ShardctlError",
    "StatusReport",
    "Topology",
    "VerifyReport",
    "__version__",
    "abort_move",
    "add_host",
    "add_shard",
    "check_against_base",
    "cleanup_move",
    "import_history",
    "init",
    "migrate",
    "move_shards",
    "move_status",
    "plan",
    "rebalance",
    "rebalance_plan",
    "redeploy",
    "status",
    "verify",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(name)
