"""Output of ``shardctl migrate --check --base DIR`` (the pull-request gate; logic in ops/gate.py)."""

from __future__ import annotations

from pathlib import Path

from ..ops.gate import check_against_base
from . import settings
from .output import flagged, stdout, table


def run_gate(base: str, hosts: list[str] | None, connect_timeout: int, as_json: bool) -> None:
    """Compare the change with the base branch's migrations folder and the fleet; exit 1 on any problem."""
    from .options import finish, status_of

    topo = settings().topology()
    result = check_against_base(topo, Path(base), hosts=hosts, connect_timeout=connect_timeout)

    def human() -> None:
        rows = [
            [h, ", ".join(f"V{v}: {n}" for v, n in versions.items()) or "-"]
            for h, versions in result.fleet.items()
        ]
        stdout.print(
            table(
                f"gate: base {result.base_dir} at V{result.base_head}, change at V{result.head}",
                ["host", "shards at version"],
                rows,
            )
        )
        if result.new:
            stdout.print(
                f"New migrations: {', '.join(result.new)} (rendered and parsed for "
                f"{topo.shard_count} shards)",
                highlight=False,
            )
        for p in result.problems:
            flagged("problem", p)
        if result.ok:
            stdout.print(
                f"Gate passed: the fleet is at the base's head V{result.base_head} and the change "
                f"only adds migrations after it. ({result.seconds:.2f}s)"
            )

    finish(as_json, result.to_dict(), human, status_of(result))
