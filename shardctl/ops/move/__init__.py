"""Moving logical shards between hosts online (prepare, sync, cutover, cleanup, abort).

``state`` (phases and shard states, the transition table) · ``run`` (records, locks, the run's
context) · ``prepare`` · ``sync`` · ``cutover`` · ``abort`` · ``cleanup`` · ``api`` (the public
functions).
"""

from .api import (
    MoveReport,
    MoveStatus,
    RecordedMove,
    abort_move,
    cleanup_move,
    move_shards,
    move_status,
    parse_range,
    pending_moves,
)
from .run import MOVE_LOCK_CLASS, MoveOptions, Progress
from .state import PHASE_NAMES, Phase, ShardState

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
