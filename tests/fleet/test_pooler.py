"""PgBouncer from the sandbox (shardctl/dev/pooler.py): ``sandbox up --pooler``, and the test fixture's
PgBouncer in front of the session servers."""

from __future__ import annotations

import json

import psycopg
import pytest
from support.fleet import load, run_cli
from support.pooler import require_pgbouncer

from shardctl.dev.pooler import Pooler
from shardctl.router import Router


def server_port(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT current_setting('port')").fetchone()[0])


def test_sandbox_up_pooler_routes_dsn_through_pgbouncer_and_admin_direct(server_dir):
    require_pgbouncer()
    box = server_dir / "box"
    try:
        up = run_cli(
            "sandbox",
            "up",
            "--dir",
            box,
            "--hosts",
            "2",
            "--shards",
            "8",
            "--pooler",
            "transaction",
            "--pool-size",
            "3",
            "--json",
        )
        assert up.exit_code == 0, up
        doc = json.loads(up.stdout)
        pooler = Pooler(box / "pgbouncer")
        assert (
            doc["pooler"]["mode"] == "transaction"
            and doc["pooler"]["running"]
            and pooler.health() is None
        )
        ports = {h["name"]: h["port"] for h in doc["hosts"]}
        topo = load(box / "shardctl.yaml")
        for host in topo.hosts:
            assert (
                f":{doc['pooler']['port']}/{host.name}" in host.dsn
                and host.admin_dsn
                == doc["hosts"][[h["name"] for h in doc["hosts"]].index(host.name)]["dsn"]
            )
            with psycopg.connect(**host.connect_kwargs(purpose="app")) as conn:
                assert server_port(conn) == ports[host.name]  # PgBouncer → that host's server
        assert {p["database"]: p["pool_mode"] for p in pooler.pools()}.items() >= {
            "pg1": "transaction",
            "pg2": "transaction",
        }.items()
        assert run_cli("init", config=box / "shardctl.yaml").exit_code == 0
        with Router(load(box / "shardctl.yaml")) as router:
            assert router.execute(3, "SELECT current_setting('port')")[0][0] == str(
                ports[topo.host_of(3).name]
            )

        down = run_cli("sandbox", "down", "--dir", box, "--json")
        assert down.exit_code == 0, down
        assert json.loads(down.stdout)["stopped"] == ["pgbouncer", "pg1", "pg2"]
        assert not pooler.running() and pooler.health() == "not running"

        again = run_cli(
            "sandbox", "up", "--dir", box, "--json"
        )  # without --pooler: the sandbox's PgBouncer too
        assert again.exit_code == 0, again
        assert pooler.health() is None
        with psycopg.connect(
            **load(box / "shardctl.yaml").host("pg2").connect_kwargs(purpose="app")
        ) as conn:
            assert server_port(conn) == ports["pg2"]
    finally:
        run_cli("sandbox", "down", "--destroy", "--dir", box)
    assert not pooler.running()


def test_pgbouncer_drops_startup_options(make_fleet, pgbouncer):
    """``options`` (``-c statement_timeout=…``, which the Router sends at connect) is accepted only
    because the config ignores it, and then never reaches the server: through PgBouncer a session
    setting must be set with SET/set_config in the transaction that needs it."""
    path = pgbouncer.front(make_fleet(hosts=1, shards=2), "transaction")
    host = load(path).hosts[0]
    with psycopg.connect(
        **host.connect_kwargs(purpose="admin"), options="-c statement_timeout=4321"
    ) as direct:
        assert direct.execute("SHOW statement_timeout").fetchone()[0] == "4321ms"
    with psycopg.connect(
        **host.connect_kwargs(purpose="app"), options="-c statement_timeout=4321"
    ) as pooled:
        assert pooled.execute("SHOW statement_timeout").fetchone()[0] == "0"


def test_transaction_mode_switches_server_connections(make_fleet, pgbouncer):
    """default_pool_size = 3 in transaction mode: 6 clients share 3 server connections, and session state
    one client sets is seen by others (why the Router must not rely on it)."""
    path = pgbouncer.front(make_fleet(hosts=1, shards=2), "transaction")
    host = load(path).hosts[0]
    clients = [
        psycopg.connect(**host.connect_kwargs(purpose="app"), autocommit=True) for _ in range(6)
    ]
    try:
        pids = [
            {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in clients} for _ in range(5)
        ]
        assert len(set().union(*pids)) <= 3
        clients[0].execute("SELECT set_config('search_path', 'leaked', false)")
        leaked = [c.execute("SHOW search_path").fetchone()[0] for c in clients[1:]]
        assert "leaked" in leaked  # another client got the session state: the hazard #23 is about
    finally:
        for c in clients:
            c.close()


def test_pooler_reload_adds_a_database(make_fleet, pgbouncer):
    path = make_fleet(hosts=1, shards=2)
    pooler = pgbouncer.pooler("session")
    assert pooler.health() is None
    pgbouncer.front(path, "session")
    alias = load(path).hosts[0].dsn.rsplit("/", 1)[1]
    assert alias in pooler.info()["databases"]
    with psycopg.connect(pooler.dsn(alias)) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == alias
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pooler.dsn("no_such_alias"), connect_timeout=5).close()
