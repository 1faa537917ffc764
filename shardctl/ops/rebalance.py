"""``rebalance``: even out shards per host (typically after ``add-host``) with the fewest moves.

The plan is computed from the topology alone. Every host ends with ``count // hosts`` or one
more shard; hosts above the even share keep the extra ones (first those already at exactly one
more, which then need no move), so the number of shards moved is the least any plan can move.
Each surplus host gives away its highest numbered shards (its own range stays contiguous), to
the hosts short of shards in topology order; each (source, target) pair is one ``move-shard``. ``apply`` runs them one host pair at a
time, each through all of move-shard's phases.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..errors import OperationFailed
from .move import MoveOptions, Phase, Progress, cleanup_move, move_shards
from ..model.ranges import format_shards
from ..model.topology import Topology


@dataclass
class PlannedMove:
    source: str
    target: str
    shards: list[int]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shards"] = format_shards(self.shards)
        d["count"] = len(self.shards)
        return d


def goals(topo: Topology) -> dict[str, int]:
    """Shards each host should hold: an even split, the remainder staying where most shards are."""
    hosts = topo.hosts
    total = sum(len(h.shards) for h in hosts)
    base, extra = divmod(total, len(hosts))

    def rank(i: int) -> tuple:
        # Any host above the even share saves a shard move by keeping one of the extra ones; one at
        # exactly base + 1 then has nothing to move at all (one host pair fewer).
        count = len(hosts[i].shards)
        return (0 if count == base + 1 else 1 if count > base else 2, -count, i)

    order = sorted(range(len(hosts)), key=rank)
    return {hosts[i].name: base + (1 if r < extra else 0) for r, i in enumerate(order)}


def plan(topo: Topology) -> list[PlannedMove]:
    """The fewest shard moves that leave every host within one shard of the others."""
    goal = goals(topo)
    need = [[h.name, goal[h.name] - len(h.shards)] for h in topo.hosts if len(h.shards) < goal[h.name]]
    moves: list[PlannedMove] = []
    for host in topo.hosts:
        surplus = len(host.shards) - goal[host.name]
        if surplus <= 0:
            continue
        give = sorted(host.shards)[-surplus:]
        while give:
            slot = next(n for n in need if n[1] > 0)
            chunk, give = give[:slot[1]], give[slot[1]:]
            slot[1] -= len(chunk)
            moves.append(PlannedMove(host.name, slot[0], chunk))
    return moves


def plan_report(topo: Topology) -> dict:
    moves = plan(topo)
    goal = goals(topo)
    after = {h.name: len(h.shards) for h in topo.hosts}
    for m in moves:
        after[m.source] -= len(m.shards)
        after[m.target] += len(m.shards)
    return {"command": "rebalance", "moves": [m.to_dict() for m in moves],
            "shards_to_move": sum(len(m.shards) for m in moves),
            "hosts": [{"name": h.name, "shards": len(h.shards), "goal": goal[h.name], "after": after[h.name]}
                      for h in topo.hosts]}


def apply(topo: Topology, *, options: MoveOptions | None = None, progress: Progress | None = None,
          cleanup: bool = False, on_move=None) -> dict:
    """Run the plan's moves one host pair at a time (prepare, sync, cutover; and cleanup if asked).

    Re-running after an interruption resumes: the plan of an unchanged topology is the same, and
    move-shard picks up a move of the same shards where it stopped.
    """
    options = options or MoveOptions()
    started = time.perf_counter()
    doc = plan_report(topo)
    results = []
    for planned in plan(topo):
        if on_move:
            on_move(planned)
        current = Topology.load(topo.path, allow_inline_password=options.allow_inline_password)
        report = move_shards(current, planned.shards, planned.target, options=options, progress=progress)
        if report.get("phase") not in (Phase.CUT_OVER, "nothing to do"):
            raise OperationFailed(f"rebalance: the move of shards {format_shards(planned.shards)} from "
                                  f"{planned.source} to {planned.target} stopped in phase {report.get('phase')}",
                                  report={**doc, "results": results + [report]})
        if cleanup and report.get("move_id"):
            current = Topology.load(topo.path, allow_inline_password=options.allow_inline_password)
            report["cleanup"] = cleanup_move(current, move_id=report["move_id"], options=options, progress=progress)
        results.append(report)
    doc.update(results=results, applied=True, seconds=round(time.perf_counter() - started, 3))
    return doc
