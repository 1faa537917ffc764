"""Preflight: everything a move needs from both servers, checked before any state changes.

Each problem is one line naming the setting or grant to change. The checks also size the move:
how many subscriptions the target can run at once with a table-sync worker to spare.
"""

from __future__ import annotations

from psycopg import conninfo as pg_conninfo

from ...errors import OperationFailed
from ...sql import catalog as q
from .run import MoveRun, require_version

SYNC_WORKERS_PER_SUBSCRIPTION = 1  # at least one table-sync worker beside each apply worker


def subscriptions_for(run: MoveRun, target_facts: dict) -> int:
    """Subscriptions the target can run at once, each leaving room for a table-sync worker."""
    free = target_facts["max_logical_replication_workers"] - target_facts["workers_used"]
    return max(0, min(run.options.max_subscriptions, free // (1 + SYNC_WORKERS_PER_SUBSCRIPTION)))


def preflight(run: MoveRun) -> dict:
    """Check both hosts; returns the sizing (``max_subscriptions``) to record with the move.
    Raises OperationFailed listing every problem found."""
    problems: list[str] = []
    with run.connect(run.source) as src:
        facts_s = q.server_facts(src)
        require_version(run.source, facts_s, "moving")
        problems += _source_problems(run, src, facts_s)
    with run.connect(run.target) as tgt:
        facts_t = q.server_facts(tgt)
        require_version(run.target, facts_t, "receiving")
        problems += _target_problems(run, tgt, facts_t)
    subs = subscriptions_for(run, facts_t)
    if subs < 1:
        problems.append(f"host {run.target.name}: max_logical_replication_workers={facts_t['max_logical_replication_workers']}"
                        f" with {facts_t['workers_used']} in use: a move needs 2 free (an apply worker and a "
                        f"table-sync worker); raise it (a restart) or wait for other subscriptions to finish")
    if problems:
        raise OperationFailed("preflight: " + "; ".join(problems) + " (nothing was changed)")
    return {"max_subscriptions": subs}


def _source_problems(run: MoveRun, conn, facts: dict) -> list[str]:
    name, out = run.source.name, []
    if facts["wal_level"] != "logical":
        out.append(f"host {name} has wal_level={facts['wal_level']}: set wal_level=logical (a restart)")
    free_slots = facts["max_replication_slots"] - facts["slots_used"]
    if free_slots < 2:
        out.append(f"host {name}: max_replication_slots={facts['max_replication_slots']} with {facts['slots_used']} "
                   f"used: a move needs 2 free (a slot and a table-sync slot); raise it (a restart)")
    free_senders = facts["max_wal_senders"] - facts["senders_used"]
    if free_senders < 2:
        out.append(f"host {name}: max_wal_senders={facts['max_wal_senders']} with {facts['senders_used']} in use: "
                   f"a move needs 2 free; raise it (a restart)")
    role = q.role_facts(conn, run.schemas)
    if not role["superuser"]:
        if not role["replication"]:
            out.append(f"host {name}: role {role['name']} lacks REPLICATION (ALTER ROLE {role['name']} REPLICATION)")
        if not role["create_on_database"]:
            out.append(f"host {name}: role {role['name']} lacks CREATE on the database (to create publications)")
        if not role["read_all_stats"]:  # pg_stat_replication hides the subscriptions' progress otherwise
            out.append(f"host {name}: role {role['name']} cannot see replication progress (GRANT pg_monitor or "
                       f"pg_read_all_stats TO {role['name']})")
        if role["tables_not_owned"]:
            out.append(f"host {name}: role {role['name']} does not own {role['tables_not_owned']} of the shards' "
                       f"tables (publishing them needs ownership)")
    return out


def _target_problems(run: MoveRun, conn, facts: dict) -> list[str]:
    name, out = run.target.name, []
    if facts["log_statement"] in ("ddl", "all") and pg_conninfo.conninfo_to_dict(run.publisher_conninfo()).get("password"):
        out.append(f"host {name} has log_statement={facts['log_statement']}: it would write the subscription's "
                   f"password to the server log; set log_statement to none or mod for the move")
    role = q.role_facts(conn, [])
    if not role["superuser"]:
        if facts["version_num"] < 160000:
            out.append(f"host {name} runs PostgreSQL {facts['version_num'] // 10000}: a role that is not superuser "
                       f"can create subscriptions from PostgreSQL 16 on (pg_create_subscription)")
        elif not role["create_subscription"]:
            out.append(f"host {name}: role {role['name']} lacks pg_create_subscription "
                       f"(GRANT pg_create_subscription TO {role['name']})")
        if not role["create_on_database"]:
            out.append(f"host {name}: role {role['name']} lacks CREATE on the database (for the shards' schemas "
                       f"and subscriptions)")
    return out
