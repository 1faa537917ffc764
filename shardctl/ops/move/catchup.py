"""After the cutover: bring the moved shards to the fleet's version.

A move creates the shards on the target at the source's version, and ``migrate`` leaves shards in
flight pending. Once the target serves them (the cutover finished), the shards are migrated there to
the version the rest of the fleet has applied (never past the files on disk, never backwards), by
``migrate`` itself on just those shards of the target: one executor, the host lock, the ledger
checks, live-traffic lock waits and the ``migrate`` event, as a run of ``shardctl migrate`` would.
Idempotent: a re-run after a crash (or ``--cleanup``) brings what is still behind.
"""

from __future__ import annotations

from ...engine.executor import RunOptions
from ...engine.fanout import HostResult, fan_out
from ...errors import OperationFailed, ShardctlError
from ...model.ranges import format_shards
from ...model.topology import Host
from ...sql.catalog.control import shard_list
from ...sql.migrations import for_topology
from ..migrate import migrate
from .run import MoveRun
from .state import Phase

CATCH_UP_WAIT = 30.0  # seconds to wait for a migrate run that holds the target's host lock


def fleet_versions(run: MoveRun) -> tuple[int, dict[int, int], list[str]]:
    """The highest version an active shard outside the move has applied on any reachable host, the
    moved shards' versions on the target, and the hosts that could not be read."""
    moved = set(run.move.shards)

    def read(host: Host, result: HostResult) -> None:
        with run.connect(host) as conn:
            rows = shard_list(conn)
        others = [
            rows[n].version
            for n in host.shards
            if n in rows and n not in moved and rows[n].state == "active"
        ]
        mine = (
            {n: rows[n].version for n in moved if n in rows} if host.name == run.target.name else {}
        )
        result.value = (max(others, default=0), mine)

    results = fan_out(list(run.topo.hosts), read)
    unread = [f"{r.host} ({r.error})" for r in results if not r.ok]
    target = next((r for r in results if r.host == run.target.name), None)
    if target is None or not target.ok:
        raise OperationFailed(
            f"the move is cut over, but {run.target.name} could not be read to bring the moved "
            f"shards to the fleet's version ({target.error if target else 'not in the topology'})"
            f"; run the command again"
        )
    return max((r.value[0] for r in results if r.ok), default=0), target.value[1], unread


def catch_up(run: MoveRun) -> None:
    """Migrate the moved shards on the target to the fleet's version (after the cutover; else nothing)."""
    move = run.move
    if move.phase not in (Phase.CUT_OVER, Phase.CLEANED) or move.phases.get("target") not in (
        Phase.CUT_OVER,
        Phase.CLEANED,
    ):
        return
    on_disk = len(for_topology(run.topo))
    fleet, moved, unread = fleet_versions(run)
    goal = min(fleet, on_disk)
    behind = {n: v for n, v in moved.items() if v < goal}
    run.report.fleet_version = goal
    if unread:
        run.note(f"the fleet's version (V{goal}) was read without {', '.join(unread)}")
    if not behind:
        return
    result = migrate(
        run.topo,
        target=goal,
        hosts=[run.target.name],
        shards=sorted(behind),
        options=RunOptions(
            connect_timeout=run.options.connect_timeout,
            purpose="move-shard catch-up",
            wait=max(run.options.wait, CATCH_UP_WAIT),
        ),
        progress=run.progress_factory("catch-up"),
    )
    host = result.host(result.hosts[0])
    brought = sorted(n for n in host.migrated if n in behind)
    by_version: dict[int, list[int]] = {}
    for n in brought:
        by_version.setdefault(behind[n], []).append(n)
    for version, shards in sorted(by_version.items()):
        run.note(
            f"brought shards {format_shards(shards)} from V{version} to V{goal} on {run.target.name} "
            f"(the fleet's version)"
        )
    run.report.caught_up = {
        "host": run.target.name,
        "to": goal,
        "shards": format_shards(brought),
        "from": {f"V{v}": format_shards(s) for v, s in sorted(by_version.items())},
    }
    try:
        result.raise_for_status()
    except ShardctlError as exc:
        raise OperationFailed(
            f"the move is cut over, but bringing shards {format_shards(sorted(behind))} on "
            f"{run.target.name} to V{goal} failed: {exc}; run shardctl migrate (or this "
            f"command again)"
        ) from None
