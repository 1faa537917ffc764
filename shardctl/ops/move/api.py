"""``move-shard``: move logical shards to another host online, losing no write.

Phases, each resumable and recorded in ``shardctl.moves`` on both hosts (see ``state``):
``prepare`` (``prepare.py``), ``sync`` (``sync.py``), ``cutover`` (``cutover.py``), then
``--cleanup`` (``cleanup.py``) or, any time before cleanup, ``--abort`` (``abort.py``).
This module holds the public functions: it finds or starts the move, takes the per-shard
locks, and runs the phases.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from ...engine import connections as db
from ...errors import BadInput, HostUnreachable, OperationFailed, ShardctlError
from ...model.documents import Result
from ...model.ranges import format_shards, parse_shards
from ...model.topology import Topology
from ...sql.catalog import replication
from .abort import abort
from .catchup import catch_up
from .cleanup import cleanup
from .cutover import cutover
from .prepare import prepare
from .report import MoveReport
from .run import (
    MOVE_LOCK_CLASS,
    Move,
    MoveOptions,
    MoveRun,
    Progress,
    find_moves,
    new_move_id,
    shard_locks,
)
from .state import FINISHED, PHASE_NAMES, Phase
from .sync import sync

STEPS: dict[str, Callable[[MoveRun], None]] = {
    "prepare": prepare,
    "sync": sync,
    "cutover": cutover,
    "abort": abort,
    "cleanup": cleanup,
    "catch-up": catch_up,
}


def _resolve(
    topo: Topology, shards: list[int] | None, move_id: str | None, options: MoveOptions
) -> Move:
    """The move an abort or cleanup is about: named by id, by its shards, or the only one in flight."""
    moves, _ = find_moves(topo, connect_timeout=options.connect_timeout)
    candidates = [m for m in moves.values() if m.active]
    if move_id:
        found = moves.get(move_id)
        if found is None:
            raise BadInput(f"no move {move_id} is recorded on any host (see move-shard --status)")
        return found
    if shards is not None:
        overlapping = [m for m in candidates if set(m.shards) & set(shards)]
        exact = [m for m in overlapping if set(m.shards) == set(shards)]
        if exact:
            return exact[0]
        if len(overlapping) == 1:
            return overlapping[0]
        if overlapping:
            raise BadInput(
                f"shards {format_shards(shards)} overlap several moves "
                f"({', '.join(m.move_id for m in overlapping)}): name one with --move"
            )
        raise BadInput(
            f"no move in progress holds shards {format_shards(shards)} (see move-shard --status)"
        )
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise BadInput("no move is in progress")
    raise BadInput(
        f"{len(candidates)} moves are in progress ({', '.join(m.move_id for m in candidates)}): "
        f"give the shard range or --move"
    )


def _check_request(topo: Topology, shards: list[int], phases: list[str]) -> None:
    unknown = [p for p in phases if p not in PHASE_NAMES]
    if unknown:
        raise BadInput(f"unknown phase {unknown[0]!r} (phases: {', '.join(PHASE_NAMES)})")
    if not shards:
        raise BadInput("no shards to move")
    beyond = [n for n in shards if n >= topo.shard_count]
    if beyond:
        raise BadInput(
            f"shards {format_shards(beyond)} are not in this topology (0..{topo.shard_count - 1})"
        )


def _find_or_start(
    topo: Topology, shards: list[int], target: str, phases: list[str], options: MoveOptions
) -> Move | MoveReport:
    """The recorded move of exactly these shards to ``target``, or a new one; a report when there is
    nothing to do."""
    target_host = topo.host(target)
    moves, _ = find_moves(topo, connect_timeout=options.connect_timeout)
    overlapping = [m for m in moves.values() if m.active and set(m.shards) & set(shards)]
    exact = [m for m in overlapping if set(m.shards) == set(shards) and m.target == target]
    if exact:
        if exact[0].phase == Phase.ABORTING:
            raise OperationFailed(
                f"move {exact[0].move_id} is being aborted: run move-shard --abort again to finish"
            )
        return exact[0]
    if overlapping:
        m = overlapping[0]
        raise OperationFailed(
            f"shards {format_shards(sorted(set(m.shards) & set(shards)))} are part of move "
            f"{m.move_id} ({format_shards(m.shards)} from {m.source} to {m.target}, phase "
            f"{m.phase}): finish it (or --abort it) first"
        )
    owners = sorted({topo.host_of(n).name for n in shards})
    if owners == [target]:
        return MoveReport(
            shards=format_shards(shards),
            source=target,
            target=target,
            phase="nothing to do",
            nothing_to_do=True,
            messages=[f"shards {format_shards(shards)} are already on {target}: nothing was done"],
        )
    if len(owners) > 1:
        raise BadInput(
            f"shards {format_shards(shards)} live on {', '.join(owners)}: move the shards of one "
            f"source host at a time"
        )
    if phases[0] != "prepare":
        raise OperationFailed(
            f"no move of shards {format_shards(shards)} to {target} has been prepared: run "
            f"the prepare phase first"
        )
    return Move(new_move_id(), sorted(shards), owners[0], target_host.name)


def _refresh(run: MoveRun) -> None:
    """Re-read the move under the locks: another run may have advanced it meanwhile."""
    if not run.move.phases:
        return
    fresh, _ = find_moves(
        run.topo,
        [run.source, run.target],
        run.options.connect_timeout,
        required=(run.source.name, run.target.name),
    )
    run.move = fresh.get(run.move.move_id, run.move)


def _run_steps(run: MoveRun, steps: list[str]) -> MoveReport:
    with shard_locks([run.source, run.target], run.move.shards, run.options):
        _refresh(run)
        for name in steps:
            try:
                _guarded(run, name)
            except ShardctlError as exc:
                if name in PHASE_NAMES and run.move.phases and run.move.phase not in FINISHED:
                    exc.next_step = (
                        f"move {run.move.move_id} is in phase {run.move.phase}: run the command "
                        f"again to resume, or roll it back with move-shard --abort"
                    )
                raise
        if any(name in ("cutover", "cleanup") for name in steps):
            _guarded(run, "catch-up")  # the moved shards to the fleet's version (migrate held them)
    run.report.phase = str(run.move.phase)
    run.report.seconds = round(time.perf_counter() - run.started, 3)
    if run.pacers:
        run.report.nice, run.report.rested_seconds = run.options.nice, run.rested()
    return run.report


def _guarded(run: MoveRun, name: str) -> None:
    """Run a step; a database error nobody expected becomes a one-line, masked OperationFailed."""
    try:
        STEPS[name](run)
    except psycopg.Error as exc:
        raise OperationFailed(f"{name}: {db.first_line(exc)}") from exc


def move_shards(
    topo: Topology,
    shards: list[int],
    target: str,
    *,
    phases: list[str] | None = None,
    options: MoveOptions | None = None,
    progress: Progress | None = None,
) -> MoveReport:
    """Run the move's phases (default prepare, sync, cutover), starting or resuming the move of ``shards``
    to host ``target``. Returns the report (``freeze_seconds``, ``sync_seconds``, …)."""
    options = options or MoveOptions()
    phases = list(phases or PHASE_NAMES)
    _check_request(topo, shards, phases)
    move = _find_or_start(topo, shards, target, phases, options)
    if isinstance(move, MoveReport):
        return move
    return _run_steps(MoveRun(topo, move, options, progress), phases)


def abort_move(
    topo: Topology,
    *,
    shards: list[int] | None = None,
    move_id: str | None = None,
    options: MoveOptions | None = None,
    progress: Progress | None = None,
) -> MoveReport:
    """Roll a move back (any time before cleanup): the source is authoritative again. The move is
    named by ``shards`` (its shards) or ``move_id``."""
    return _run_on_recorded(topo, "abort", shards, move_id, options, progress)


def cleanup_move(
    topo: Topology,
    *,
    shards: list[int] | None = None,
    move_id: str | None = None,
    options: MoveOptions | None = None,
    progress: Progress | None = None,
) -> MoveReport:
    """Drop the renamed source schemas (and any replication object) of a cut-over move, named by
    ``shards`` or ``move_id``."""
    return _run_on_recorded(topo, "cleanup", shards, move_id, options, progress)


def _run_on_recorded(
    topo: Topology,
    step: str,
    shards: list[int] | None,
    move_id: str | None,
    options: MoveOptions | None,
    progress: Progress | None,
) -> MoveReport:
    """Run ``step`` (abort or cleanup) on the recorded move that ``shards`` or ``move_id`` names."""
    options = options or MoveOptions()
    found = _resolve(topo, shards, move_id, options)
    return _run_steps(MoveRun(topo, found, options, progress), [step])


def next_step(topo: Topology, move: Move) -> str | None:
    """What a move still needs, as the command to run (None when it needs nothing). A crash at any point
    leaves a recorded move that says this; Routers meanwhile find the shards through the redirects the
    source wrote at its commit."""
    phase, shards = move.phase, format_shards(move.shards)
    if phase == Phase.CUT_OVER:
        flipped = all(topo.host_of(n).name == move.target for n in move.shards)
        if (
            move.phases.get("target") != Phase.CUT_OVER
            or not flipped
            or not move.detail.get("switched")
        ):
            return (
                f"the source committed the cutover but the switch is unfinished (target activated: "
                f"{move.phases.get('target') == Phase.CUT_OVER}, topology flipped: {flipped}, replication "
                f"dropped: {bool(move.detail.get('switched'))}): run shardctl move-shard {shards} "
                f"--to {move.target}"
            )
        return f"cut over; drop the source's old copies with shardctl move-shard --cleanup --move {move.move_id}"
    if phase == Phase.ABORTING:
        return f"an abort is unfinished: run shardctl move-shard --abort --move {move.move_id}"
    if phase in (Phase.NEW, Phase.PREPARING, Phase.PREPARED, Phase.SYNCING, Phase.SYNCED):
        return (
            f"in flight (migrate waits for it): finish with shardctl move-shard {shards} --to {move.target}, "
            f"or roll back with shardctl move-shard --abort --move {move.move_id}"
        )
    return None


def pending_moves(
    topo: Topology, *, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
) -> list[str]:
    """One line per recorded move that needs a command to finish (for ``status`` and other fleet commands)."""
    moves, _ = find_moves(topo, connect_timeout=connect_timeout)
    out = []
    for move in sorted(moves.values(), key=lambda m: str(m.started_at)):
        step = next_step(topo, move) if move.active else None
        if step and not step.startswith("cut over;"):
            out.append(
                f"move {move.move_id} (shards {format_shards(move.shards)} {move.source} → {move.target}, "
                f"phase {move.phase}): {step}"
            )
    return out


@dataclass
class MoveStatus(Result):
    """The result of :func:`move_status`: every recorded move (its record, the command it still needs
    as ``next``, and live sync progress for moves in flight), how many are in flight, the ones that need
    a command to finish, and the hosts that did not answer (``raise_for_status`` raises for those)."""

    command = "move-shard --status"

    moves: list[dict[str, Any]]
    in_flight: int
    needs_finishing: list[str]
    unreachable: dict[str, str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.unreachable

    def raise_for_status(self) -> MoveStatus:
        if self.unreachable:
            raise HostUnreachable(
                ", ".join(self.unreachable),
                "; ".join(f"{h}: {e}" for h, e in self.unreachable.items()),
                report=self.to_dict(),
            )
        return self


def move_status(
    topo: Topology,
    *,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    include_finished: bool = True,
) -> MoveStatus:
    """Every recorded move, with live sync progress and lag for moves in flight."""
    started = time.perf_counter()
    moves, errors = find_moves(topo, connect_timeout=connect_timeout)
    out = []
    for move in sorted(moves.values(), key=lambda m: str(m.started_at)):
        if not include_finished and not move.active:
            continue
        doc = move.to_dict()
        doc["next"] = next_step(topo, move) if move.active else None
        if move.phase in (Phase.SYNCING, Phase.SYNCED) and move.names:
            try:
                doc.update(_live_sync(topo, move, connect_timeout))
            except (HostUnreachable, psycopg.Error, BadInput) as exc:
                doc["error"] = getattr(exc, "reason", None) or db.first_line(exc)
        out.append(doc)
    return MoveStatus(
        moves=out,
        in_flight=sum(1 for m in moves.values() if m.active),
        needs_finishing=[
            f"{m['move_id']}: {m['next']}"
            for m in out
            if m["next"] and not m["next"].startswith("cut over;")
        ],
        unreachable=errors,
        seconds=time.perf_counter() - started,
    )


def _live_sync(topo: Topology, move: Move, connect_timeout: int) -> dict:
    def connect(host: str) -> psycopg.Connection:
        return db.connect(
            topo.host(host),
            autocommit=True,
            connect_timeout=connect_timeout,
            purpose="move-shard status",
        )

    with connect(move.target) as conn:
        state = replication.sync_state(conn, move.names)
    doc = {
        "tables_ready": state["ready"],
        "tables": state["tables"],
        "replication_errors": state["apply_errors"] + state["sync_errors"],
    }
    with connect(move.source) as conn:
        doc["lag_bytes"] = replication.slot_lag(conn, move.names)
    return doc


def parse_range(spec: str, topo: Topology) -> list[int]:
    """Shard numbers from a range like ``0-15,32``, within the topology's shard count."""
    try:
        return parse_shards(spec, limit=topo.shard_count)
    except ValueError as exc:
        raise BadInput(f"shard range {spec!r}: {exc}") from None


__all__ = [
    "MOVE_LOCK_CLASS",
    "PHASE_NAMES",
    "Move",
    "MoveOptions",
    "abort_move",
    "cleanup_move",
    "find_moves",
    "move_shards",
    "move_status",
    "next_step",
    "parse_range",
    "pending_moves",
]
