"""What ``migrate --check --base DIR`` (the pull-request gate; logic in ops/gate.py) and ``plan``'s
template section show. fleet.py calls these; this module imports nothing from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..errors import BadInput, OperationFailed, ShardctlError
from ..model.ranges import format_shards
from ..model.topology import Topology
from ..ops.gate import check_against_base
from ..ops.redeploy import redeploy
from .output import stdout, table


def run_gate(topo: Topology, base: str, host_names: list[str] | None, connect_timeout: int
             ) -> tuple[dict, Callable[[], None], ShardctlError | None]:
    """The gate's document, its human rendering and its error (exit 1 on any problem)."""
    result = check_against_base(topo, Path(base), hosts=host_names, connect_timeout=connect_timeout)

    def human() -> None:
        rows = [[h, ", ".join(f"V{v}: {n}" for v, n in versions.items()) or "-"]
                for h, versions in result.fleet.items()]
        stdout.print(table(f"gate: base {result.base_dir} at V{result.base_head}, change at V{result.head}",
                           ["host", "shards at version"], rows))
        if result.new:
            stdout.print(f"New migrations: {', '.join(result.new)} (rendered and parsed for "
                         f"{topo.shard_count} shards)", highlight=False)
        for p in result.problems:
            stdout.print(f"[red]problem[/red]: {p}", markup=True, highlight=False)
        if result.ok:
            stdout.print(f"Gate passed: the fleet is at the base's head V{result.base_head} and the change "
                         f"only adds migrations after it. ({result.seconds:.2f}s)")

    error = None
    if not result.ok:
        more = f" (and {len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
        error = OperationFailed(f"gate: {result.problems[0]}{more}")
    return result.to_dict(), human, error


def template_plan(topo: Topology, hosts: list[str] | None, connect_timeout: int) -> tuple[dict[str, Any], list[str]]:
    """For ``plan``: per host, the template functions a ``redeploy`` would replace (read-only)."""
    try:
        report = redeploy(topo, hosts=hosts, dry_run=True, connect_timeout=connect_timeout)
    except BadInput as exc:
        return {"refused": str(exc)}, [f"templates: {exc}"]
    doc = {h.host: {o: format_shards(s) for o, s in h.value.stale.items()} for h in report.hosts if h.reachable}
    lines = [f"{host}: template {o} differs on shards {s} (run shardctl redeploy)"
             for host, objects in doc.items() for o, s in objects.items()]
    return {"stale": doc}, lines
