"""Cleanup (``--cleanup``): drop the renamed source schemas of a cut-over move and their control rows."""

from __future__ import annotations

from ...errors import OperationFailed
from ...sql.catalog import stubs
from .cutover import finish_cutover, stub_names
from .run import MoveRun
from .state import Phase, ShardState


def cleanup(run: MoveRun) -> None:
    phase = run.move.phase
    if phase == Phase.CLEANED:
        run.note("cleanup: already done")
        return
    if phase != Phase.CUT_OVER:
        raise OperationFailed(
            f"move {run.move.move_id} is in phase {phase}: cleanup drops the source's old "
            f"schemas after the cutover; finish the move first, or abort it"
        )
    run.report.phases_run.append("cleanup")
    finish_cutover(run)  # a cutover interrupted after the source committed completes first
    renamed = run.renamed_map()
    with run.connect(run.source, autocommit=False) as src:
        # the stubs under the old names go with the old copies
        stubs.drop_moved_stubs(src, stub_names(run))
        src.commit()
        run.drop_shards(
            src,
            run.move.shards,
            lambda n: renamed[str(n)],
            ShardState.MOVED_OUT,
            "cleanup",
            run.source.name,
            parallel=True,
        )
    run.drop_replication()
    run.both(Phase.CLEANED, {})
    run.event("move-shard cleanup", {})
