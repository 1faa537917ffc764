"""``init``: the control schema and every owned shard, complete with all migrations, on every host."""

from __future__ import annotations

import threading
import time

from ..engine import connections as db
from ..engine.executor import RunOptions, ShardPlan, Step
from ..engine.fanout import (FleetReport, HostReport, ProgressFactory, apply_plans, ensure_control_schema, log_event,
                    read_shards, run_on_host, select_hosts)
from ..sql.migrations import Migration, for_topology
from ..model.ranges import format_shards
from ..sql.render import render_shard
from ..model.topology import Host, Topology


def steps_for(migrations: list[Migration], topo: Topology, shard: int, above: int = 0,
              target: int | None = None) -> list[Step]:
    """Rendered migration steps for one shard, versions ``above < v <= target``."""
    out = []
    for m in migrations:
        if m.version <= above or (target is not None and m.version > target):
            continue
        text = m.sql(topo, shard)
        out.append(Step(m.version, m.description, text, m.checksum_for(topo, shard), m.transactional))
    return out


def forget_sql(shard: int) -> str:
    """Drop a shard's control rows (its schema is gone), ahead of creating it again."""
    return (f"DELETE FROM shardctl.migrations WHERE shard_id = {int(shard)};\n"
            f"DELETE FROM shardctl.shards WHERE shard_id = {int(shard)};\n")


def init(topo: Topology, *, hosts: list[str] | None = None, options: RunOptions | None = None,
         wait: float = 0, progress: ProgressFactory | None = None, target: int | None = None) -> FleetReport:
    """Create the control schema and every missing shard (schema, sequence, next_id(), migrations),
    and bring present shards to the latest migration (or to ``target``). Idempotent."""
    options = options or RunOptions()
    options.purpose = options.purpose or "init"
    migrations = for_topology(topo)  # bad files fail here, before any connection
    goal = len(migrations) if target is None else min(target, len(migrations))
    for shard in (topo.hosts[0].shards[:1] if topo.hosts and topo.hosts[0].shards else []):
        steps_for(migrations, topo, shard)  # and templates that do not render, too
    stop = threading.Event()
    started = time.perf_counter()

    recreated_by_host: dict[str, list[int]] = {}

    def work(host: Host) -> HostReport:
        report = HostReport(host.name)
        recreated = recreated_by_host.setdefault(host.name, [])

        def body() -> None:
            with locks.use(host) as conn:
                report.control_created = ensure_control_schema(conn, topo)
                present = read_shards(conn)
                schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")} if present else set()
                plans = []
                for n in host.shards:
                    row = present.get(n)
                    schema = topo.schema_name(n)
                    if row is None:
                        plans.append(ShardPlan(n, schema, render_shard(topo, n),
                                               steps_for(migrations, topo, n, target=goal)))
                    elif row.state == "active" and row.schema not in schemas:
                        # Recorded, but its schema was dropped behind shardctl's back: nothing is left
                        # to keep, so build it afresh, replacing its control rows in the same transaction.
                        recreated.append(n)
                        plans.append(ShardPlan(n, schema, forget_sql(n) + render_shard(topo, n),
                                               steps_for(migrations, topo, n, target=goal)))
                    elif row.version < goal:
                        plans.append(ShardPlan(n, schema, None, steps_for(migrations, topo, n, row.version, goal)))
                report.unchanged = len(host.shards) - len(plans)
                apply_plans(host, plans, options, stop, report, progress)
                if report.changed or report.failed:
                    detail = {"created": len(report.created), "migrated": len(report.migrated),
                              "failed": len(report.failed)}
                    if recreated:
                        detail["recreated"] = format_shards(recreated)
                    log_event(conn, options.purpose, report.created, detail)
                if report.changed:
                    # Record the verified checksums now, so the next `migrate --check` stays one cheap
                    # query per host instead of re-rendering every applied migration.
                    from .migrate import refresh_cache

                    refresh_cache(conn, topo, migrations)

        return run_on_host(host, report, body)

    from ..engine.fanout import for_each_host

    selected = select_hosts(topo, hosts)
    with db.FleetLocks(selected, wait=wait, connect_timeout=options.connect_timeout,
                       purpose=options.purpose) as locks:
        reports = for_each_host(selected, work)
    # Shards whose schema had been dropped by hand, which init set out to build again.
    recreated = {h: format_shards(r) for h, r in recreated_by_host.items() if r}
    return FleetReport("init", reports, time.perf_counter() - started,
                       extra={"latest_version": len(migrations), "recreated": recreated})
