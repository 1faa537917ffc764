"""Preflight: a move that cannot finish fails before any state changes, naming the setting or grant;
subscriptions are sized to the target's free logical replication workers."""

from __future__ import annotations

import json

import pytest

from conftest import connect, load, run_cli
from shardctl.errors import OperationFailed
from shardctl.ops.move import move_shards
from test_move import drop_replication, fleet3, ids_on, init_fleet, load_rows, make_fleet  # noqa: F401


def _unchanged(topo) -> None:
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            assert conn.execute("SELECT DISTINCT state FROM shardctl.shards").fetchall() == [("active",)]
            assert conn.execute("SELECT to_regclass('shardctl.moves') IS NULL OR "
                                "NOT EXISTS (SELECT 1 FROM shardctl.moves)").fetchone()[0]


def test_role_without_replication_is_refused_before_any_change(fleet3):
    topo = load(fleet3)
    with connect(topo, "pg1", autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute("DROP ROLE IF EXISTS mover_norepl")
        conn.execute("CREATE ROLE mover_norepl LOGIN")
        conn.execute(f'GRANT CONNECT ON DATABASE "{db}" TO mover_norepl')
        conn.execute("GRANT USAGE ON SCHEMA shardctl TO mover_norepl; "
                     "GRANT SELECT ON ALL TABLES IN SCHEMA shardctl TO mover_norepl")
    dsn = topo.host("pg1").dsn
    fleet3.write_text(fleet3.read_text().replace(dsn, dsn.replace("postgres@", "mover_norepl@")))
    try:
        r = run_cli("move-shard", "0-3", "--to", "pg2", config=fleet3)
        assert r.exit_code == 1, r
        assert "preflight: host pg1: role mover_norepl lacks REPLICATION (ALTER ROLE mover_norepl REPLICATION)" \
            in r.stderr
        assert "GRANT pg_monitor or pg_read_all_stats TO mover_norepl" in r.stderr
        assert "lacks CREATE on the database" in r.stderr and "does not own 12 of the shards' tables" in r.stderr
        assert "(nothing was changed)" in r.stderr and len([ln for ln in r.stderr.splitlines() if ln.startswith("error")]) <= 1
    finally:
        fleet3.write_text(fleet3.read_text().replace("mover_norepl@", "postgres@"))
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute("DROP OWNED BY mover_norepl; DROP ROLE mover_norepl")
    _unchanged(topo)


def test_subscriptions_sized_to_a_target_with_two_workers(private_sandbox):
    """A target with max_logical_replication_workers = 2 (stock is 4): one subscription with a table-sync
    worker to spare instead of four that would take every worker and stall; with none free it refuses."""
    box = private_sandbox(hosts=2, shards=16)
    path = box.topology_path
    assert run_cli("init", config=path).exit_code == 0
    topo = load(path)
    load_rows(topo, list(range(8)), 50)
    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_logical_replication_workers = 2")
    box.stop_host("pg2")
    box.start_host("pg2")
    moving = topo.host("pg1").shards[:4]
    before = ids_on(topo, "pg1", moving)
    r = run_cli("move-shard", f"{moving[0]}-{moving[-1]}", "--to", "pg2", "--json", config=path)
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert report["phase"] == "cut_over"
    assert sorted(ids_on(topo, "pg2", moving)) == sorted(before)
    with connect(topo, "pg2", autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM shardctl.moves WHERE (detail->>'max_subscriptions')::int = 1"
                            ).fetchone()[0] == 1
        # Take the workers away: another subscription that holds them (disabled ones are not counted).
        conn.execute("ALTER SYSTEM SET max_logical_replication_workers = 1")
    box.stop_host("pg2")
    box.start_host("pg2")
    nxt = topo.host("pg1").shards[4:6]
    with pytest.raises(OperationFailed, match="max_logical_replication_workers=1 with 0 in use: a move needs 2 free"):
        move_shards(load(path), nxt, "pg2")
