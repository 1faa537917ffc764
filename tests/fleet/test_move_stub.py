"""Direct clients (psql, without the Router) that still use a moved shard's old schema get an error that
names the shard and its new host, not a bare "relation does not exist" (issue 12, item 2): the cutover
leaves a stub under the old name until --cleanup or --abort."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from conftest import connect, load, run_cli
from load import pg_bin
from shardctl.errors import OperationFailed
from shardctl.ops.move import MoveOptions, abort_move, move_shards
from test_move import fleet3, ids_on, init_fleet, load_rows, make_fleet  # noqa: F401


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(pg_bin("psql")), "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
                          capture_output=True, text=True, timeout=60)


def schema_exists(topo, host: str, schema: str) -> bool:
    with connect(topo, host) as conn:
        return conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()[0] == 1


def test_psql_on_the_old_host_is_told_where_the_shard_went(fleet3):
    topo = load(fleet3)
    pg1 = topo.host("pg1").dsn
    assert psql(pg1, "SET search_path = insta4; INSERT INTO photos (user_id, caption) VALUES (4, 'before')"
                ).returncode == 0
    report = move_shards(load(fleet3), [4, 5], "pg2")
    for sql in ("SET search_path = insta4; INSERT INTO photos (user_id, caption) VALUES (4, 'after')",
                "SET search_path = insta4; SELECT count(*) FROM photos",
                "SET search_path = insta4; UPDATE photos SET caption = 'x'",
                "DELETE FROM insta4.photos",
                "SELECT insta4.next_id()",
                "SET search_path = insta4; SELECT next_id()",
                # Writes of no row: no row trigger fires, and the planner skips the view's read.
                "INSERT INTO insta4.photos (user_id, caption) SELECT 4, 'none' WHERE false",
                "UPDATE insta4.photos SET caption = 'x' WHERE false",
                "DELETE FROM insta4.photos WHERE false"):
        out = psql(pg1, sql)
        assert out.returncode != 0, (sql, out.stdout)
        assert f"shard 4 moved to pg2 (move {report['move_id']})" in out.stderr, (sql, out.stderr)
        assert "does not exist" not in out.stderr
        assert "password" not in out.stderr
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("SET search_path = insta5")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO photos (user_id, caption) VALUES (5, 'after') RETURNING id")
        assert info.value.sqlstate == "SCM01" and "shard 5 moved to pg2" in str(info.value)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT * FROM users")
        assert info.value.sqlstate == "SCM01"
    with connect(topo, "pg1") as conn:  # the stubs were made before the freeze and renamed in it
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE '%%\\_stub\\_%%'").fetchone()[0] == 0
    # The rows are on pg2, the new writes are not anywhere else; the stub is no shard for verify/status.
    assert len(ids_on(load(fleet3), "pg2", [4])) == 151
    r = run_cli("verify", config=fleet3)
    assert r.exit_code == 0, r
    doc = json.loads(run_cli("status", "--json", config=fleet3).stdout)
    assert all(not h["drift"] for h in doc["hosts"]), doc["hosts"]
    # --cleanup removes the stubs with the old copies.
    assert schema_exists(topo, "pg1", "insta4")
    assert run_cli("move-shard", "--cleanup", config=fleet3).exit_code == 0
    assert not schema_exists(topo, "pg1", "insta4") and not schema_exists(topo, "pg1", "insta5")
    assert schema_exists(topo, "pg2", "insta4")
    assert run_cli("verify", config=fleet3).exit_code == 0


def test_abort_before_a_cutover_removes_the_stubs_it_made(fleet3):
    """A cutover that gives up leaves the stubs it made before its freeze (under other names); --abort drops them."""
    topo = load(fleet3)
    move_shards(load(fleet3), [7], "pg2", phases=["prepare", "sync"])
    with connect(topo, "pg1", autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0]
        conn.execute("BEGIN")
        conn.execute("INSERT INTO insta7.photos (user_id) VALUES (7)")  # the freeze cannot lock the table
        with pytest.raises(OperationFailed):
            move_shards(load(fleet3), [7], "pg2", phases=["cutover"], options=MoveOptions(max_freeze=0.3, attempts=1))
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'insta7\\_stub\\_%'").fetchone()[0] == 1
    abort_move(load(fleet3), shards=[7])
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0] == before
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'insta7\\_%%'").fetchone()[0] == 0
    assert run_cli("verify", config=fleet3).exit_code == 0


def test_abort_after_cutover_removes_the_stub(fleet3):
    topo = load(fleet3)
    move_shards(load(fleet3), [6], "pg2")
    out = psql(topo.host("pg1").dsn, "SELECT count(*) FROM insta6.photos")
    assert out.returncode != 0 and "shard 6 moved to pg2" in out.stderr
    abort_move(load(fleet3), shards=[6])
    assert load(fleet3).host_of(6).name == "pg1"
    out = psql(topo.host("pg1").dsn, "SET search_path = insta6; INSERT INTO photos (user_id) VALUES (6); "
                                     "SELECT count(*) FROM photos")
    assert out.returncode == 0, out.stderr
    assert "151" in out.stdout
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM pg_views WHERE schemaname LIKE 'insta6%%'").fetchone()[0] == 0
    assert run_cli("verify", config=fleet3).exit_code == 0
