"""``rebalance``: even out shards per host (typically after ``add-host``) with the fewest moves, or,
``by="size"``, even out bytes per host (see :func:`plan_by_size`).

The plan is computed from the topology alone. Every host ends with ``count // hosts`` or one
more shard; hosts above the even share keep the extra ones (first those already at exactly one
more, which then need no move), so the number of shards moved is the least any plan can move.
Each surplus host gives away its highest numbered shards (its own range stays contiguous), to
the hosts short of shards in topology order; each (source, target) pair is one ``move-shard``.
``rebalance`` runs them one host pair at a time, each through all of move-shard's phases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..engine import connections as db
from ..errors import BadInput, OperationFailed
from ..model.documents import result_doc
from ..model.ranges import format_shards, parse_shards
from ..model.topology import Topology
from ..model.topology_file import TopologyFile
from ..sql.catalog import inspect
from .move import MoveOptions, Phase, Progress, cleanup_move, move_shards

# an empty shard still costs something (and fills up): counted as 64 KiB
EMPTY_SHARD_BYTES = 64 << 10


@dataclass
class PlannedMove:
    source: str
    target: str
    shards: list[int]

    def to_dict(self) -> dict:
        return result_doc(self, shards=format_shards(self.shards), count=len(self.shards))


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
    need = [
        [h.name, goal[h.name] - len(h.shards)] for h in topo.hosts if len(h.shards) < goal[h.name]
    ]
    moves: list[PlannedMove] = []
    for host in topo.hosts:
        surplus = len(host.shards) - goal[host.name]
        if surplus <= 0:
            continue
        give = sorted(host.shards)[-surplus:]
        while give:
            slot = next(n for n in need if n[1] > 0)
            chunk, give = give[: slot[1]], give[slot[1] :]
            slot[1] -= len(chunk)
            moves.append(PlannedMove(host.name, slot[0], chunk))
    return moves


def pinned_shards(topo: Topology) -> set[int]:
    """``placement.pinned`` of the topology file: shards rebalance never moves."""
    if topo.path is None:
        return set()
    placement = TopologyFile(topo.path).doc.get("placement") or {}
    value = placement.get("pinned")
    if value in (None, "", []):
        return set()
    try:
        return set(parse_shards(str(value), limit=topo.shard_count))
    except ValueError as exc:
        raise BadInput(f"placement.pinned: {exc}") from None


def shard_sizes(
    topo: Topology, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT
) -> dict[int, int]:
    """Bytes per shard, from its host (pg_total_relation_size of its tables)."""
    sizes: dict[int, int] = {}
    for host in topo.hosts:
        if not host.shards:
            continue
        schema_of = {topo.schema_name(n): n for n in host.shards}
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="rebalance"
        ) as conn:
            for schema, size in inspect.schema_sizes(conn, list(schema_of)).items():
                sizes[schema_of[schema]] = int(size)
    return sizes


def plan_by_size(
    topo: Topology,
    sizes: dict[int, int],
    *,
    pinned: set[int] = frozenset(),
    min_improvement: float = 0.05,
    floor: int = EMPTY_SHARD_BYTES,
) -> list[PlannedMove]:
    """Moves that even out bytes per host: repeatedly the shard from the fullest host to the emptiest that
    narrows their gap the most, while each such move narrows the spread (fullest − emptiest) by at least
    ``min_improvement`` of the mean host size. Pinned shards stay. Moves are grouped per host pair."""
    weight = {n: max(floor, sizes.get(n, 0)) for h in topo.hosts for n in h.shards}
    owned = {h.name: set(h.shards) for h in topo.hosts}
    total = {name: sum(weight[n] for n in shards) for name, shards in owned.items()}
    mean = sum(total.values()) / max(1, len(total))
    origin = {n: h.name for h in topo.hosts for n in h.shards}
    for _ in range(sum(len(s) for s in owned.values())):
        big = max(total, key=lambda k: (total[k], k))
        small = min(total, key=lambda k: (total[k], k))
        gap = total[big] - total[small]
        # Moving w from big to small leaves a gap of |gap - 2w|: best when w is near gap / 2.
        candidates = [n for n in owned[big] if n not in pinned and weight[n] < gap]
        if not candidates:
            break
        best = min(candidates, key=lambda n: (abs(gap - 2 * weight[n]), n))
        if gap - abs(gap - 2 * weight[best]) < min_improvement * mean:
            break
        owned[big].remove(best)
        owned[small].add(best)
        total[big] -= weight[best]
        total[small] += weight[best]
    pairs: dict[tuple[str, str], list[int]] = {}
    for name, shards in owned.items():
        for n in shards:
            if origin[n] != name:
                pairs.setdefault((origin[n], name), []).append(n)
    return [PlannedMove(s, t, sorted(ns)) for (s, t), ns in sorted(pairs.items())]


@dataclass
class HostBalance:
    """One host before and after a rebalance plan: shards (and, by size, bytes)."""

    name: str
    shards: int
    after: int
    goal: int | None = None  # by count: the even share
    bytes: int | None = None  # by size
    bytes_after: int | None = None

    def to_dict(self, by: str) -> dict:
        doc = {"name": self.name, "shards": self.shards, "goal": self.goal, "after": self.after}
        if by == "size":
            doc.update(bytes=self.bytes, bytes_after=self.bytes_after)
        return doc


@dataclass
class RebalancePlan:
    """The result of :func:`rebalance_plan`: the moves, and each host before and after them. A plan
    never fails (``raise_for_status`` returns it); bad input raises before it is built."""

    moves: list[PlannedMove]
    hosts: list[HostBalance]
    by: str = "count"
    min_improvement: float | None = None  # by size
    pinned: list[int] = field(default_factory=list)  # by size: placement.pinned, never moved
    bytes_to_move: int | None = None  # by size

    @property
    def shards_to_move(self) -> int:
        return sum(len(m.shards) for m in self.moves)

    @property
    def ok(self) -> bool:
        return True

    def raise_for_status(self) -> RebalancePlan:
        return self

    def to_dict(self) -> dict:
        doc: dict = {"command": "rebalance", "ok": self.ok}
        if self.by == "size":
            doc.update(
                by="size", min_improvement=self.min_improvement, pinned=format_shards(self.pinned)
            )
        doc.update(moves=[m.to_dict() for m in self.moves], shards_to_move=self.shards_to_move)
        if self.by == "size":
            doc["bytes_to_move"] = self.bytes_to_move
        doc["hosts"] = [h.to_dict(self.by) for h in self.hosts]
        return doc


@dataclass
class RebalanceResult:
    """The result of :func:`rebalance`: the plan that was run and each move's report (move-shard's, with
    its ``cleanup`` report when asked). A move that stops raises OperationFailed carrying this
    document so far."""

    plan: RebalancePlan
    results: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True

    def raise_for_status(self) -> RebalanceResult:
        return self

    def to_dict(self, applied: bool = True) -> dict:
        doc = {**self.plan.to_dict(), "results": self.results}
        if applied:
            doc.update(applied=True, seconds=round(self.seconds, 3))
        return doc


def rebalance_plan(
    topo: Topology,
    *,
    by: str = "count",
    sizes: dict[int, int] | None = None,
    min_improvement: float = 0.05,
) -> RebalancePlan:
    """The plan and the hosts before and after it; ``by``: "count" (shards) or "size" (bytes)."""
    if by == "size":
        return _size_report(
            topo, sizes if sizes is not None else shard_sizes(topo), min_improvement
        )
    if by != "count":
        raise BadInput(f"rebalance --by {by!r}: count or size")
    moves = plan(topo)
    goal = goals(topo)
    after = {h.name: len(h.shards) for h in topo.hosts}
    for m in moves:
        after[m.source] -= len(m.shards)
        after[m.target] += len(m.shards)
    return RebalancePlan(
        moves,
        [HostBalance(h.name, len(h.shards), after[h.name], goal=goal[h.name]) for h in topo.hosts],
    )


def _size_report(topo: Topology, sizes: dict[int, int], min_improvement: float) -> RebalancePlan:
    pinned = pinned_shards(topo)
    moves = plan_by_size(topo, sizes, pinned=pinned, min_improvement=min_improvement)
    before = {h.name: sum(sizes.get(n, 0) for n in h.shards) for h in topo.hosts}
    after = dict(before)
    count_after = {h.name: len(h.shards) for h in topo.hosts}
    for m in moves:
        moved = sum(sizes.get(n, 0) for n in m.shards)
        after[m.source] -= moved
        after[m.target] += moved
        count_after[m.source] -= len(m.shards)
        count_after[m.target] += len(m.shards)
    return RebalancePlan(
        moves,
        [
            HostBalance(
                h.name,
                len(h.shards),
                count_after[h.name],
                bytes=before[h.name],
                bytes_after=after[h.name],
            )
            for h in topo.hosts
        ],
        by="size",
        min_improvement=min_improvement,
        pinned=sorted(pinned),
        bytes_to_move=sum(sizes.get(n, 0) for m in moves for n in m.shards),
    )


def rebalance(
    topo: Topology,
    *,
    options: MoveOptions | None = None,
    progress: Progress | None = None,
    cleanup: bool = False,
    on_move=None,
    by: str = "count",
    min_improvement: float = 0.05,
) -> RebalanceResult:
    """Run the plan's moves one host pair at a time (prepare, sync, cutover; and cleanup if asked).

    Re-running after an interruption resumes: the plan of an unchanged topology is the same, and
    move-shard picks up a move of the same shards where it stopped.
    """
    options = options or MoveOptions()
    started = time.perf_counter()
    result = RebalanceResult(rebalance_plan(topo, by=by, min_improvement=min_improvement))
    results = result.results
    for planned in result.plan.moves:
        if on_move:
            on_move(planned)
        current = Topology.load(topo.path, allow_inline_password=options.allow_inline_password)
        report = move_shards(
            current, planned.shards, planned.target, options=options, progress=progress
        )
        if report.phase not in (Phase.CUT_OVER, "nothing to do"):
            raise OperationFailed(
                f"rebalance: the move of shards {format_shards(planned.shards)} from "
                f"{planned.source} to {planned.target} stopped in phase {report.phase}",
                report={**result.to_dict(applied=False), "results": [*results, report.to_dict()]},
            )
        doc = report.to_dict()
        if cleanup and report.move_id:
            current = Topology.load(topo.path, allow_inline_password=options.allow_inline_password)
            doc["cleanup"] = cleanup_move(
                current, move_id=report.move_id, options=options, progress=progress
            ).to_dict()
        results.append(doc)
    result.seconds = time.perf_counter() - started
    return result
