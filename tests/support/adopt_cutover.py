"""What the adoption's cutover tests share (tests/fleet/test_adopt_cutover.py and the files that
test one side of it): the real commands up to the cutover, the cutover's JSON, and what is left on
the databases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg

from shardctl.sql.catalog.adopt_cutover import aborted_name
from support.apps import apply_fixes, load_app
from support.fleet import load, run_cli

SHARDS = 4


def fleet_name(table: str, aborted: bool = False) -> str:
    """The name of adopted ``table``'s shard tables on the fleet: after an ``--abort`` (``aborted``),
    the one it gave them (a stale Router's read by the old name meets undefined_table)."""
    return aborted_name(table) if aborted else table


def sql(conn: psycopg.Connection, text: str, *args) -> list[tuple]:
    cur = conn.execute(text, args)
    return cur.fetchall() if cur.description else []


def leftovers(path: Path, src_dsn: str) -> dict[str, list]:
    """Replication objects and parents of the adoption left on any database."""
    topo = load(path)
    out: dict[str, list] = {}
    conns = [("source", src_dsn, {})] + [(h.name, None, h.connect_kwargs()) for h in topo.hosts]
    for name, dsn, kwargs in conns:
        with (
            psycopg.connect(dsn, autocommit=True)
            if dsn
            else psycopg.connect(**kwargs, autocommit=True)
        ) as c:
            found = sql(
                c,
                "SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE slot_name LIKE 'shardctl\\_adopt%%'",
            )
            found += sql(
                c,
                "SELECT 'publication ' || pubname FROM pg_publication WHERE pubname LIKE 'shardctl\\_adopt%%'",
            )
            found += sql(
                c,
                "SELECT 'subscription ' || subname FROM pg_subscription WHERE subname LIKE 'shardctl\\_adopt%%'",
            )
            found += sql(
                c,
                "SELECT 'parent ' || relname FROM pg_class WHERE relkind = 'p' "
                "AND relnamespace::regnamespace::text IN ('public', 'shardctl_adopted')",
            )
            if found:
                out[name] = [r[0] for r in found]
    return out


def cli_json(path: Path, *args: str) -> dict:
    r = run_cli("adopt", "cutover", *args, "--json", config=path)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def real_adoption(make_fleet, tmp_path: Path, app: str = "forum_django") -> tuple[Path, str, Path]:
    """``app``'s schema (the Django forum's) adopted with the real commands up to the cutover:
    (topology, old database's DSN, plan file)."""
    dsn = make_fleet.new_database(0)
    path = make_fleet(hosts=2, shards=SHARDS, extra="routing:\n  key: user_id\n")
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    load_app(dsn, app, users=20)
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, app, json.loads(r.stdout))
    plan_file = tmp_path / "plan.yaml"
    steps = [
        ("adopt", "plan", "--from", dsn, "--out", plan_file),
        ("adopt", "baseline", "--from", dsn, "--plan", plan_file),
        ("init",),
        ("adopt", "copy", "--from", dsn, "--plan", plan_file),
        ("adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0"),
        ("adopt", "cutover"),
    ]
    for step in steps:
        r = run_cli(*step, config=path)
        assert r.exit_code == 0, (step, r)
    return path, dsn, plan_file


def shard_rows(path: Path, query: str) -> Iterator[tuple[str, str, tuple]]:
    """(host, shard schema, row) for each row of ``query`` run in every shard of the fleet, its
    ``{}`` the shard's schema: on each server directly (its admin DSN, not through a pooler)."""
    topo = load(path)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
            for n in host.shards:
                schema = topo.schema_name(n)
                for row in sql(conn, query.format(schema)):
                    yield host.name, schema, row


def fleet_tasks(path: Path, aborted: bool = False) -> dict[int, dict]:
    """id -> the row (as jsonb: the enum as its label) of every task on the fleet's shards (after an
    abort: ``aborted``, under the name it gave them)."""
    out: dict[int, dict] = {}
    query = f"SELECT id, to_jsonb(t) FROM {{}}.{fleet_name('tasks', aborted)} t"
    for _, _, (i, row) in shard_rows(path, query):
        assert i not in out, f"task {i} twice"
        out[i] = row
    return out


def finish_second_attempt(path: Path, dsn: str, plan_file: Path) -> None:
    """Verify, cut over and clean up (slot names are the server's: the next test may reuse them)."""
    steps = [
        ("adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0"),
        ("adopt", "cutover"),
        ("adopt", "cutover", "--cleanup"),
    ]
    for step in steps:
        r = run_cli(*step, config=path)
        assert r.exit_code == 0, (step, r.stdout, r.stderr)
    assert leftovers(path, dsn) == {}
