"""Moving logical shards between hosts online (prepare, sync, cutover, cleanup, abort).

``state`` (phases and shard states, the transition table) · ``run`` (records, locks, the run's
context) · ``prepare`` · ``sync`` · ``cutover`` · ``abort`` · ``cleanup`` · ``api`` (the public
functions).
"""

from ...lazy import lazy_exports

# Imported on first use (as the package ``shardctl`` does): ``state`` (the phases, which the CLI's
# options list) loads without psycopg, the rest only when a move runs.
_LAZY_MODULES = {
    "api": (
        "MoveReport",
        "MoveStatus",
        "RecordedMove",
        "abort_move",
        "cleanup_move",
        "move_shards",
        "move_status",
        "parse_range",
        "pending_moves",
    ),
    "run": ("MOVE_LOCK_CLASS", "MoveOptions", "Progress"),
    "state": ("PHASE_NAMES", "Phase", "ShardState"),
}


__all__ = [
    "MOVE_LOCK_CLASS",
    "PHASE_NAMES",
    "MoveOptions",
    "MoveReport",
    "MoveStatus",
    "Phase",
    "Progress",
    "RecordedMove",
    "ShardState",
    "abort_move",
    "cleanup_move",
    "move_shards",
    "move_status",
    "parse_range",
    "pending_moves",
]

__getattr__ = lazy_exports(__name__, _LAZY_MODULES)
