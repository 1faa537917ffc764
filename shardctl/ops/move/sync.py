"""Sync: one publication per batch of schemas on the source, its slot, and a subscription with the
initial copy on the target; wait until every table is ready."""

from __future__ import annotations

import time

import psycopg

from ...engine import connections as db
from ...errors import OperationFailed, WaitTimeout
from ...sql.catalog import inspect, replication
from . import transfer
from .copy import forget_partial_copy, slot_and_copy
from .preflight import subscriptions_for
from .run import MoveRun, checkpoint, human_bytes, set_phase
from .state import Phase

STALL_SECONDS = 120  # no table became ready for this long while the server reports errors: give up


def batches(run: MoveRun) -> list[list[int]]:
    existing = run.move.detail.get("batches")
    if existing:
        return existing
    shards = run.move.shards
    per = max(1, run.options.schemas_per_subscription)
    cap = min(
        run.options.max_subscriptions,
        run.move.detail.get("max_subscriptions") or run.options.max_subscriptions,
    )
    if cap > 0:
        per = max(per, -(-len(shards) // cap))
    return [shards[i : i + per] for i in range(0, len(shards), per)]


def sync(run: MoveRun, wait_only: bool = False) -> None:
    """The sync phase; ``wait_only``: just wait for a sync already under way (the cutover's first step)."""
    phase = run.move.phase
    if phase in (Phase.PREPARING, Phase.NEW):
        raise OperationFailed(
            f"move {run.move.move_id} is not prepared yet (phase {phase}): run the prepare "
            f"phase first"
        )
    if phase not in (Phase.PREPARED, Phase.SYNCING, Phase.SYNCED):
        run.note(f"sync: nothing to do (phase {phase})")
        return
    if not wait_only:
        run.report.phases_run.append("sync")
    t0 = time.perf_counter()
    if phase == Phase.PREPARED:
        _size_to_target(run)
    planned = batches(run)
    if phase == Phase.PREPARED:
        run.both(Phase.SYNCING, {"batches": planned, "own_copy": run.options.copy_workers > 0})
    run.move.detail["batches"] = planned
    own_copy = bool(run.move.detail.get("own_copy"))
    names = run.move.names
    with run.connect(run.source) as src, run.connect(run.target) as tgt:
        existing = replication.subscriptions(tgt, names)
        missing = [k for k, name in enumerate(names) if name not in existing]
        if missing:
            _create_replication(run, src, tgt, planned, missing, own_copy)
        if own_copy:
            _copy_and_start(run, tgt, planned)
        else:
            for name in existing:  # a run stopped between creating and starting a subscription
                replication.start_subscription(tgt, name)
        expected = len(inspect.tables(src, run.schemas, "r"))
        _wait_ready(run, src, tgt, names, expected)
    seconds = round(time.perf_counter() - t0, 3)
    if run.move.phase != Phase.SYNCED:
        run.both(Phase.SYNCED, {"tables": expected, "sync_seconds": seconds})
    run.report.sync_seconds = seconds
    run.report.tables = expected
    checkpoint("after-sync")


def _size_to_target(run: MoveRun) -> None:
    """Before the subscriptions exist: fit their number to the target's free logical replication workers
    (each subscription's apply worker plus a table-sync worker), or refuse with the setting to change."""
    with run.connect(run.target) as tgt:
        facts = inspect.server_facts(tgt)
    subs = subscriptions_for(run, facts)
    if subs < 1:
        raise OperationFailed(
            f"sync: host {run.target.name} has {facts['workers_used']} of "
            f"max_logical_replication_workers={facts['max_logical_replication_workers']} in use: "
            f"a move needs 2 free (an apply and a table-sync worker); raise it or wait"
        )
    recorded = run.move.detail.get("max_subscriptions") or subs
    run.move.detail["max_subscriptions"] = min(recorded, subs)


def _create_replication(
    run: MoveRun,
    src: psycopg.Connection,
    tgt: psycopg.Connection,
    planned: list[list[int]],
    missing: list[int],
    own_copy: bool,
) -> None:
    names = run.move.names
    facts = inspect.server_facts(src)
    slots_needed = sum(1 for k in missing if not replication.slot_exists(src, names[k]))
    free = facts["max_replication_slots"] - facts["slots_used"]
    if slots_needed + 2 > free:
        raise OperationFailed(
            f"host {run.source.name} has {free} free replication slots "
            f"(max_replication_slots={facts['max_replication_slots']}); this move needs "
            f"{slots_needed} plus 2 for the initial copy: raise it or use larger "
            f"batches (--schemas-per-subscription)"
        )
    conninfo = run.publisher_conninfo()
    by_table = not inspect.role_facts(src, [])["superuser"]  # FOR TABLES IN SCHEMA needs superuser
    for k in missing:
        name, schemas = names[k], [run.schema(n) for n in planned[k]]
        try:
            if not replication.publication_exists(src, name):
                replication.create_publication(src, name, schemas, by_table)
            if not own_copy and not replication.slot_exists(src, name):
                replication.create_slot(src, name)
            # With our own copy the subscription waits, disabled, for its slot and data (_copy_and_start).
            replication.create_subscription(
                tgt, name, conninfo, copy_data=not own_copy, start=not own_copy
            )
        except psycopg.Error as exc:
            raise OperationFailed(
                f"sync: setting up replication {name} from {run.source.name} to "
                f"{run.target.name}: {db.first_line(exc)}"
            ) from None
    subs = replication.subscriptions(tgt, names)
    with tgt.transaction():
        set_phase(tgt, run.move, "target", Phase.SYNCING, {"sub_oids": list(subs.values())})
    with src.transaction():
        set_phase(src, run.move, "source", Phase.SYNCING, {"sub_oids": list(subs.values())})


def _copy_and_start(run: MoveRun, tgt: psycopg.Connection, planned: list[list[int]]) -> None:
    """Per batch not copied yet: its slot with a snapshot, the parallel copy as of it (a copy cut short
    before is thrown away first), recorded, then the subscription started without copying. The
    subscriptions themselves stay the same across interruptions."""
    for k, name in enumerate(run.move.names):
        flag = f"copied_{k}"
        schemas = [run.schema(n) for n in planned[k]]
        if run.move.detail.get(flag) and replication.started_without_tables(tgt, name):
            # Stopped between ENABLE and REFRESH: the apply worker may have skipped and confirmed changes,
            # so neither the copy nor its slot can be trusted. Stop the worker and copy again.
            transfer.disable_subscription(tgt, name)
            run.both(Phase.SYNCING, {flag: False})
            run.note(f"sync: {name} was stopped while starting; its tables are copied again")
        if not run.move.detail.get(flag):
            try:
                forget_partial_copy(run, name, schemas)
                copied = slot_and_copy(run, name, schemas)
            except psycopg.Error as exc:
                raise OperationFailed(
                    f"sync: copying {name} from {run.source.name} to {run.target.name}: "
                    f"{db.first_line(exc)}"
                ) from None
            run.report.copied_bytes = (run.report.copied_bytes or 0) + copied
            run.both(Phase.SYNCING, {flag: True})
        # see start_subscription: no change skipped
        with run.connect(run.target, autocommit=False) as hold:
            replication.start_subscription(
                tgt, name, copy_data=False, hold=hold, tables=inspect.tables(tgt, schemas, "r")
            )


def _wait_ready(
    run: MoveRun, src: psycopg.Connection, tgt: psycopg.Connection, names: list[str], expected: int
) -> None:
    progressed, ready = time.monotonic(), -1
    state: dict = {}
    note = ""

    def all_ready() -> bool:
        nonlocal progressed, ready, state, note
        state = replication.sync_state(tgt, names)
        lag = replication.slot_lag(src, names)
        note = f"lag {human_bytes(lag)}" if lag is not None else ""
        errors = state["apply_errors"] + state["sync_errors"]
        if errors:
            note += f", {errors} replication errors (see the target's log)"
        run.progress("sync", state["ready"], expected, note)
        if state["ready"] >= expected and state["tables"] >= expected:
            run.report.lag_bytes = lag
            return True
        if state["ready"] != ready:
            progressed, ready = time.monotonic(), state["ready"]
        elif time.monotonic() - progressed > STALL_SECONDS:
            why = replication.subscription_problems(tgt, names)
            if why or errors:
                raise OperationFailed(
                    f"sync: stuck at {ready} of {expected} tables ready for {STALL_SECONDS}s: "
                    f"{'; '.join(why) or f'{errors} replication errors'} on {run.target.name}; "
                    f"fix the cause and run the command again, or abort the move"
                )
        return False

    def timed_out() -> WaitTimeout:
        why = (
            "; ".join(replication.subscription_problems(tgt, names))
            or note
            or "no problem reported by the target"
        )
        return WaitTimeout(
            f"sync: {state['ready']} of {expected} tables ready after "
            f"{run.options.sync_timeout:g}s ({why}); run the command again to keep waiting"
        )

    transfer.wait_for(all_ready, time.monotonic() + run.options.sync_timeout, timed_out)
