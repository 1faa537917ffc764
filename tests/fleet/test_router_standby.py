"""Standby reads on a real streaming replica started by ``shardctl sandbox up --standby``."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from support.fleet import load, run_cli, sandbox_dir
from support.standby import KEY, wait_replayed

from shardctl import Router
from shardctl.dev.sandbox import Sandbox


def on(router: Router, **kw) -> tuple[bool, int]:
    """(served by a server in recovery, rows in users) for a read through the router."""
    return router.read(KEY, "SELECT pg_is_in_recovery(), count(*) FROM users", **kw)[0]


def test_reads_go_to_the_standby_and_fall_back_when_it_lags(replicated):
    topo = load(replicated.topology_path)
    standby = topo.hosts[0].standby
    assert standby and standby != topo.hosts[0].dsn
    status = run_cli("sandbox", "status", "--dir", str(replicated.dir), "--json")
    assert status.exit_code == 0 and json.loads(status.stdout)["standbys"][0]["running"]
    with Router(topo, max_lag=0.5, lag_check_interval=0.05) as router:
        router.execute(KEY, "INSERT INTO users (username) VALUES ('first')")
        wait_replayed(topo)
        assert on(router) == (True, 1)  # the replica serves reads
        with router.connection(KEY, readonly=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery(), current_schema()").fetchone() == (
                True,
                f"insta{KEY}",
            )
        assert router.execute(KEY, "SELECT pg_is_in_recovery()") == [
            (False,)
        ]  # writes and execute: primary

        with psycopg.connect(standby, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
        try:
            router.execute(KEY, "INSERT INTO users (username) VALUES ('second')")
            time.sleep(1.0)  # now the replica is > max_lag behind
            assert on(router) == (False, 2)  # ... so the read went to the primary
            with router.connection(KEY, readonly=True) as conn:
                assert conn.execute(
                    "SELECT pg_is_in_recovery(), count(*) FROM users"
                ).fetchone() == (False, 2)
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    conn.execute("INSERT INTO users (username) VALUES ('not here')")
            assert on(router, max_lag=3600) == (True, 1)  # a looser bound accepts the stale replica
            stats = router.stats()["pg1"]["standby"]
            assert stats["fallbacks"]["lagging"] >= 2 and stats["lag_s"] > 0.5
        finally:
            with psycopg.connect(standby, autocommit=True) as conn:
                conn.execute("SELECT pg_wal_replay_resume()")
        wait_replayed(topo)
        time.sleep(0.1)
        assert on(router) == (True, 2)  # caught up: back on the replica


def test_a_stopped_standby_sends_reads_to_the_primary(replicated):
    topo = load(replicated.topology_path)
    wait_replayed(topo)
    with Router(topo, max_lag=5) as router:
        assert on(router)[0] is True
        replicated.stop_host("pg1-standby")
        for _ in range(5):
            started = time.monotonic()
            assert on(router) == (False, 0)
            assert time.monotonic() - started < 1.0
        stats = router.stats()["pg1"]
        assert (
            stats["standby"]["fallbacks"]["unreachable"] == 5
            and stats["breaker"]["state"] == "closed"
        )
        assert stats["standby"]["breaker"]["state"] in ("open", "half-open")


def test_standby_added_to_an_existing_sandbox_is_named_in_its_topology():
    directory = sandbox_dir("standby-late")
    box = Sandbox(directory)
    try:
        assert (
            run_cli("sandbox", "up", "--dir", directory, "--hosts", "1", "--shards", "4").exit_code
            == 0
        )
        assert "standby" not in box.topology_path.read_text()
        r = run_cli("sandbox", "up", "--dir", directory, "--hosts", "1", "--standby", "--json")
        assert r.exit_code == 0, r
        topo = load(box.topology_path)
        replica = box.state.standby_of("pg1")
        assert (
            topo.hosts[0].standby == replica.dsn and json.loads(r.stdout)["wrote_topology"] is False
        )
        with psycopg.connect(topo.hosts[0].dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[0] == 1
        assert run_cli("sandbox", "down", "--dir", directory).exit_code == 0
        assert not box.running(replica)
        assert run_cli("sandbox", "up", "--dir", directory).exit_code == 0  # both come back
        assert box.running(replica)
    finally:
        box.destroy()
