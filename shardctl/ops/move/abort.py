"""Abort: make the source authoritative again, at any point before cleanup.

Before the cutover it drops the target's copies and the replication objects; after it, it freezes
the target, copies its rows back into the source's (renamed back) schemas, checks them and flips
the topology back.
"""

from __future__ import annotations

import time

import psycopg

from ...engine import connections as db
from ...errors import OperationFailed
from ...model.ranges import format_shards
from ...model.topology import Topology
from ...model.topology_file import flip_topology
from ...sql import session
from ...sql.catalog import control, data, inspect, stubs
from ...sql.catalog.control import shard_list
from . import transfer
from .cutover import stub_names
from .run import MoveRun, set_phase
from .state import Phase, ShardState


def abort(run: MoveRun) -> None:
    phase = run.move.phase
    if phase == Phase.ABORTED:
        run.note("abort: already aborted")
        return
    if phase == Phase.CLEANED:
        raise OperationFailed(
            f"move {run.move.move_id} was cleaned up: the source's copies are gone, so it "
            f"cannot be rolled back (move the shards back instead)"
        )
    run.report.phases_run.append("abort")
    if run.move.phases.get("source") == Phase.CUT_OVER or run.move.detail.get("copy_back"):
        _abort_after_cutover(run)
    else:
        _abort_before_cutover(run)
    run.event("move-shard abort", {})


def _finish(run: MoveRun) -> None:
    """Record the abort as finished: the source first, then the target (if it recorded the move)."""
    with run.connect(run.source) as src, src.transaction():
        set_phase(src, run.move, "source", Phase.ABORTED, {})
    with run.connect(run.target) as tgt, tgt.transaction():
        if control.moves_table_exists(tgt):
            set_phase(tgt, run.move, "target", Phase.ABORTED, {})


def _abort_before_cutover(run: MoveRun) -> None:
    move = run.move
    owned = [n for n in move.shards if run.topo.host_of(n).name == run.target.name]
    if owned:
        raise OperationFailed(
            f"the topology gives shards {format_shards(owned)} to {run.target.name} already; "
            f"refusing to drop its copies"
        )
    for host, role in ((run.source, "source"), (run.target, "target")):
        if move.phases.get(role):
            with run.connect(host) as conn, conn.transaction():
                set_phase(conn, move, role, Phase.ABORTING, {})
    run.report.dropped = run.drop_replication()
    with run.connect(run.target, autocommit=False) as tgt:
        rows = shard_list(tgt)
        mine = [n for n in move.shards if n in rows and rows[n].state == ShardState.MOVING_IN]
        present = inspect.present_schemas(tgt, run.schemas)
        doomed = [
            n for n in move.shards if n in mine or (n not in rows and run.schema(n) in present)
        ]
        tgt.commit()
        run.drop_shards(tgt, doomed, run.schema, ShardState.MOVING_IN, "abort", run.target.name)
    with run.connect(run.source) as src, src.transaction():
        stubs.drop_moved_stubs(src, stub_names(run))  # made by a cutover that did not happen
        control.change_shard_states(src, move.shards, ShardState.MOVING_OUT, ShardState.ACTIVE)
        set_phase(src, move, "source", Phase.ABORTED, {})
    _finish(run)


def _abort_after_cutover(run: MoveRun) -> None:
    """Freeze the target, copy its rows back into the source's renamed-back schemas, flip back.

    Steps, each safe to repeat: (1) target schemas guarded and renamed aside; (2) on the source,
    one transaction renames the old schemas back, drops the guards, restores the write
    privileges, replaces the rows with the target's and checks them; (3) topology flipped back;
    (4) the target's copies dropped.
    """
    move, opts = run.move, run.options
    aside = {str(n): run.renamed(n, "abort") for n in move.shards}
    t0 = time.monotonic()
    if move.phases.get("source") == Phase.CUT_OVER:
        with run.connect(run.source) as src, run.connect(run.target) as tgt:
            src_rows, tgt_rows = shard_list(src), shard_list(tgt)
            frozen = set(aside.values()) <= inspect.present_schemas(tgt, list(aside.values()))
        behind = [
            n
            for n in move.shards
            if n in tgt_rows and n in src_rows and tgt_rows[n].version != src_rows[n].version
        ]
        if behind and not frozen:
            raise OperationFailed(
                f"migrations ran on {run.target.name} after the cutover (shards {format_shards(behind)} are at "
                f"V{tgt_rows[behind[0]].version} there, V{src_rows[behind[0]].version} on {run.source.name}): "
                f"the old copies cannot take the new rows back; move the shards back instead"
            )
        if not frozen:  # 1
            _freeze_target(run, aside)
        _copy_back(run, run.renamed_map(), aside)  # 2
    # 3
    flip_topology(run.topo.path, move.shards, move.target, move.source, opts.allow_inline_password)
    run.topo = Topology.load(run.topo.path, allow_inline_password=opts.allow_inline_password)
    run.report.freeze_seconds = round(time.monotonic() - t0, 3)
    run.drop_replication()
    with run.connect(run.target, autocommit=False) as tgt:  # 4
        run.drop_shards(
            tgt,
            move.shards,
            lambda n: aside[str(n)],
            ShardState.MOVED_OUT,
            "abort",
            run.target.name,
        )
    _finish(run)


def _freeze_target(run: MoveRun, aside: dict[str, str]) -> None:
    """On the target: lock, guard and rename the move's schemas aside in one transaction."""
    current = {str(n): run.schema(n) for n in run.move.shards}
    with run.connect(run.target, autocommit=False) as conn:
        session.set_settings(conn, {"lock_timeout": session.duration(run.options.max_freeze)})
        tables_rp = inspect.tables(conn, list(current.values()), "rp")
        try:
            data.lock_tables(conn, tables_rp)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            raise OperationFailed(
                f"could not freeze {run.target.name} within --max-freeze: {db.first_line(exc)}; "
                f"nothing changed, try again"
            ) from None
        run.retire(conn, tables_rp, current, aside, f"moved back to {run.source.name}", [])
        control.write_redirects(
            conn,
            run.move.shards,
            list(current.values()),
            run.source.name,
            run.source.dsn,
            run.move.move_id,
        )
        set_phase(conn, run.move, "target", Phase.ABORTING, {"copy_back": True})
        conn.commit()


def _copy_back(run: MoveRun, renamed: dict[str, str], aside: dict[str, str]) -> None:
    move, opts = run.move, run.options
    with run.connect(run.source, autocommit=False) as src, run.connect(run.target) as tgt:
        stubs.drop_moved_stubs(src, stub_names(run))  # the old names are the shards' own again
        present = inspect.present_schemas(src, list(renamed.values()))
        back = {renamed[str(n)]: run.schema(n) for n in move.shards if renamed[str(n)] in present}
        if back:
            src.execute(stubs.rename_schemas_sql(back))
        tables_rp = inspect.tables(src, run.schemas, "rp")
        tables_r = inspect.tables(src, run.schemas, "r")
        if tables_rp:
            src.execute("".join(stubs.unguard_sql(s, t) for s, t in tables_rp))
        grants = stubs.grant_sql(move.detail.get("grants") or [], revoke=False)
        if grants:
            src.execute(grants)
        back = {run.schema(n): aside[str(n)] for n in move.shards}
        transfer.copy_tables(
            tgt,
            src,
            [((back[s], t), (s, t)) for s, t in tables_r],
            truncate=True,
            progress=lambda i: run.progress("copy back", i, len(tables_r), run.source.name),
        )
        src_sums = transfer.checksums(src, tables_r)
        tgt_sums = transfer.checksums(tgt, [(back[s], t) for s, t in tables_r])
        diff = [(s, t) for s, t in tables_r if src_sums[(s, t)] != tgt_sums.get((back[s], t))]
        if diff:
            src.rollback()
            raise OperationFailed(
                f"abort: {len(diff)} table(s) differ after copying back, e.g. "
                f"{diff[0][0]}.{diff[0][1]}; the source was left as it was (rolled back)"
            )
        seqs = inspect.sequences(tgt, list(back.values()))
        back_of = {v: k for k, v in back.items()}
        values = [
            (
                back_of[s],
                name,
                min(int(i["last_value"]) + opts.sequence_margin, int(i["max_value"])),
            )
            for (s, name), i in seqs.items()
            if i["last_value"] is not None
        ]
        inspect.set_sequences(src, values)
        control.set_shard_states(
            src, move.shards, ShardState.ACTIVE, [run.schema(n) for n in move.shards]
        )
        control.clear_redirects(src, move.shards)
        set_phase(src, move, "source", Phase.ABORTING, {"copy_back": True})
        src.commit()
        run.report.rows = sum(v[0] for v in src_sums.values())
