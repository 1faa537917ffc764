"""Moving logical shards between hosts online (prepare, sync, cutover, cleanup, abort).

``state`` (phases and shard states, the transition table) · ``run`` (records, locks, the run's
context) · ``prepare`` · ``sync`` · ``cutover`` · ``abort`` · ``cleanup`` · ``report`` (the typed
report the phases fill in) · ``api`` (the public functions).
"""

from ...lazy import lazy_exports

# Imported on first use (as the package ``shardctl`` does): ``state`` (the phases, which the CLI's
# options list) loads without psycopg, the rest only when a move runs.
_API = (
    "MoveReport",
    "MoveStatus",
    "abort_move",
    "cleanup_move",
    "move_shards",
    "move_status",
    "parse_range",
    "pending_moves",
)
_RUN = ("MOVE_LOCK_CLASS", "MoveOptions", "Progress")
_STATE = ("PHASE_NAMES", "Phase", "ShardState")
_LAZY_MODULES = {"api": _API, "run": _RUN, "state": _STATE}

__all__ = [*_API, *_RUN, *_STATE]  # noqa: PLE0604 (names, listed once above)

__getattr__ = lazy_exports(__name__, _LAZY_MODULES)
