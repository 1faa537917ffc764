"""An adoption on a fleet host whose lock table is small for its shard tables: PostgreSQL's shared
lock table holds about ``max_locks_per_transaction`` x its processes, whichever transactions hold
them, so a chore that locks every shard table of a host in one transaction fails with "out of
shared memory" at a few thousand of them on stock settings. The copy, its restart after an abort
and the cleanup take them a batch at a time; the abort's freeze cannot, and ``adopt copy`` refuses
up front a host that could not hold it. Judged by the old database's rows (support/apps.py), read
with the test's own queries."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
import yaml
from support.adopt_cutover import finish_second_attempt
from support.apps import apply_fixes, fleet_rows, load_app, source_rows
from support.fleet import load, run_cli

pytestmark = pytest.mark.slow

# forum_django: 7 sharded tables. pg2 at max_locks_per_transaction=10 and max_connections=20: its
# lock table holds about 10 x 74 = 740 locks. 64 shards: 448 shard tables, which the abort's freeze
# can lock (~460 locks); a TRUNCATE of them all at once takes ~1,850 (each table's indexes and TOAST
# too), past what the table holds even with PostgreSQL's slack.
SMALL = {"max_locks_per_transaction": "10", "max_connections": "20"}


def _fleet(box, tmp_path: Path, name: str, shards: int) -> Path:
    """A topology of ``shards`` shards, all on pg2, over a new database ``name`` there."""
    doc = yaml.safe_load(box.topology_path.read_text())
    pg2 = next(h for h in doc["hosts"] if h["name"] == "pg2")
    admin = psycopg.conninfo.make_conninfo(pg2["dsn"], dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    where = tmp_path / name
    (where / "migrations").mkdir(parents=True)
    doc["shards"]["count"] = shards
    doc["hosts"] = [{**pg2, "dsn": psycopg.conninfo.make_conninfo(pg2["dsn"], dbname=name)}]
    doc["hosts"][0]["shards"] = f"0-{shards - 1}"
    doc["routing"] = {"key": "user_id"}
    doc["migrations"] = "migrations/"
    path = where / "shardctl.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _old_database(box, name: str) -> str:
    dsn = box.status()["hosts"][0]["dsn"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    dsn = psycopg.conninfo.make_conninfo(dsn, dbname=name)
    load_app(dsn, "forum_django", users=20)
    return dsn


def _ready(path: Path, dsn: str, plan: Path) -> None:
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, "forum_django", json.loads(r.stdout))
    for step in (
        ("adopt", "plan", "--from", dsn, "--out", plan),
        ("adopt", "baseline", "--from", dsn, "--plan", plan),
        # init's own batches (64 shards a transaction, ~15 locks a shard) sized for this small
        # lock table: the test is of adopt's transactions, not init's
        ("init", "--batch-size", "8"),
    ):
        r = run_cli(*step, config=path)
        assert r.exit_code == 0, (step, r.stdout, r.stderr)


@pytest.fixture
def small_lock_table(private_sandbox):
    box = private_sandbox(hosts=2, shards=4)
    pg2 = box.status()["hosts"][1]["dsn"]
    with psycopg.connect(pg2, autocommit=True) as conn:
        for setting, value in SMALL.items():
            conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
    box.stop_host("pg2")
    box.start_host("pg2")
    return box


def _same_rows(path: Path, dsn: str, plan: Path) -> None:
    doc = yaml.safe_load(plan.read_text())
    assert fleet_rows(load(path), doc) == source_rows(dsn, doc)


def test_the_whole_path_on_a_host_whose_lock_table_cannot_hold_its_tables_at_once(
    small_lock_table, tmp_path
):
    """Copy, verify, cutover, abort, copy again (the restart empties the fleet), cutover, cleanup:
    each step passes, the fleet holds exactly the old database's rows, nothing is left over."""
    box = small_lock_table
    path = _fleet(box, tmp_path, "fleet64", 64)
    dsn = _old_database(box, "old64")
    plan = tmp_path / "plan.yaml"
    _ready(path, dsn, plan)
    steps = [
        ("adopt", "copy", "--from", dsn, "--plan", plan),
        ("adopt", "verify", "--from", dsn, "--plan", plan, "--dark-reads", "0"),
        ("adopt", "cutover"),
        ("adopt", "cutover", "--abort"),
        ("adopt", "copy", "--from", dsn, "--plan", plan),
    ]
    for step in steps:
        r = run_cli(*step, config=path)
        assert r.exit_code == 0, (step, r.stdout, r.stderr)
    _same_rows(path, dsn, plan)
    finish_second_attempt(path, dsn, plan)  # verify, cutover, cleanup: nothing left over


def test_a_host_too_small_for_the_aborts_freeze_is_refused_before_anything_changes(
    small_lock_table, tmp_path
):
    """128 shards (907 tables to lock at once: 896 shard tables, their 7 parents, 2 global tables
    and their mirrors) on the same host: adopt copy refuses in one line
    with the setting to raise; the old database and the topology file are as they were."""
    box = small_lock_table
    path = _fleet(box, tmp_path, "fleet128", 128)
    dsn = _old_database(box, "old128")
    plan = tmp_path / "plan.yaml"
    _ready(path, dsn, plan)
    before = path.read_bytes()
    r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan, config=path)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert (
        "host pg2: adopt cutover --abort locks its 907 adopted tables in one transaction, and its "
        "lock table holds about 740 locks (max_locks_per_transaction 10 x 74 server processes): "
        "set max_locks_per_transaction to at least 16 there" in lines[0]
    ), lines[0]
    assert path.read_bytes() == before
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'shardctl%'"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
