"""Crash consistency: a server killed with SIGKILL, or shardctl itself killed, in the middle of
init, migrate and add-shard, each running 2 streams per host (--jobs 2). Afterwards every shard is
complete at some version or absent, and one re-run completes."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest
from support.fleet import load, run_cli
from support.process import start_shardctl as start_cli

from shardctl.dev.sandbox import Sandbox

SHARDS = 256  # per fleet; 128 per host: a run killed after 16 shards is still far from done
HALF = SHARDS // 2

ADD_COLUMN = """ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;
CREATE INDEX photos_location_idx ON {{ schema|ident }}.photos (location);
"""


def kill_server(box: Sandbox, name: str) -> None:
    """SIGKILL the postmaster and every backend: a crash, not a shutdown."""
    host = next(h for h in box.state.hosts if h.name == name)
    pid = box.pid(host)
    assert pid
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while box.pid(host) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_for(dsn: str, sql: str, minimum: int, timeout: float = 60) -> int:
    """Poll until ``sql`` returns at least ``minimum`` (the run is in progress)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, connect_timeout=2) as conn:
                value = conn.execute(sql).fetchone()[0]
                if value >= minimum:
                    return value
        except psycopg.Error:
            pass
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {sql!r} >= {minimum}")


def wait_until_alone(path, timeout: float = 30) -> None:
    """Until no other session is left in any host's database of the fleet at ``path``: the backends
    of a killed shardctl have noticed their client is gone and exited, and a backend rolls back its
    transaction (and releases its locks) before it leaves pg_stat_activity."""
    deadline = time.monotonic() + timeout
    for host in load(path).hosts:
        with psycopg.connect(host.dsn, autocommit=True) as conn:
            while conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()[0]:
                assert time.monotonic() < deadline, f"{host.name}: a killed client's session stays"
                time.sleep(0.02)


def assert_consistent(dsn: str, latest: int) -> dict[int, int]:
    """Every recorded shard is whole at its version; every shard schema is recorded; nothing half-built.

    Returns shard → version."""
    with psycopg.connect(dsn) as conn:
        recorded = dict(
            conn.execute(
                """SELECT s.shard_id, coalesce(max(m.version), 0) FROM shardctl.shards s
               LEFT JOIN shardctl.migrations m USING (shard_id) GROUP BY 1"""
            ).fetchall()
        )
        gaps = conn.execute("""SELECT shard_id FROM shardctl.migrations GROUP BY 1
                               HAVING count(*) <> max(version)""").fetchall()
        assert not gaps, f"ledger gaps on shards {gaps}"
        orphans = conn.execute("""SELECT shard_id FROM shardctl.migrations
                                  WHERE shard_id NOT IN (SELECT shard_id FROM shardctl.shards)""").fetchall()
        assert not orphans, f"ledger rows without a shard: {orphans}"
        schemas = {
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname ~ '^insta[0-9]+$'"
            )
        }
        assert schemas == {f"insta{n}" for n in recorded}, (
            "a schema exists without its shard record, or vice versa"
        )
        objects = conn.execute(
            """SELECT n.nspname,
                      EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid AND p.proname = 'next_id'),
                      EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'next_id_seq'),
                      EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'photos'),
                      EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'likes'),
                      EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                               WHERE c.relnamespace = n.oid AND c.relname = 'photos' AND a.attname = 'location'),
                      EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid
                               AND c.relname = 'photos_location_idx')
                 FROM pg_namespace n WHERE n.nspname ~ '^insta[0-9]+$'"""
        ).fetchall()
    for schema, fn, seq, photos, likes, column, index in objects:
        version = recorded[int(schema[5:])]
        assert fn and seq, f"{schema}: schema without its next_id() or sequence"
        assert photos == (version >= 1), (
            f"{schema}: V1 objects do not match ledger version {version}"
        )
        assert likes == (version >= 2), (
            f"{schema}: V2 objects do not match ledger version {version}"
        )
        if latest >= 3:
            assert column == index == (version >= 3), (
                f"{schema}: V3 half applied (ledger {version})"
            )
    return recorded


@pytest.fixture
def box(private_sandbox):
    return private_sandbox(hosts=2, shards=SHARDS)


def test_server_killed_during_init(box):
    path = box.topology_path
    dsn = load(path).host("pg1").dsn
    proc = start_cli("init", "--batch-size", "4", "--jobs", "2", config=path)
    wait_for(
        dsn,
        "SELECT CASE WHEN to_regclass('shardctl.shards') IS NULL THEN 0 ELSE "
        "(SELECT count(*) FROM shardctl.shards) END",
        16,
    )
    kill_server(box, "pg1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    assert "pg1" in err and "Traceback" not in err

    box.start_host("pg1")
    recorded = assert_consistent(dsn, 2)
    assert 0 < len(recorded) < HALF
    again = run_cli("init", config=path)
    assert again.exit_code == 0, again
    assert len(assert_consistent(dsn, 2)) == HALF
    assert run_cli("verify", config=path).exit_code == 0


def test_shardctl_killed_during_init(make_fleet):
    """shardctl dies, the servers do not: the session's servers serve (no private sandbox)."""
    path = make_fleet(hosts=2, shards=SHARDS)
    dsn = load(path).host("pg2").dsn
    proc = start_cli("init", "--batch-size", "4", "--jobs", "2", config=path)
    wait_for(
        dsn,
        "SELECT CASE WHEN to_regclass('shardctl.shards') IS NULL THEN 0 ELSE "
        "(SELECT count(*) FROM shardctl.shards) END",
        16,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_until_alone(path)  # the server noticed the dead client and rolled back its transaction
    for host in load(path).hosts:
        assert_consistent(host.dsn, 2)
    assert run_cli("init", config=path).exit_code == 0
    for host in load(path).hosts:
        assert len(assert_consistent(host.dsn, 2)) == HALF


def test_server_killed_during_migrate(box):
    path = box.topology_path
    assert run_cli("init", config=path).exit_code == 0
    (path.parent / "migrations" / "V0003__add_photo_location.sql").write_text(ADD_COLUMN)
    dsn = load(path).host("pg2").dsn
    proc = start_cli("migrate", "--batch-size", "4", "--jobs", "2", config=path)
    wait_for(dsn, "SELECT count(*) FROM shardctl.migrations WHERE version = 3", 16)
    kill_server(box, "pg2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    box.start_host("pg2")
    versions = assert_consistent(dsn, 3)
    assert set(versions.values()) == {2, 3}, (
        "expected a fleet caught half way: some shards at V3, some at V2"
    )
    assert run_cli("migrate", config=path).exit_code == 0
    assert set(assert_consistent(dsn, 3).values()) == {3}
    assert run_cli("migrate", "--check", config=path).exit_code == 0


@pytest.mark.slow
def test_server_killed_during_add_shard(box, tmp_path):
    path = box.topology_path
    text = path.read_text()
    # add-shard then opens HALF more shards on pg2.
    assert run_cli("init", config=path).exit_code == 0
    dsn = load(path).host("pg2").dsn
    proc = start_cli(
        "add-shard",
        "--count",
        str(HALF),
        "--host",
        "pg2",
        "--batch-size",
        "4",
        "--jobs",
        "2",
        config=path,
    )
    wait_for(dsn, f"SELECT count(*) FROM shardctl.shards WHERE shard_id >= {SHARDS}", 16)
    kill_server(box, "pg2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    assert path.read_text() == text, "the topology must not change when add-shard did not finish"
    box.start_host("pg2")
    assert_consistent(dsn, 2)
    again = run_cli("add-shard", "--count", str(HALF), "--host", "pg2", config=path)
    assert again.exit_code == 0, again
    assert len(assert_consistent(dsn, 2)) == 2 * HALF
    assert load(path).shard_count == SHARDS + HALF
    assert run_cli("verify", config=path).exit_code == 0


def test_shardctl_killed_during_migrate(make_fleet):
    path = make_fleet(
        hosts=2, shards=SHARDS, init=True
    )  # a clone of the session's initialised fleet
    (path.parent / "migrations" / "V0003__add_photo_location.sql").write_text(ADD_COLUMN)
    dsn = load(path).host("pg1").dsn
    proc = start_cli("migrate", "--batch-size", "4", "--jobs", "2", config=path)
    wait_for(dsn, "SELECT count(*) FROM shardctl.migrations WHERE version = 3", 16)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_until_alone(path)
    for host in load(path).hosts:
        assert_consistent(host.dsn, 3)
    assert run_cli("migrate", config=path).exit_code == 0
    for host in load(path).hosts:
        assert set(assert_consistent(host.dsn, 3).values()) == {3}
