"""Preflight: everything a move needs from both servers, checked before any state changes.

Each problem is one line naming the setting or grant to change. The checks also size the move:
how many subscriptions the target can run at once with a table-sync worker to spare.

The target's server must reach the source as a subscriber: it opens a replication connection with the
very connection string the move's subscriptions will use (``MoveRun.publisher_conninfo``), in a
transaction that is rolled back, so a wrong host, port, ``pg_hba.conf`` line, certificate or password
is one line here instead of a move stopped half-way in sync.

The target must also be able to run every migration the moving shards have applied (a target on an
older PostgreSQL may refuse a newer syntax or function): a trial creates one moving shard there and
applies its migrations in a transaction that is always rolled back.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import conninfo as pg_conninfo

from ...engine import connections as db
from ...engine import host_ledger
from ...errors import OperationFailed
from ...sql import session
from ...sql.catalog import inspect, replication
from ...sql.catalog.control import shard_list
from ...sql.host_migrations import host_for_topology
from ...sql.migrations import for_topology, steps_for, transactional_form
from ...sql.render import render_shard
from .run import MoveRun, require_version

TRIAL_STATEMENT_TIMEOUT = 60.0  # seconds
TRIAL_LOCK_TIMEOUT = 5.0

PROBE_PUBLICATION = "shardctl_preflight_probe"  # never created: the probe fetches nothing
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
        facts_s = inspect.server_facts(src)
        require_version(run.source, facts_s, "moving")
        problems += _source_problems(run, src, facts_s)
        rows = shard_list(src)
    with run.connect(run.target) as tgt:
        facts_t = inspect.server_facts(tgt)
        require_version(run.target, facts_t, "receiving")
        target_problems = _target_problems(run, tgt, facts_t)
        problems += target_problems
    problems += _encoding_problems(run, facts_s, facts_t)
    # a missing grant would make the probe and the trial fail for the wrong reason
    if not target_problems:
        problems += _reach_problems(run)
        problems += _trial_problems(run, rows, facts_t)
    subs = subscriptions_for(run, facts_t)
    if subs < 1:
        problems.append(
            f"host {run.target.name}: max_logical_replication_workers={facts_t['max_logical_replication_workers']}"
            f" with {facts_t['workers_used']} in use: a move needs 2 free (an apply worker and a "
            f"table-sync worker); raise it (a restart) or wait for other subscriptions to finish"
        )
    if problems:
        raise OperationFailed("preflight: " + "; ".join(problems) + " (nothing was changed)")
    return {"max_subscriptions": subs}


def _encoding_problems(run: MoveRun, facts_s: dict, facts_t: dict) -> list[str]:
    """Shards move only between databases of one encoding: across encodings, replication converts
    text (or fails on a character the target cannot hold, or on SQL_ASCII bytes that are not UTF-8),
    and the row checks, which hash the stored bytes, would find every non-ASCII value changed."""
    enc_s, enc_t = facts_s["server_encoding"], facts_t["server_encoding"]
    if enc_s == enc_t:
        return []
    return [
        (
            f"host {run.source.name}'s database is {enc_s} and host {run.target.name}'s is {enc_t}: shards move only "
            f"between databases of the same encoding (text would not arrive byte for byte)"
        )
    ]


def _source_problems(run: MoveRun, conn, facts: dict) -> list[str]:
    name, out = run.source.name, []
    if facts["wal_level"] != "logical":
        out.append(
            f"host {name} has wal_level={facts['wal_level']}: set wal_level=logical (a restart)"
        )
    free_slots = facts["max_replication_slots"] - facts["slots_used"]
    if free_slots < 2:
        out.append(
            f"host {name}: max_replication_slots={facts['max_replication_slots']} with {facts['slots_used']} "
            f"used: a move needs 2 free (a slot and a table-sync slot); raise it (a restart)"
        )
    free_senders = facts["max_wal_senders"] - facts["senders_used"]
    if free_senders < 2:
        out.append(
            f"host {name}: max_wal_senders={facts['max_wal_senders']} with {facts['senders_used']} in use: "
            f"a move needs 2 free; raise it (a restart)"
        )
    role = inspect.role_facts(conn, run.schemas)
    out += publisher_problems(name, role)
    # No pg_read_all_stats: without it the slots' confirmed_flush_lsn tells how far the target has
    # applied (replication.replayed), where the walsender's replay_lsn is hidden.
    if not role["superuser"] and role["tables_not_owned"]:
        out.append(
            f"host {name}: role {role['name']} does not own {role['tables_not_owned']} of the shards' "
            f"tables (publishing them needs ownership)"
        )
    return out


def _target_problems(run: MoveRun, conn, facts: dict) -> list[str]:
    name, out = run.target.name, []
    if facts["log_statement"] in ("ddl", "all") and pg_conninfo.conninfo_to_dict(
        run.publisher_conninfo()
    ).get("password"):
        out.append(
            f"host {name} has log_statement={facts['log_statement']}: it would write the subscription's "
            f"password to the server log; set log_statement to none or mod for the move"
        )
    return out + subscriber_problems(name, inspect.role_facts(conn, []), facts["version_num"])


def publisher_problems(name: str, role: dict) -> list[str]:
    """What the role (``inspect.role_facts``) lacks to publish from host ``name``: a slot, a
    publication."""
    out: list[str] = []
    if role["superuser"]:
        return out
    if not role["replication"]:
        out.append(
            f"host {name}: role {role['name']} lacks REPLICATION (ALTER ROLE {role['name']} REPLICATION)"
        )
    if not role["create_on_database"]:
        out.append(
            f"host {name}: role {role['name']} lacks CREATE on the database (to create publications)"
        )
    return out


def subscriber_problems(name: str, role: dict, version_num: int) -> list[str]:
    """What the role (``inspect.role_facts``) lacks to subscribe on host ``name``."""
    out: list[str] = []
    if role["superuser"]:
        return out
    if version_num < 160000:
        out.append(
            f"host {name} runs PostgreSQL {version_num // 10000}: a role that is not superuser "
            f"can create subscriptions from PostgreSQL 16 on (pg_create_subscription)"
        )
    elif not role["create_subscription"]:
        out.append(
            f"host {name}: role {role['name']} lacks pg_create_subscription "
            f"(GRANT pg_create_subscription TO {role['name']})"
        )
    if not role["create_on_database"]:
        out.append(
            f"host {name}: role {role['name']} lacks CREATE on the database (for the shards' schemas "
            f"and subscriptions)"
        )
    return out


@contextmanager
def _rolled_back(run: MoveRun) -> Iterator[psycopg.Connection]:
    """A connection to the target in a transaction that is always rolled back, whatever ran in it:
    the probe's and the trial's leave nothing behind."""
    with run.connect(run.target, autocommit=False) as conn:
        try:
            yield conn
        finally:
            if not conn.closed and not conn.broken:
                conn.rollback()


def _reach_problems(run: MoveRun) -> list[str]:
    """The target's server connects to the source with the move's connection string (replication.probe_subscription,
    rolled back): the one line of what stops it, or nothing.

    With a password in the connection string, the statement that fails would be written to the target's
    server log with the password in it: the probe then runs only for a role that may turn that off
    (``log_min_error_statement``: a superuser, or a role granted SET on it), else it is noted as not run."""
    conninfo = run.publisher_conninfo()
    parts = pg_conninfo.conninfo_to_dict(conninfo)
    if "connect_timeout" not in parts:
        conninfo = pg_conninfo.make_conninfo(conninfo, connect_timeout=run.options.connect_timeout)
    with _rolled_back(run) as conn:
        try:
            if parts.get("password"):
                try:
                    session.set_settings(conn, {"log_min_error_statement": "panic"})
                except psycopg.errors.InsufficientPrivilege:
                    run.note(
                        f"preflight: whether {run.target.name} reaches {run.source.name} is known when sync "
                        f"starts (the connection string has a password, which a failed probe would log; "
                        f"GRANT SET ON PARAMETER log_min_error_statement to the role lets the probe run)"
                    )
                    return []
            replication.probe_subscription(
                conn, f"shardctl_probe_{secrets.token_hex(4)}", conninfo, PROBE_PUBLICATION
            )
        except psycopg.Error as exc:
            return [
                (
                    f"host {run.target.name} cannot reach host {run.source.name} as a subscriber: "
                    f"{db.first_line(exc)}"
                )
            ]
    run.report.preflight_reach = True
    return []


def server_version(facts: dict) -> str:
    num = facts["version_num"]
    return f"PostgreSQL {num // 10000}.{num % 10000}"


def _trial_host_level(run: MoveRun, conn) -> None:
    """Inside the trial's transaction: the host-level files the target lacks (prepare applies them for
    real), so the trial's shard finds the extensions and types its migrations use."""
    host_level = host_for_topology(run.topo)
    if not host_level:
        return
    for v in host_ledger.host_state(conn, host_level).pending:
        m = host_level[v - 1]
        if m.transactional:
            session.set_settings(conn, {"search_path": "public"})
            conn.execute(m.sql(run.topo, run.target.name))


def _trial_problems(run: MoveRun, rows: dict, facts: dict) -> list[str]:
    """Create the moving shard with the most migrations on the target and apply its migrations there, in
    one transaction that is always rolled back: the schema is one prepare will create (the target holds
    none of the moving shards' schemas), and nothing of it outlives the ROLLBACK. Returns the first
    migration the target's server refuses, as one line, or nothing."""
    known = [n for n in run.move.shards if n in rows]
    if not known:
        return []  # prepare names the shards the source does not record
    shard = max(known, key=lambda n: rows[n].version)
    migrations = for_topology(run.topo)
    steps = steps_for(migrations, run.topo, shard, 0, min(rows[shard].version, len(migrations)))
    names = {m.version: m.name for m in migrations}
    schema = run.schema(shard)
    skipped: list[str] = []
    what = f"the creation of shard {shard}"
    with _rolled_back(run) as conn:
        try:
            session.set_settings(
                conn,
                {
                    "statement_timeout": session.duration(TRIAL_STATEMENT_TIMEOUT),
                    "lock_timeout": session.duration(TRIAL_LOCK_TIMEOUT),
                },
            )
            _trial_host_level(run, conn)
            conn.execute(render_shard(run.topo, shard))
            session.set_settings(conn, {"search_path": session.search_path(schema)})
            for step in steps:
                what = f"migration {names[step.version]} (rendered for shard {shard})"
                sql_text = step.sql if step.transactional else transactional_form(step.sql)
                if sql_text is None:
                    # No transactional form (VACUUM and the like): it cannot be tried here; it runs as
                    # migrate ran it, outside a transaction, when prepare creates the shards.
                    skipped.append(names[step.version])
                    continue
                conn.execute(sql_text)
        except psycopg.Error as exc:
            return [
                (
                    f"host {run.target.name} runs {server_version(facts)}, which cannot run {what}: "
                    f"{db.first_line(exc)}"
                )
            ]
    if skipped:
        run.note(
            f"preflight: {', '.join(skipped)} cannot run in a transaction and had no transactional form "
            f"to try on {run.target.name}"
        )
    run.report.preflight_trial = {"shard": shard, "migrations": len(steps), "skipped": skipped}
    return []
