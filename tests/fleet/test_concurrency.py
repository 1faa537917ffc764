"""Two runs at once on one fleet: nothing applied twice, no deadlock, a clear message for the loser."""

from __future__ import annotations

import time

import psycopg
from support.fleet import load, run_cli
from support.process import start_shardctl as start

ADD_COLUMN = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"


def ledger(topo):
    out = {}
    for host in topo.hosts:
        with psycopg.connect(host.dsn) as conn:
            out[host.name] = conn.execute(
                "SELECT count(*), count(DISTINCT (shard_id, version)) FROM shardctl.migrations"
            ).fetchone()
    return out


def wait_for_locks(topo, timeout=60):
    """Until some shardctl run holds the lock on every host."""
    deadline = time.monotonic() + timeout
    pending = {h.name for h in topo.hosts}
    while pending and time.monotonic() < deadline:
        for host in topo.hosts:
            with psycopg.connect(host.dsn) as conn:
                if conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                ).fetchone()[0]:
                    pending.discard(host.name)
        time.sleep(0.02)
    assert not pending, f"no lock taken on {pending}"


def test_two_inits_at_once(make_fleet):
    path = make_fleet(hosts=2, shards=256)
    first = start("init", "--batch-size", "8", config=path)
    second = start("init", "--batch-size", "8", config=path)
    _out1, err1 = first.communicate(timeout=300)
    _out2, err2 = second.communicate(timeout=300)
    codes = sorted([first.returncode, second.returncode])
    assert codes[0] == 0, (err1, err2)
    if codes[1] != 0:  # the loser: a clear one-line message, exit 1
        loser_err = err1 if first.returncode else err2
        assert codes[1] == 1 and "another shardctl run holds the lock" in loser_err, loser_err
    counts = ledger(load(path))
    assert counts == {"pg1": (256, 256), "pg2": (256, 256)}
    assert run_cli("verify", config=path).exit_code == 0


def test_second_init_waits_with_wait(make_fleet):
    path = make_fleet(hosts=2, shards=256)
    first = start("init", "--batch-size", "4", config=path)
    wait_for_locks(load(path))
    second = run_cli("init", "--wait", "120", "--json", config=path)
    first.communicate(timeout=300)
    assert first.returncode == 0 and second.exit_code == 0, second
    assert ledger(load(path)) == {"pg1": (256, 256), "pg2": (256, 256)}


def test_migrate_during_add_shard(make_fleet):
    path = make_fleet(hosts=2, shards=64, init=True)
    (path.parent / "migrations" / "V0003__add_location.sql").write_text(ADD_COLUMN)
    grower = start("add-shard", "--count", "256", "--host", "pg2", "--batch-size", "4", config=path)
    topo = load(path)
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
    ):  # wait until add-shard holds pg2's lock and is creating shards
        with psycopg.connect(topo.host("pg2").dsn) as conn:
            if conn.execute("SELECT count(*) FROM shardctl.shards WHERE shard_id >= 64").fetchone()[
                0
            ]:
                break
        time.sleep(0.05)
    during = run_cli("migrate", config=path)
    _out, err = grower.communicate(timeout=300)
    assert grower.returncode == 0, err
    # pg2 was busy: migrate said so and left it alone; pg1 was migrated.
    assert during.exit_code == 1, during
    assert "pg2" in during.stderr and "another shardctl run holds the lock" in during.stderr
    after = run_cli("migrate", config=path)
    assert after.exit_code == 0, after
    assert run_cli("migrate", "--check", config=path).exit_code == 0
    topo = load(path)
    for host in topo.hosts:
        with psycopg.connect(host.dsn) as conn:
            versions = conn.execute(
                "SELECT max(version), count(*), count(DISTINCT (shard_id, version)) "
                "FROM shardctl.migrations"
            ).fetchone()
        assert versions[0] == 3 and versions[1] == versions[2]
    assert topo.shard_count == 320
    assert run_cli("verify", config=path).exit_code == 0


# ---- one run after another (issue 24, item 4) ------------------------------------------------------

OTHERS_ADVISORY_LOCKS = (
    "SELECT coalesce(string_agg(format('%s/%s by pid %s', l.classid, l.objid, l.pid), ', '), '') "
    "FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid <> pg_backend_pid()"
)


def test_a_finished_run_holds_no_lock(make_fleet):
    """When a command returns, its locks are released on every host: the next command's very first
    statement finds them free (it used to meet the previous run's backend still exiting, holding the
    lock, and fail with "another shardctl run holds the lock")."""
    path = make_fleet(hosts=2, shards=16)
    topo = load(path)
    # Opened before each command ends, so the check runs at once after it returns, as a next command's
    # first statement could (faster than that command connecting).
    watchers = {h.name: psycopg.connect(h.dsn, autocommit=True) for h in topo.hosts}
    try:
        steps = [
            ("init",),
            ("migrate",),
            ("add-shard", "--count", "2", "--host", "pg2"),
            ("migrate",),
            ("move-shard", "3", "--to", "pg2"),
            ("move-shard", "--cleanup"),
        ]
        steps += [("init",), ("migrate",)] * 6  # the race was narrow: look often
        for step in steps:
            result = run_cli(*step, config=path)
            assert result.exit_code == 0, (step, result)
            held = {
                name: conn.execute(OTHERS_ADVISORY_LOCKS).fetchone()[0]
                for name, conn in watchers.items()
            }
            assert not any(held.values()), f"{step}: locks held after the run returned: {held}"
    finally:
        for conn in watchers.values():
            conn.close()


def test_init_then_migrate_never_meets_the_previous_lock(make_fleet):
    """``shardctl init && shardctl migrate`` (the CI flake), a few times over: never LockBusy."""
    path = make_fleet(hosts=2, shards=8)
    for n in range(3, 7):
        assert run_cli("init", config=path).exit_code == 0
        (path.parent / "migrations" / f"V000{n}__c{n}.sql").write_text(
            f"ALTER TABLE {{{{ schema|ident }}}}.photos ADD COLUMN c{n} int;\n"
        )
        result = run_cli("migrate", config=path)
        assert result.exit_code == 0, result


def test_lock_connections_release_their_locks_before_closing(make_fleet):
    """host_lock and FleetLocks release every advisory lock of their session (also one the work left in a
    transaction) in a round trip before they close it, so nothing outlives the block."""
    from shardctl.engine.connections import FleetLocks, host_lock

    topo = load(make_fleet(hosts=2, shards=4))
    watcher = psycopg.connect(topo.host("pg1").dsn, autocommit=True)
    try:
        for _ in range(5):
            with host_lock(topo.host("pg1"), purpose="test") as conn:
                conn.execute("SELECT pg_advisory_lock(4242)")
                conn.autocommit = False
                conn.execute("SELECT 1")  # the work left a transaction open
                assert "by pid" in watcher.execute(OTHERS_ADVISORY_LOCKS).fetchone()[0]
            assert watcher.execute(OTHERS_ADVISORY_LOCKS).fetchone()[0] == ""
            with FleetLocks(topo.hosts, purpose="test"):
                assert watcher.execute(OTHERS_ADVISORY_LOCKS).fetchone()[0].count("21315/1") == 1
            assert watcher.execute(OTHERS_ADVISORY_LOCKS).fetchone()[0] == ""
    finally:
        watcher.close()
