"""Issue #23: applications through PgBouncer lose nothing and read nothing from the wrong shard.

Router writers and readers (and psql and pgbench clients) run while ``migrate`` adds a column and
while ``move-shard`` moves 4 shards; each run is recorded as a history and checked against the
real databases (support/history.py): no application-visible error, no lost or duplicated row, no
row in a wrong shard, no read answered by a wrong shard or missing an acknowledged row.

Every test runs directly, through PgBouncer in transaction mode (``default_pool_size = 3`` per
database, so the server connections under a client change all the time) and in session mode.
"""

from __future__ import annotations

import time

import pytest
from support.clients import PgbenchClient, PsqlClient, history_traffic, keys_for
from support.fleet import load, run_cli
from support.history import History

from shardctl.ops.move import move_shards

MODES = ["direct", "transaction", "session"]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def test_pooled_topology_goes_through_pgbouncer(pooled_fleet, mode):
    """The fleet's dsn really is PgBouncer's (and admin_dsn the server's) in the pooled modes: the
    other tests would prove nothing about poolers otherwise."""
    import psycopg

    topo = load(pooled_fleet(hosts=2, shards=4))
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin")) as conn:
            server_port = conn.execute("SELECT current_setting('port')::int").fetchone()[0]
        app_port = psycopg.conninfo.conninfo_to_dict(host.dsn_for("app"))["port"]
        assert (int(app_port) == server_port) == (mode == "direct"), (host.dsn, host.admin_dsn)
        with psycopg.connect(**host.connect_kwargs(purpose="app")) as conn:
            assert conn.execute("SELECT current_setting('port')::int").fetchone()[0] == server_port


@pytest.mark.parametrize(
    "mode",
    ["direct", "transaction", pytest.param("session", marks=pytest.mark.slow)],
    indirect=True,
)
def test_router_clients_during_migrate(pooled_fleet, mode):
    """6 writers and 2 readers on every shard while ``shardctl migrate`` adds a column to all of them."""
    path = pooled_fleet(hosts=2, shards=16)
    (path.parent / "migrations" / "V0003__add_photo_filter.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN filter text NOT NULL DEFAULT 'none';\n"
    )
    topo = load(path)
    with history_traffic(path, keys_for(topo, list(range(16)), 3), writers=6, readers=2) as traffic:
        result = run_cli("migrate", config=path)
    assert result.exit_code == 0, result
    report = traffic.history.check()
    assert report.ok, report
    assert report.counts["writes"] > 50 and report.counts["reads"] > 20, report


@pytest.mark.parametrize(
    "mode",
    ["direct", "transaction", pytest.param("session", marks=pytest.mark.slow)],
    indirect=True,
)
def test_router_clients_during_move(pooled_fleet, mode):
    """6 writers and 2 readers while 4 shards move pg1 → pg2 (and on two shards that stay)."""
    path = pooled_fleet(hosts=2, shards=16)  # pg1 0-7, pg2 8-15
    moved = [4, 5, 6, 7]
    topo = load(path)
    with history_traffic(path, keys_for(topo, moved + [0, 9], 4), writers=6, readers=2) as traffic:
        report = move_shards(load(path), moved, "pg2")
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    assert all(load(path).host_of(n).name == "pg2" for n in moved)
    checked = traffic.history.check()
    assert checked.ok, (
        checked,
        {k: report.get(k) for k in ("freeze_started_at", "freeze_ended_at")},
        {h.name: h.admin_dsn or h.dsn for h in topo.hosts},
    )
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked


@pytest.mark.parametrize(
    "mode", [pytest.param("direct", marks=pytest.mark.slow), "transaction"], indirect=True
)
def test_psql_and_pgbench_during_move(pooled_fleet, mode, servers, tmp_path):
    """psql (schema-qualified statements, one process each) and pgbench (-f, bursts of 1 s) write to
    the moving shards through the host's dsn; told "moved" (SCM01) they re-read the topology."""
    path = pooled_fleet(hosts=2, shards=16)
    moved = [4, 5, 6, 7]
    topo = load(path)
    history = History(path)
    bin_dir = servers.state.bin_dir
    with (
        PsqlClient(history, path, bin_dir, keys_for(topo, moved, 4)),
        PgbenchClient(history, path, bin_dir, 5, tmp_path) as bench5,
        PgbenchClient(history, path, bin_dir, 6, tmp_path) as bench6,
    ):
        time.sleep(0.5)
        report = move_shards(load(path), moved, "pg2")
        time.sleep(1.0)
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    checked = history.check()
    print(checked)
    assert checked.ok, checked
    assert checked.counts["retries"] > 0, (
        checked
    )  # the clients were told of the move, and followed it
    assert checked.counts["writes"] > 10 and bench5.acked > 20 and bench6.acked > 20, checked


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("direct", marks=pytest.mark.slow),
        "transaction",
        pytest.param("session", marks=pytest.mark.slow),
    ],
    indirect=True,
)
def test_router_clients_during_growth(pooled_fleet, mode, make_fleet):
    """6 writers and 2 readers on every shard while the fleet grows: add-host, add-shard on the new host,
    rebalance --apply (moves toward it) and redeploy of next_id() in the other dialect."""
    path = pooled_fleet(hosts=2, shards=16)
    topo = load(path)
    with history_traffic(path, keys_for(topo, list(range(16)), 2), writers=6, readers=2) as traffic:
        steps = [
            ("add-host", "pg3", "--dsn", make_fleet.new_database(2)),
            ("add-shard", "--host", "pg3", "--count", "4"),
            ("rebalance", "--apply"),
        ]
        for step in steps:
            result = run_cli(*step, config=path)
            assert result.exit_code == 0, (step, result)
        path.write_text(path.read_text().replace("function: plpgsql", "function: sql"))
        result = run_cli("redeploy", config=path)
        assert result.exit_code == 0, result
    grown = load(path)
    assert grown.shard_count == 20 and len(grown.host("pg3").shards) > 4, grown.host("pg3").shards
    report = traffic.history.check()
    assert report.ok, report
    assert report.counts["writes"] > 50 and report.counts["reads"] > 20, report


# ---- shardctl's own commands refuse a pooler on admin_dsn -------------------------------------------


def _admin_through_pooler(path, pgbouncer) -> None:
    """Point every host's admin_dsn at PgBouncer's transaction pool as well (the mistake to catch)."""
    from shardctl.model.topology_file import TopologyFile

    pgbouncer.front(path, "transaction")
    doc = TopologyFile(path)
    for node in doc.doc["hosts"]:
        node["admin_dsn"] = node["dsn"]
    doc.save()


_PORTS: dict[
    str, int
] = {}  # database name → its server's port (the fleets' databases have unique names)


@pytest.mark.parametrize(
    "command",
    [
        ["init"],
        ["migrate"],
        ["add-shard", "--host", "pg2", "--count", "4"],
        ["move-shard", "4-5", "--to", "pg2"],
    ],
)
def test_admin_dsn_behind_a_transaction_pooler_is_refused_before_anything_changes(
    make_fleet, pgbouncer, command
):
    """Session advisory locks, DDL and replication need the server session: with admin_dsn through PgBouncer's
    transaction pool, every command that changes the fleet refuses in one line, in ≤ 2 s, naming the host."""
    from psycopg.conninfo import conninfo_to_dict

    path = make_fleet(hosts=2, shards=16)
    for host in load(path).hosts:
        parts = conninfo_to_dict(host.dsn)
        _PORTS[parts["dbname"]] = int(parts["port"])
    if command != ["init"]:
        assert run_cli("init", config=path).exit_code == 0
    before = _footprint_direct(path)
    _admin_through_pooler(path, pgbouncer)
    started = time.monotonic()
    result = run_cli(*command, config=path)
    took = time.monotonic() - started
    assert result.exit_code == 2, result
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not line.startswith("warning:")
    ]
    assert len(lines) == 1 and "admin_dsn" in lines[0] and "transaction pooler" in lines[0], result
    assert "host pg1" in lines[0] or "host pg2" in lines[0], result
    assert took <= 2.0, took
    assert _footprint_direct(path) == before


def _footprint_direct(path) -> list:
    """Schemas shardctl made on each host's server (control schema, shard schemas), read directly."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    out = []
    for host in load(path).hosts:
        dbname = conninfo_to_dict(host.dsn)["dbname"]
        with psycopg.connect(
            host="127.0.0.1", port=_PORTS[dbname], dbname=dbname, user="postgres"
        ) as conn:
            out.append(
                conn.execute(
                    "SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace "
                    "WHERE nspname LIKE 'insta%' OR nspname = 'shardctl'"
                ).fetchone()[0]
            )
            out.append(
                conn.execute(
                    "SELECT to_regclass('shardctl.migrations') IS NOT NULL AND "
                    "(SELECT count(*) FROM shardctl.migrations) > 0"
                ).fetchone()[0]
                if out[-1]
                else None
            )
    return out
