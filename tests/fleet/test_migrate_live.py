"""``migrate`` under live traffic: bounded stalls, blocked shards retried, moves left pending."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from support.fleet import connect, load, run_cli
from support.load import Pgbench, RouterWriters
from support.migrations import ADD_LOCATION, add_migration, ledger, migrated, shards_with_column

from shardctl.router import Router


def _ids_in_db(topo, written: dict[int, set[int]]) -> dict[int, set[int]]:
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name) as conn:
            for shard in [s for s in written if s in host.shards]:
                rows = conn.execute(
                    f"SELECT id FROM {topo.schema_name(shard)}.photos "
                    f"WHERE caption LIKE 'writer %%'"
                ).fetchall()
                out[shard] = {r[0] for r in rows}
    return out


@pytest.mark.slow  # needs the CPU for ≥ 1,000 pgbench ops/s besides the servers: run with -m slow
def test_migrate_512_shards_under_1000_ops_per_second(make_fleet):
    """A column plus an index on 512 shards while pgbench writes ≥ 1,000 rows/s over every shard and
    Router writers write too: no app transaction fails, none waits more than 250 ms."""
    fleet = make_fleet(hosts=2, shards=512, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    with (
        Router(topo) as router,
        Pgbench(topo, rate=1400, clients=4) as bench,
        RouterWriters(router, list(range(512)), topo.modulus, writers=2) as writers,
    ):
        time.sleep(3)  # steady load first
        t0 = time.time()
        result = run_cli("migrate", "--json", config=fleet)
        t1 = time.time()
        time.sleep(2)
        bench.stop()
        writers.stop()
    assert result.exit_code == 0, result
    doc = json.loads(result.stdout)
    assert len(migrated(doc)) == 512
    assert ledger(topo, "pg1", 3) | ledger(topo, "pg2", 3) == set(range(512))
    app = bench.stats()
    during = bench.stats(since=t0, until=t1 + 0.3)
    router_stats = writers.stats()
    print(
        f"\nmigrate of 512 shards under load: {t1 - t0:.2f}s (migrate's own {doc['seconds']:.2f}s)"
        f"\n  pgbench, whole run: {app.summary()}\n  pgbench, during migrate: {during.summary()}"
        f"\n  router writers: {router_stats.summary()}"
    )
    assert app.rate >= 1000, app.summary()
    assert app.failed == 0 and not app.errors, app.errors[:5]
    # Latency while migrate runs (its start to its end, plus the commits in flight); the whole run's
    # maximum, printed above, also holds the load's own start-up on a busy machine.
    assert during.ops > 0 and during.max_ms <= 250, during.summary()
    assert not writers.errors, writers.errors[:5]
    writers_during = [
        end - start for _, _, start, end in writers.written if end >= t0 and start <= t1 + 0.3
    ]
    assert writers_during and max(writers_during) <= 0.25, max(writers_during)
    # Every acknowledged Router write is there exactly once.
    written = writers.ids_by_shard()
    assert _ids_in_db(topo, written) == written


def _held_shard_run(make_fleet):
    """One application transaction holds shard 5's table for 3 s while migrate runs under Router
    writes to every other shard. Returns (topo, migrate's JSON, exit code, seconds, writer stats)."""
    fleet = make_fleet(hosts=2, shards=128, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    others = [n for n in range(128) if n != 5]
    app = connect(topo, "pg1")
    with (
        Router(topo) as router,
        RouterWriters(router, others, topo.modulus, writers=2, pause=0.001) as writers,
    ):
        time.sleep(1)
        app.execute("SELECT count(*) FROM insta5.photos")  # the open transaction holds ACCESS SHARE
        timer = threading.Timer(3.0, app.rollback)
        timer.start()
        started = time.perf_counter()
        result = run_cli("migrate", "--json", config=fleet)
        elapsed = time.perf_counter() - started
        time.sleep(0.5)
        writers.stop()
    timer.join()
    app.close()
    assert result.exit_code == 0, result
    stats = writers.stats()
    print(
        f"\nmigrate with shard 5 held 3s: {elapsed:.2f}s, shard 5 retried; other shards: {stats.summary()}"
    )
    assert not writers.errors, writers.errors[:5]
    return topo, json.loads(result.stdout), elapsed, stats


def test_shard_held_3s_is_retried_and_applied_after(make_fleet):
    """migrate goes on with every other shard, retries shard 5 until the transaction ends, applies
    it, and exits 0; the shards batched with it were committed long before."""
    topo, doc, elapsed, _ = _held_shard_run(make_fleet)
    assert migrated(doc) == set(range(128))
    assert 5 in ledger(topo, "pg1", 3) and 5 in shards_with_column(
        topo, "pg1", "photos", "location"
    )
    pg1 = next(h for h in doc["hosts"] if h["host"] == "pg1")
    assert pg1["retried"] >= 1
    assert elapsed >= 2.5  # shard 5 was applied only after the transaction ended
    with connect(topo, "pg1") as conn:
        times = dict(
            conn.execute(
                "SELECT shard_id, applied_at FROM shardctl.migrations WHERE version = 3"
            ).fetchall()
        )
    # Shards 0-7 were the host's first batch (FIRST_BATCH): shard 5's wait did not hold them back.
    assert (times[5] - max(t for n, t in times.items() if n != 5 and n < 8)).total_seconds() > 1.5


@pytest.mark.slow  # a latency bound: needs a machine that is not starved of CPU (run with -m slow)
def test_shard_held_3s_other_shards_do_not_stall(make_fleet):
    _, doc, _, stats = _held_shard_run(make_fleet)
    assert migrated(doc) == set(range(128))
    assert stats.ops > 100 and stats.max_ms <= 250, stats.summary()


def test_retries_exhausted_names_the_blocker(make_fleet):
    fleet = make_fleet(hosts=2, shards=32, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    app = connect(topo, "pg1", application_name="photo-app")
    try:
        app.execute("SELECT count(*) FROM insta3.photos")
        started = time.perf_counter()
        result = run_cli(
            "migrate", "--lock-retries", "3", "--retry-budget", "2", "--json", config=fleet
        )
        elapsed = time.perf_counter() - started
    finally:
        app.rollback()
        app.close()
    assert result.exit_code == 1, result
    assert elapsed < 10
    fails = {f["shard"]: f for h in json.loads(result.stdout)["hosts"] for f in h["failed"]}
    assert list(fails) == [3]
    error = fails[3]["error"]
    assert (
        error.startswith("lock timeout")
        and "photo-app" in error
        and "pid " in error
        and "4 times alone" in error
    )
    assert ledger(topo, "pg1", 3) == set(range(16)) - {3}


def test_migrate_leaves_shards_of_a_move_pending(make_fleet):
    """Shards a move holds stay pending with the command that releases them; the rest are applied;
    exit 0, and 1 only for --check."""
    fleet = make_fleet(hosts=2, shards=32, init=True)
    topo = load(fleet)
    with connect(topo, "pg1") as conn:
        conn.execute(
            "UPDATE shardctl.shards SET state = 'moving_out' WHERE shard_id BETWEEN 4 AND 7"
        )
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 1 and "shards 4-7 are being moved" in check.stderr, check
    result = run_cli("migrate", config=fleet)
    assert result.exit_code == 0, result
    assert (
        "shards 4-7 are being moved" in result.stdout
        and "shardctl move-shard 4-7 --to" in result.stdout
    )
    assert ledger(topo, "pg1", 3) == set(range(16)) - {4, 5, 6, 7}
    assert ledger(topo, "pg2", 3) == set(range(16, 32))
    doc = json.loads(run_cli("migrate", "--json", config=fleet).stdout)
    assert any("4-7" in line for line in doc["held"])
    with connect(topo, "pg1") as conn:
        conn.execute("UPDATE shardctl.shards SET state = 'active' WHERE shard_id BETWEEN 4 AND 7")
    result = run_cli("migrate", "--json", config=fleet)
    assert result.exit_code == 0 and migrated(json.loads(result.stdout)) == {4, 5, 6, 7}
    assert run_cli("migrate", "--check", config=fleet).exit_code == 0


def test_library_check_tells_pending_from_failed(make_fleet):
    from shardctl import migrate
    from shardctl.errors import OperationFailed, PendingWork

    fleet = make_fleet(hosts=2, shards=16, init=True)
    topo = load(fleet)
    assert migrate(topo, check=True).raise_for_status().pending_total == 0
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    result = migrate(topo, check=True)
    assert result.pending_total == 16 and result.ok
    with pytest.raises(PendingWork):
        result.raise_for_status()
    add_migration(
        fleet, "V0004__bad.sql", "ALTER TABLE {{ schema|ident }}.nope ADD COLUMN x int;\n"
    )
    result = migrate(topo)
    with pytest.raises(OperationFailed) as info:
        result.raise_for_status()
    assert not isinstance(info.value, PendingWork) and "failed" in str(info.value)
    assert isinstance(result.hosts[0].value.failed, list) and result.failed
    with psycopg.connect(**topo.host("pg1").connect_kwargs()) as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE version = 4").fetchone()[0]
            == 0
        )
