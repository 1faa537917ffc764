"""shardctl: provision and operate Instagram-style sharded PostgreSQL fleets."""

from .errors import (
    BadInput,
    ConfigError,
    HostUnreachable,
    OperationFailed,
    PendingWork,
    ShardctlError,
)
from .lazy import lazy_exports
from .model.layouts import Layout
from .model.topology import Host, Topology
from .version import __version__

# Imported on first use, from the module (in this package) that defines them: they pull in psycopg,
# which the offline commands never load. Each fleet operation (a function of an ops module) stands
# beside its result type: it takes a Topology (add_host / add_shard: a Topology loaded from its file,
# or the path) and returns a typed result with ``ok``, ``to_dict()`` and ``raise_for_status()`` (which
# raises the error the CLI maps to its exit code). docs/architecture.md#library-api lists them.
_LAZY_MODULES = {
    "router": ("Router", "AsyncRouter", "RouterOptions"),
    "engine.fanout": ("FleetReport",),
    "engine.executor": ("RunOptions",),
    "ops.provision": ("init",),
    "ops.migrate": ("migrate", "MigrateResult"),
    "ops.plan": ("plan", "PlanResult"),
    "ops.verify": ("verify", "VerifyReport"),
    "ops.status": ("status", "StatusReport"),
    "ops.grow": ("add_host", "add_shard", "AddHostResult", "AddShardResult"),
    "ops.redeploy": ("redeploy", "RedeployReport"),
    "ops.rebalance": ("rebalance_plan", "rebalance", "RebalancePlan", "RebalanceResult"),
    "ops.move": (
        "move_shards",
        "abort_move",
        "cleanup_move",
        "move_status",
        "MoveReport",
        "MoveStatus",
        "MoveOptions",
    ),
    "ops.gate": ("check_against_base", "GateResult"),
    "ops.import_history": ("import_history", "ImportResult"),
    "ops.adopt": ("adopt_plan", "adopt_baseline", "AdoptPlan", "BaselineResult"),
    "ops.adopt.copy": ("adopt_copy", "adopt_status", "AdoptCopyResult", "AdoptStatus"),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}
_OPERATIONS = tuple(
    name for name, module in _LAZY.items() if module[:4] == "ops." and name.islower()
)

__all__ = [
    "AddHostResult",
    "AddShardResult",
    "AdoptCopyResult",
    "AdoptPlan",
    "AdoptStatus",
    "AsyncRouter",
    "BadInput",
    "BaselineResult",
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
    "adopt_baseline",
    "adopt_copy",
    "adopt_plan",
    "adopt_status",
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

__getattr__ = lazy_exports(__name__, _LAZY_MODULES)
