"""The states of a move and of a moving shard, and the one table of allowed phase transitions.

Both enums are ``str``-valued: their values are what ``shardctl.moves.phase`` and
``shardctl.shards.state`` store, so records written by earlier versions read the same.
"""

from __future__ import annotations

from enum import StrEnum

from ...errors import OperationFailed


class Phase(StrEnum):
    """A host's record of a move (``shardctl.moves.phase``), or the move's combined phase."""

    NEW = "new"  # nothing recorded yet (combined phase only)
    PREPARING = "preparing"
    PREPARED = "prepared"
    SYNCING = "syncing"
    SYNCED = "synced"
    CUT_OVER = "cut_over"
    CLEANED = "cleaned"
    ABORTING = "aborting"
    ABORTED = "aborted"


class ShardState(StrEnum):
    """A shard's row in ``shardctl.shards`` on one host."""

    ACTIVE = "active"
    MOVING_OUT = "moving_out"  # source, from prepare until the cutover (migrate refuses)
    MOVING_IN = "moving_in"  # target, until the cutover
    # renamed, guarded copy kept until cleanup (or a copy put aside by abort)
    MOVED_OUT = "moved_out"


# Role: "source" or "target". Every phase a host's record may go to from each phase (staying put is
# always allowed: a phase is re-recorded with more detail). The first entry is the forward path.
TRANSITIONS: dict[Phase, tuple[Phase, ...]] = {
    Phase.NEW: (Phase.PREPARING, Phase.ABORTED),
    Phase.PREPARING: (Phase.PREPARED, Phase.ABORTING, Phase.ABORTED),
    Phase.PREPARED: (Phase.SYNCING, Phase.ABORTING, Phase.ABORTED),
    Phase.SYNCING: (Phase.SYNCED, Phase.ABORTING, Phase.ABORTED),
    Phase.SYNCED: (Phase.CUT_OVER, Phase.ABORTING, Phase.ABORTED),
    Phase.CUT_OVER: (Phase.CLEANED, Phase.ABORTING, Phase.ABORTED),
    Phase.CLEANED: (),
    Phase.ABORTING: (Phase.ABORTED,),
    Phase.ABORTED: (),
}


def _forward() -> tuple[Phase, ...]:
    path, phase = [], Phase.NEW
    while TRANSITIONS[phase]:
        phase = TRANSITIONS[phase][0]
        path.append(phase)
    return tuple(path)


FORWARD: tuple[Phase, ...] = _forward()  # preparing … cleaned
# cleaned, aborted
FINISHED: tuple[Phase, ...] = tuple(p for p, nxt in TRANSITIONS.items() if not nxt)
# The phases a ``move-shard`` run executes (command words, not recorded phases).
PHASE_NAMES = ("prepare", "sync", "cutover")


def check_transition(role: str, old: str | None, new: Phase) -> None:
    """Refuse a record change the transition table does not allow (a bug, or a record edited by hand)."""
    current = Phase(old) if old else Phase.NEW
    if new != current and new not in TRANSITIONS[current]:
        raise OperationFailed(f"the {role}'s record of the move cannot go from {current} to {new}")


def combined_phase(source: str | None, target: str | None) -> Phase:
    """The move's phase from both hosts' records: the least advanced side, aborts and the cutover winning."""
    src = Phase(source) if source else None
    tgt = Phase(target) if target else None
    if Phase.ABORTING in (src, tgt):
        return Phase.ABORTING
    if src == Phase.ABORTED and tgt in (None, Phase.ABORTED):
        return Phase.ABORTED
    if Phase.ABORTED in (src, tgt):
        return Phase.ABORTING
    if src in (Phase.CUT_OVER, Phase.CLEANED):
        # The source's commit is the cutover: from then on the move is cut over, whatever the target says.
        return Phase.CLEANED if src == Phase.CLEANED and tgt == Phase.CLEANED else Phase.CUT_OVER
    known = [p for p in (src, tgt) if p in FORWARD]
    if not known:
        return Phase.NEW
    if tgt is None:
        return Phase.PREPARING
    return min(known, key=FORWARD.index)
