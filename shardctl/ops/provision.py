"""``init``: the control schema and every owned shard, complete with all migrations, on every host."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import psycopg

from ..engine import connections as db
from ..engine import fanout, host_ledger
from ..engine.executor import RunOptions, ShardPlan
from ..engine.ledger import ensure_control_schema, log_event, refresh_cache
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql.catalog.control import shard_list
from ..sql.catalog.inspect import schema_names
from ..sql.catalog.ledger import forget_shard
from ..sql.host_migrations import host_for_topology
from ..sql.migrations import Migration, for_topology, steps_for
from ..sql.render import render_shard
from .verify import check_applied


def _plans(
    conn: psycopg.Connection,
    topo: Topology,
    host: Host,
    migrations: list[Migration],
    goal: int,
    recreated: list[int],
) -> tuple[int, Iterator[ShardPlan]]:
    """What init must do for each of the host's shards: create it, rebuild it, or bring it to ``goal``.

    Returns how many shards need work and a generator of their plans, rendered only when a stream
    takes them (65,536 rendered plans held at once would cost gigabytes)."""
    present = shard_list(conn)
    schemas = schema_names(conn) if present else set()
    work: list[tuple[int, int]] = []  # (shard, version it is at; -1: create, -2: rebuild)
    for n in host.shards:
        row = present.get(n)
        if row is None:
            work.append((n, -1))
        elif row.state == "active" and row.schema not in schemas:
            # Recorded, but its schema was dropped behind shardctl's back: nothing is left
            # to keep, so build it afresh, replacing its control rows in the same transaction.
            recreated.append(n)
            work.append((n, -2))
        elif row.version < goal:
            work.append((n, row.version))

    def rebuild(n: int) -> str:
        return forget_shard(n) + render_shard(topo, n)

    def generate() -> Iterator[ShardPlan]:
        # Rendered when a batch takes them (ShardPlan.materialize), not when a stream's chunk is
        # handed out: the shards Ctrl-C leaves unstarted are reported without rendering them.
        for n, at in work:
            steps = functools.partial(steps_for, migrations, topo, n, max(at, 0), goal)
            create = (
                functools.partial(render_shard, topo, n)
                if at == -1
                else (functools.partial(rebuild, n) if at == -2 else None)
            )
            yield ShardPlan(n, topo.schema_name(n), None, render_steps=steps, render_create=create)

    return len(work), generate()


def _rendered_once(
    topo: Topology, migrations: list, host_level: list, goal: int
) -> list[tuple[str, str]]:
    """(file, SQL) of the host-level files and of one shard's migrations up to ``goal``: templates that
    do not render fail here, before any connection, and the SQL is checked against each host's
    encoding (``FleetLocks.refuse_untranslatable``)."""
    names, rendered = {m.version: m.name for m in migrations}, []
    for shard in topo.hosts[0].shards[:1] if topo.hosts and topo.hosts[0].shards else []:
        rendered = [
            (names[s.version], s.sql)
            for s in steps_for(migrations, topo, shard)
            if s.version <= goal
        ]
    host_files = [(m.name, m.sql(topo, topo.hosts[0].name)) for m in host_level if topo.hosts]
    return host_files + rendered


def init(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    options: RunOptions | None = None,
    progress: fanout.ProgressFactory | None = None,
    target: int | None = None,
) -> fanout.FleetReport:
    """Create the control schema and every missing shard (schema, sequence, next_id(), migrations),
    and bring present shards to the latest migration (or to ``target``). Idempotent.

    ``options.jobs``: streams (connections) per host; default from the host's cores (``host_jobs``);
    ``options.wait``: seconds to wait for another run's locks on the hosts."""
    options = replace(options or RunOptions())  # a copy: the caller's options are not changed
    options.purpose = options.purpose or "init"
    migrations = for_topology(topo)  # bad files fail here, before any connection
    host_level = host_for_topology(topo)
    goal = len(migrations) if target is None else min(target, len(migrations))
    rendered = _rendered_once(topo, migrations, host_level, goal)
    stop = threading.Event()
    started = time.perf_counter()
    recreated_by_host: dict[str, list[int]] = {}
    host_applied: dict[str, list[int]] = {}

    def work(host: Host, result: fanout.HostResult[fanout.ApplyOutcome]) -> None:
        out = result.value
        recreated = recreated_by_host.setdefault(host.name, [])
        with locks.use(host) as conn:
            out.control_created = ensure_control_schema(conn, topo)
            # The host-level history first: shard migrations may use its extensions and types.
            out.host_applied = host_applied[host.name] = host_ledger.apply(
                conn, topo, host, host_level
            )
            count, plans = _plans(conn, topo, host, migrations, goal, recreated)
            out.unchanged = len(host.shards) - count
            chosen = fanout.host_jobs(host, conn, options.jobs) if count else None
            out.jobs_rule = chosen.rule if chosen else ""
            fanout.apply_plans(
                host,
                plans,
                options,
                stop,
                out,
                progress,
                total=count,
                jobs=chosen.count if chosen else 1,
            )
            names = {m.version: m.name for m in migrations}
            for f in out.failed:  # failure lines name the migration file, not just its version
                f["file"] = names.get(f["version"])
            if out.changed or out.failed:
                detail = {
                    "created": len(out.created),
                    "migrated": len(out.migrated),
                    "failed": len(out.failed),
                }
                if recreated:
                    detail["recreated"] = format_shards(recreated)
                log_event(conn, options.purpose, out.created, detail)
            if out.changed:
                # Record the verified checksums now, so the next `migrate --check` stays one cheap
                # query per host instead of re-rendering every applied migration.
                refresh_cache(conn, topo, migrations)

    selected = fanout.select_hosts(topo, hosts)
    with (
        fanout.stop_on_ctrl_c(stop) as ctrl_c,
        db.FleetLocks(
            selected,
            wait=options.wait,
            connect_timeout=options.connect_timeout,
            purpose=options.purpose,
        ) as locks,
    ):
        locks.refuse_untranslatable(rendered)
        reports = fanout.fan_out(selected, work, lambda h: fanout.ApplyOutcome())
        # what was built is what the migrations define, or init fails naming the shards
        check_applied(topo, reports, locks, connect_timeout=options.connect_timeout)
    # Shards whose schema had been dropped by hand, which init set out to build again.
    recreated = {h: format_shards(r) for h, r in recreated_by_host.items() if r}
    return fanout.FleetReport(
        "init",
        reports,
        time.perf_counter() - started,
        interrupted=ctrl_c.pressed,
        extra=fanout.InitFigures(
            latest_version=len(migrations),
            recreated=recreated,
            host_level=fanout.HostLevelFigures(
                latest=len(host_level), applied={h: v for h, v in host_applied.items() if v}
            ),
        ),
    )
