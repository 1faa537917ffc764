"""Growing the fleet: add-host, add-shard, the routing invariant, and refusals that change nothing."""

import json

import psycopg
import pytest
from support.fleet import connect, load, run_cli

from shardctl.router import Router

COMMENTED = "# fleet for the grow tests\n"


def _with_rows(topo_path, users=(1, 2, 3, 500, 1341, 2047, 31341, 99999)):
    topo = load(topo_path)
    with Router(topo) as router:
        for uid in users:
            with router.connection(uid) as conn:
                conn.execute("INSERT INTO users (username) VALUES (%s)", (f"u{uid}",))
    return topo


def _schemas(dsn):
    with psycopg.connect(dsn) as conn:
        return {
            r[0]
            for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'insta%'")
        }


def _grown(make_fleet, shards):
    path = make_fleet(hosts=2, shards=shards, init=True)
    path.write_text(
        COMMENTED + path.read_text().replace("hosts:", "# the hosts\nhosts:  # keep me")
    )
    return path, make_fleet.new_database(2)


@pytest.fixture(params=[256, pytest.param(2048, marks=pytest.mark.slow)])
def grown(make_fleet, request):
    """N shards on 2 hosts, initialised, plus an empty database for pg3, and N: 2048 (the acceptance
    size, a scale test: the slow suite) and 256 (the same checks at an eighth of the size)."""
    return (*_grown(make_fleet, request.param), request.param)


@pytest.fixture
def small(make_fleet):
    return _grown(make_fleet, 64)


def test_add_host_then_add_shard_keeps_keys_and_comments(grown):
    path, pg3, n = grown
    keys = [1, 2, 3, 500, 1341, 2047, 31341, 99999, "alice", "bob@example.com"]
    before_topo = _with_rows(path)
    before = {k: Router(before_topo).shard_for(k) for k in keys}

    r = run_cli("add-host", "pg3", "--dsn", pg3, "--json", config=path)
    assert r.exit_code == 0, r
    with psycopg.connect(pg3) as conn:
        assert conn.execute("SELECT to_regclass('shardctl.shards') IS NOT NULL").fetchone()[0]

    r = run_cli("add-shard", "--count", str(n), "--host", "pg3", "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert doc["new_shards"] == f"{n}-{2 * n - 1}" and doc["version"] == 2

    text = path.read_text()
    assert text.startswith(COMMENTED) and "# the hosts" in text and "# keep me" in text
    topo = load(path)
    assert topo.shard_count == 2 * n and topo.modulus == n
    assert {k: Router(topo).shard_for(k) for k in keys} == before
    for k in keys:
        assert (
            run_cli("locate", str(k), "--json", config=path).stdout.count(f'"shard": {before[k]}')
            == 1
        )

    with connect(topo, "pg3") as conn:
        versions = conn.execute(
            "SELECT min(v), max(v), count(*) FROM (SELECT shard_id, max(version) v "
            "FROM shardctl.migrations GROUP BY 1) x"
        ).fetchone()
    assert versions == (2, 2, n)
    assert run_cli("verify", config=path).exit_code == 0


def test_add_shard_place_new_sends_new_objects_to_new_shards(small):
    path, pg3 = small
    assert run_cli("add-host", "pg3", "--dsn", pg3, config=path).exit_code == 0
    assert (
        run_cli("add-shard", "--count", "64", "--host", "pg3", "--place-new", config=path).exit_code
        == 0
    )
    topo = load(path)
    assert topo.new_objects == list(range(64, 128))
    with Router(topo) as router:
        for key in (1, 7, "carol"):
            shard = router.allocate_shard(key)
            assert 64 <= shard < 128
            with router.shard_connection(shard) as conn:
                new_id = conn.execute(
                    "INSERT INTO users (username) VALUES ('n') RETURNING id"
                ).fetchone()[0]
            assert router.shard_of_id(new_id) == shard
            assert router.shard_for(key) < 64  # existing keys still map where they did


@pytest.mark.parametrize(
    "args, message",
    [
        (["--count", "8200", "--host", "pg1"], "beyond the instagram layout"),
        (["--ids", "5-6", "--host", "pg1"], "already exist"),
        (["--count", "4", "--host", "nosuch"], "unknown host"),
        (["--count", "4", "--host", "pg1", "--modulus", "68"], "hold data"),
        (["--ids", "66-67", "--host", "pg1"], "owned by no host"),
        (["--host", "pg1"], "either --count"),
    ],
)
def test_add_shard_refusals_change_nothing(small, args, message):
    path, _ = small
    _with_rows(path)
    before_text = path.read_text()
    topo = load(path)
    before = {h.name: _schemas(h.dsn) for h in topo.hosts}
    r = run_cli("add-shard", *args, config=path)
    assert r.exit_code == 2, r
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert path.read_text() == before_text
    assert {h.name: _schemas(h.dsn) for h in topo.hosts} == before


def test_modulus_change_allowed_while_empty(make_fleet):
    path = make_fleet(hosts=2, shards=8, init=True)
    r = run_cli("add-shard", "--count", "8", "--host", "pg2", "--modulus", "16", config=path)
    assert r.exit_code == 0, r
    assert load(path).modulus == 16


def test_add_host_refusals(small):
    path, pg3 = small
    before = path.read_text()
    r = run_cli("add-host", "pg1", "--dsn", pg3, config=path)
    assert r.exit_code == 2 and "already in the topology" in r.stderr
    r = run_cli("add-host", "pg9", "--dsn", "postgresql://u:secret@127.0.0.1:1/x", config=path)
    assert r.exit_code == 2 and "literal password" in r.stderr and "secret" not in r.stderr
    r = run_cli(
        "add-host",
        "pg9",
        "--dsn",
        "postgresql://postgres@127.0.0.1:1/x",
        "--connect-timeout",
        "2",
        config=path,
    )
    assert r.exit_code == 3 and "pg9" in r.stderr
    assert path.read_text() == before


def test_status_reports_a_down_host_and_exits_3(private_sandbox):
    box = private_sandbox(hosts=2, shards=16)
    path = box.topology_path
    assert run_cli("init", config=path).exit_code == 0
    box.stop_host("pg2")
    r = run_cli("status", "--json", "--connect-timeout", "2", config=path)
    assert r.exit_code == 3, r
    doc = json.loads(r.stdout)
    by_name = {h["host"]: h for h in doc["hosts"]}
    assert by_name["pg1"]["reachable"] and by_name["pg1"]["present"] == 8
    assert not by_name["pg2"]["reachable"] and by_name["pg2"]["error"]
    assert "pg2" in r.stderr


def test_status_shows_drift(ready_fleet):
    fleet = ready_fleet
    topo = load(fleet)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("DELETE FROM shardctl.shards WHERE shard_id = 3")
    doc = json.loads(run_cli("status", "--json", config=fleet).stdout)
    pg1 = doc["hosts"][0]
    assert pg1["missing"] == "3" and pg1["drift"] and not doc["ok"]


def test_status_sees_a_dropped_schema_and_a_stray_one(ready_fleet):
    fleet = ready_fleet
    topo = load(fleet)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("DROP SCHEMA insta5 CASCADE")
        conn.execute("CREATE SCHEMA insta40")  # shard 40 belongs to pg2
    result = run_cli("status", "--json", config=fleet)
    pg1 = json.loads(result.stdout)["hosts"][0]
    assert pg1["present"] == 31 and pg1["missing"] == "5" and pg1["unexpected"] == "40"
