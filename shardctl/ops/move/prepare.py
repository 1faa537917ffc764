"""Prepare: mark the shards on the source, create them on the target at the source's version.

On the source (under the host lock): refuse tables that cannot be replicated, check the ledger
against the migration files, mark the shards ``moving_out`` (migrate refuses from now on). On the
target: create each schema, its sequence, ``next_id()`` and tables at the source's migration
version through the per-host executor, copying the source's ledger rows, with the shards
``moving_in``. Then compare the tables and columns on both sides.
"""

from __future__ import annotations

import threading
import time

import psycopg

from ...engine import host_ledger
from ...engine.executor import RunOptions, ShardPlan
from ...engine.fanout import ApplyOutcome, apply_plans, host_jobs
from ...engine.ledger import ensure_control_schema
from ...errors import ConnectionLost, OperationFailed, first_few
from ...model.ranges import format_shards
from ...sql.catalog import control, inspect
from ...sql.catalog.control import shard_list
from ...sql.host_migrations import host_for_topology
from ...sql.migrations import for_topology
from ...sql.render import render_shard
from ..provision import steps_for
from .preflight import preflight
from .run import MoveRun, check_target_free, checkpoint, require_version, set_phase
from .state import Phase, ShardState


def prepare(run: MoveRun) -> None:
    """The prepare phase (resumable: a half-built target is finished)."""
    move = run.move
    if move.phase not in (Phase.NEW, Phase.PREPARING, Phase.PREPARED):
        run.note(f"prepare: already done (phase {move.phase})")
        return
    run.report.phases_run.append("prepare")
    t0 = time.perf_counter()
    if move.phases.get("target") is None:
        # before the source's shards are marked (and the preflight's trial)
        with run.connect(run.target) as conn:
            check_target_free(
                run.target,
                move.shards,
                shard_list(conn),
                inspect.present_schemas(conn, run.schemas),
                mine=False,
            )
    # a new move: check both hosts before any change
    sizing = preflight(run) if not move.phases else {}
    with run.host_lock(run.source) as conn:
        _prepare_source(run, conn, sizing)
    with run.host_lock(run.target) as conn:
        _create_on_target(run, conn, _prepare_target(run, conn))
    _compare_structure(run)
    run.both(Phase.PREPARED)
    checkpoint("after-prepare")
    run.report.prepare_seconds = round(time.perf_counter() - t0, 3)
    run.event("move-shard prepare", {"source": move.source, "target": move.target})


def _prepare_source(run: MoveRun, conn: psycopg.Connection, sizing: dict) -> None:
    move, shards = run.move, run.move.shards
    control.ensure_move_objects(conn)
    rows = shard_list(conn)
    missing = [n for n in shards if n not in rows]
    if missing:
        raise OperationFailed(
            f"host {run.source.name} has no record of shards {format_shards(missing)} "
            f"(run shardctl init)"
        )
    new = move.phases.get("source") is None
    expected = ShardState.ACTIVE if new else ShardState.MOVING_OUT
    wrong = [n for n in shards if rows[n].state != expected]
    if wrong:
        states = sorted({rows[n].state for n in wrong})
        raise OperationFailed(
            f"shards {format_shards(wrong)} on {run.source.name} are {', '.join(states)}, "
            f"not active: another move holds them (see move-shard --status)"
        )
    present = inspect.present_schemas(conn, run.schemas)
    absent = [n for n in shards if run.schema(n) not in present]
    if absent:
        raise OperationFailed(
            f"host {run.source.name} lacks the schemas of shards {format_shards(absent)}"
        )
    problems = inspect.unmovable(conn, run.schemas)
    if problems:
        raise OperationFailed(
            f"refusing to move: {first_few(problems, 5)}. "
            "Add a primary key (or REPLICA IDENTITY) first"
        )
    run.ledger = {}
    for row in control.ledger_rows(conn, shards):
        run.ledger.setdefault(row[0], []).append(row)
    run.plans = _plans(run)
    if new:
        with conn.transaction():
            set_phase(conn, move, "source", Phase.PREPARING, {"batches": None, **sizing})
            updated = control.change_shard_states(
                conn, shards, ShardState.ACTIVE, ShardState.MOVING_OUT
            )
            if updated != len(shards):
                raise OperationFailed("the shards changed state while the move started; try again")


def _prepare_target(run: MoveRun, conn: psycopg.Connection) -> list[ShardPlan]:
    """Record the move on the target and drop what an interrupted prepare half-built; returns the plans
    of the shards still to create."""
    move = run.move
    require_version(run.target, inspect.server_facts(conn), "receiving")
    ensure_control_schema(conn, run.topo)
    # The target's host-level history (extensions, shared types) first: the shards' tables may use it.
    applied = host_ledger.apply(conn, run.topo, run.target, host_for_topology(run.topo))
    if applied:
        run.note(
            f"applied host-level migrations {', '.join(f'H{v}' for v in applied)} on {run.target.name}"
        )
    control.ensure_move_objects(conn)
    mine = any(r[0] == move.move_id for r in control.move_records(conn))
    rows = shard_list(conn)
    present = inspect.present_schemas(conn, run.schemas)
    check_target_free(run.target, move.shards, rows, present, mine)
    if not mine:
        with conn.transaction():
            set_phase(conn, move, "target", Phase.PREPARING)
    todo = [p for p in run.plans if p.shard not in rows]
    half_built = [p.shard for p in todo if p.schema in present]
    if half_built:
        run.note(
            f"dropping {len(half_built)} half-built schema(s) on {run.target.name} from an "
            f"interrupted prepare"
        )
        conn.autocommit = False
        try:
            run.drop_shards(
                conn,
                half_built,
                run.schema,
                ShardState.MOVING_IN,
                "prepare",
                run.target.name,
                parallel=True,
            )
        finally:
            conn.autocommit = True
    return todo


def _plans(run: MoveRun) -> list[ShardPlan]:
    """Per shard: its creation SQL and steps up to its version, checked against the source's ledger,
    whose rows the target copies."""
    migrations = for_topology(run.topo)
    by_version = {m.version: m for m in migrations}
    plans = []
    for n in run.move.shards:
        rows = run.ledger.get(n, [])
        versions = [r[1] for r in rows]
        if versions != list(range(1, len(versions) + 1)):
            raise OperationFailed(
                f"shard {n} on {run.source.name} has ledger versions {versions}: not "
                f"1..N without gaps; fix that before moving it"
            )
        steps = steps_for(migrations, run.topo, n, 0, len(versions)) if versions else []
        for row, step in zip(rows, steps):
            # As migrate does: a ledger written before checksums left out fleet-wide values still matches.
            if not by_version[step.version].matches(run.topo, n, row[3]):
                raise OperationFailed(
                    f"{by_version[step.version].name} changed after it was applied to shard {n}: the target "
                    f"would not match the source (restore the file, or migrate --repair first)"
                )
        if len(steps) != len(versions):
            raise OperationFailed(
                f"shard {n} is at V{len(versions)} but the migrations directory stops at "
                f"V{len(steps)}"
            )
        plans.append(
            ShardPlan(
                n,
                run.schema(n),
                render_shard(run.topo, n),
                steps,
                copy_ledger={r[1]: tuple(r[2:]) for r in rows},
                state=ShardState.MOVING_IN,
            )
        )
    return plans


def _create_on_target(run: MoveRun, conn: psycopg.Connection, plans: list[ShardPlan]) -> None:
    """Create the shards on the target, ``moving_in``, with the copied ledger rows: the per-host executor,
    in parallel streams when there are many shards (``fanout.host_jobs``, as init does). Each shard commits
    with its control rows or not at all, so an interrupted prepare leaves only whole shards (and
    schemas without a row, which the next run drops)."""
    total = len(plans)
    run.progress("prepare", 0, total, run.target.name)

    options = RunOptions(
        batch_size=max(1, run.options.batch_size),
        connect_timeout=run.options.connect_timeout,
        purpose="move-shard",
    )
    outcome = ApplyOutcome()
    jobs = host_jobs(run.target, conn).count if total > 1 else 1
    try:
        apply_plans(
            run.target,
            plans,
            options,
            threading.Event(),
            outcome,
            run.progress_factory("prepare"),
            jobs=jobs,
        )
    except ConnectionLost as exc:
        raise OperationFailed(f"prepare on {run.target.name}: connection lost ({exc})") from None
    run.report.prepare_streams = outcome.jobs
    if outcome.failed:
        first = outcome.failed[0]
        raise OperationFailed(
            f"prepare on {run.target.name}: shard {first['shard']}: {first['error']}"
        )
    if outcome.not_started:
        raise OperationFailed(
            f"prepare on {run.target.name}: shards {format_shards(outcome.not_started)} were "
            f"not created; run the command again"
        )


def _compare_structure(run: MoveRun) -> None:
    with run.connect(run.source) as s, run.connect(run.target) as t:
        src, tgt = inspect.structure(s, run.schemas), inspect.structure(t, run.schemas)
    diffs = []
    for key in sorted(set(src) | set(tgt)):
        if key not in tgt:
            diffs.append(
                f"{key[0]}.{key[1]} exists only on {run.source.name} (created outside migrations?)"
            )
        elif key not in src:
            diffs.append(f"{key[0]}.{key[1]} exists only on {run.target.name}")
        elif src[key] != tgt[key]:
            diffs.append(
                f"{key[0]}.{key[1]} has columns {src[key]} on {run.source.name} but {tgt[key]} on "
                f"{run.target.name}"
            )
    if diffs:
        raise OperationFailed(
            f"prepare: the target's tables differ from the source's: {first_few(diffs, 3)}. "
            "Abort the move (move-shard --abort) and bring the schemas in line"
        )
