"""Moving logical shards between hosts online (prepare, sync, cutover, cleanup, abort)."""

from .api import (MOVE_LOCK_CLASS, PHASE_NAMES, MoveOptions, abort_move, cleanup_move, move_shards,
                  move_status, parse_range)

__all__ = ["MOVE_LOCK_CLASS", "PHASE_NAMES", "MoveOptions", "abort_move", "cleanup_move", "move_shards",
           "move_status", "parse_range"]
