"""move-shard on real servers: phases, resume, abort, cleanup, safety checks, and no lost write under load."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest
from support.fleet import connect, load, run_cli
from support.moves import (
    Traffic,
    check_moved,
    ids_on,
    init_fleet,
    load_rows,
    move_under_traffic,
    replication_leftovers,
    router_traffic,
    snapshot,
)
from support.process import start_shardctl

from shardctl.errors import LockBusy, OperationFailed
from shardctl.ops.move import (
    MOVE_LOCK_CLASS,
    MoveOptions,
    abort_move,
    cleanup_move,
    move_shards,
    move_status,
)
from shardctl.router import Router

# ---- helpers ---------------------------------------------------------------------------------


# ---- the move under load ---------------------------------------------------------------------


def test_move_under_load_loses_no_write(make_fleet):
    """64 shards, ~20k rows; 16 shards move pg1 → pg3 while writers and a reader use them via the router."""
    path = init_fleet(make_fleet, shards=64)  # pg1 0-20, pg2 21-41, pg3 42-63
    topo = load(path)
    load_rows(topo, list(range(64)), 300)
    moved = list(range(5, 21))
    before_ids = ids_on(topo, "pg1", moved)
    router = Router(load(path), move_wait=15)
    try:
        with Traffic(router, moved, topo.modulus) as traffic:
            time.sleep(0.5)
            result = run_cli("move-shard", "5-20", "--to", "pg3", "--json", config=path)
            time.sleep(1.0)
        assert result.exit_code == 0, result
        report = json.loads(result.stdout)
        print(
            f"\nmove of 16 shards under load: freeze {report['freeze_seconds']:.3f}s, sync "
            f"{report['sync_seconds']:.1f}s, total {report['seconds']:.1f}s, {len(traffic.written)} writes, "
            f"{traffic.reads} reads"
        )
        assert report["phase"] == "cut_over" and report["phases_run"] == [
            "prepare",
            "sync",
            "cutover",
        ]
        assert report["freeze_seconds"] < 5
        assert len(traffic.written) > 50
        check_moved(topo, path, moved, "pg1", "pg3", before_ids, traffic, report)
        assert replication_leftovers(topo) == {}
        assert run_cli("verify", config=path).exit_code == 0
        # The router kept writing to the moved shards on pg3 and pg1's other shards still work.
        assert router.topology.host_of(5).name == "pg3"
        assert router.execute(3, "SELECT count(*) FROM photos")[0][0] == 300
    finally:
        router.close()
    cleaned = run_cli("move-shard", "5-20", "--cleanup", config=path)
    assert cleaned.exit_code == 0, cleaned
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE '%%_moved_%%'"
            ).fetchone()[0]
            == 0
        )
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.shards WHERE shard_id BETWEEN 5 AND 20"
            ).fetchone()[0]
            == 0
        )
    assert run_cli("migrate", config=path).exit_code == 0
    assert run_cli("verify", config=path).exit_code == 0


def after_enable(monkeypatch, action) -> list[int]:
    """Run ``action`` right after a subscription's ALTER SUBSCRIPTION … ENABLE (sql/replication.start_subscription).
    Returns a list that counts the times it ran: a test checks it did run (a renamed statement would skip it)."""
    from shardctl.sql.catalog import replication

    real = replication.start_subscription
    ran: list[int] = []

    class Watched:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, query, *args):
            cur = self.conn.execute(query, *args)
            if (query if isinstance(query, str) else query.as_string(self.conn)).endswith(
                " ENABLE"
            ):
                ran.append(1)
                action()
            return cur

    monkeypatch.setattr(
        replication, "start_subscription", lambda conn, *a, **k: real(Watched(conn), *a, **k)
    )
    return ran


def test_writes_while_the_subscription_starts_are_not_skipped(fleet3, monkeypatch):
    """The apply worker starts streaming at ENABLE, before REFRESH has registered the subscription's tables:
    changes of tables it does not know yet are skipped, yet confirmed (lag 0 says they were applied). A
    second between the two statements, with writers going on, must lose no row (it lost ~120 before)."""
    ran = after_enable(monkeypatch, lambda: time.sleep(1.0))  # a loaded server, a slow network
    move_under_traffic(fleet3, [4, 5, 6, 7], "pg1", "pg2")
    assert ran, "the pause after ENABLE never ran: the test would prove nothing"


def test_stopped_between_enable_and_refresh_copies_again(fleet3, monkeypatch):
    """A run that dies right after ENABLE leaves an apply worker that skips (and confirms) the changes of
    tables it does not know: the re-run must not trust that stream, but stop it and copy again."""
    from shardctl.sql.catalog import replication

    real = replication.start_subscription

    def die() -> None:
        raise RuntimeError("killed after ENABLE")

    ran = after_enable(monkeypatch, die)
    topo = load(fleet3)
    moved = [4, 5, 6, 7]
    before_ids = ids_on(topo, "pg1", moved)
    with router_traffic(fleet3, moved) as traffic:
        with pytest.raises(RuntimeError, match="killed after ENABLE"):
            move_shards(load(fleet3), moved, "pg2")
        assert ran
        time.sleep(1.0)  # writes go on while the worker runs without its tables
        monkeypatch.setattr(replication, "start_subscription", real)
        report = move_shards(load(fleet3), moved, "pg2")
        time.sleep(0.5)
    assert report["verified"]
    assert any("copied again" in n for n in report["messages"]), report["messages"]
    check_moved(topo, fleet3, moved, "pg1", "pg2", before_ids, traffic, report)


@pytest.mark.slow
def test_acceptance_1024_shards_200k_rows_128_moved(make_fleet):
    """The issue's acceptance: 3 hosts, 1024 shards, 200k rows; 128 shards pg1 → pg3 under load."""
    path = init_fleet(make_fleet, shards=1024)  # pg1 0-340
    topo = load(path)
    load_rows(topo, list(range(1024)), 195)  # 199,680 photos (+ users)
    moved = list(range(213, 341))
    before_ids = ids_on(topo, "pg1", moved)
    router = Router(load(path), move_wait=15)
    try:
        with Traffic(router, moved, topo.modulus, writers=3) as traffic:
            time.sleep(0.5)
            started = time.monotonic()
            result = run_cli("move-shard", "213-340", "--to", "pg3", "--json", config=path)
            duration = time.monotonic() - started
            time.sleep(1.0)
        assert result.exit_code == 0, result
        report = json.loads(result.stdout)
        print(
            f"\nacceptance: 128 of 1024 shards moved in {duration:.1f}s (sync {report['sync_seconds']:.1f}s); "
            f"write freeze {report['freeze_seconds']:.3f}s (locked {report['freeze_lock_seconds']}s, lag 0 at "
            f"{report['freeze_caught_up_seconds']}s, compared at {report['freeze_compared_seconds']}s); "
            f"{report['rows']} rows compared; {len(traffic.written)} writes and {traffic.reads} reads during "
            f"the move"
        )
        assert report["freeze_seconds"] < 5
        check_moved(topo, path, moved, "pg1", "pg3", before_ids, traffic, report)
        assert replication_leftovers(topo) == {}
        assert run_cli("verify", config=path).exit_code == 0
    finally:
        router.close()


# ---- phases, status, resume ------------------------------------------------------------------


def test_phases_one_by_one_with_status(fleet3):
    topo = load(fleet3)
    before = ids_on(topo, "pg1", [0, 1, 2, 3])
    r = run_cli("move-shard", "0-3", "--to", "pg2", "prepare", config=fleet3)
    assert r.exit_code == 0, r
    assert "phase now prepared" in r.stdout
    status = json.loads(run_cli("move-shard", "--status", "--json", config=fleet3).stdout)
    [m] = status["moves"]
    assert (m["shards"], m["source"], m["target"], m["phase"]) == ("0-3", "pg1", "pg2", "prepared")
    with connect(topo, "pg1") as conn:
        assert conn.execute(
            "SELECT DISTINCT state FROM shardctl.shards WHERE shard_id <= 3"
        ).fetchall() == [("moving_out",)]
    with connect(topo, "pg2") as conn:
        assert conn.execute(
            "SELECT DISTINCT state FROM shardctl.shards WHERE shard_id <= 3"
        ).fetchall() == [("moving_in",)]
        # The ledger rows were copied, not re-made.
        copied = conn.execute(
            "SELECT shard_id, version, checksum, applied_at FROM shardctl.migrations "
            "WHERE shard_id <= 3 ORDER BY 1, 2"
        ).fetchall()
        assert conn.execute("SELECT count(*) FROM insta0.photos").fetchone()[0] == 0
    with connect(topo, "pg1") as conn:
        assert (
            copied
            == conn.execute(
                "SELECT shard_id, version, checksum, applied_at FROM shardctl.migrations "
                "WHERE shard_id <= 3 ORDER BY 1, 2"
            ).fetchall()
        )
    # migrate goes on for the shards that are not moving (nothing is pending here; the shards of a
    # move with pending migrations are covered by test_migrate_live).
    r = run_cli("migrate", config=fleet3)
    assert r.exit_code == 0 and "being moved" not in r.stderr, r
    # A phase out of order is refused; the next one runs.
    r = run_cli("move-shard", "0-3", "--to", "pg2", "sync", config=fleet3)
    assert r.exit_code == 0, r
    assert "12 tables ready" in r.stdout
    status = json.loads(run_cli("move-shard", "--status", "--json", config=fleet3).stdout)
    assert status["moves"][0]["phase"] == "synced"
    assert status["moves"][0]["tables_ready"] == status["moves"][0]["tables"] == 12
    r = run_cli("move-shard", "0-3", "--to", "pg2", "cutover", config=fleet3)
    assert r.exit_code == 0, r
    assert "write freeze:" in r.stdout
    assert sorted(ids_on(load(fleet3), "pg2", [0, 1, 2, 3])) == sorted(before)
    # Running the whole move again is a no-op that says where it stands.
    r = run_cli("move-shard", "0-3", "--to", "pg2", config=fleet3)
    assert r.exit_code == 0 and "cut_over" in r.stdout, r
    r = run_cli("move-shard", "--cleanup", config=fleet3)
    assert r.exit_code == 0, r
    status = json.loads(run_cli("move-shard", "--status", "--json", config=fleet3).stdout)
    assert status["moves"][0]["phase"] == "cleaned" and status["in_flight"] == 0
    assert replication_leftovers(topo) == {}
    r = run_cli("move-shard", "0-3", "--to", "pg2", config=fleet3)
    assert r.exit_code == 0 and r.stdout == "Shards 0-3 are already on pg2: nothing was done.\n", r


def test_sync_before_prepare_and_bad_input(fleet3):
    assert run_cli("move-shard", "0-3", "--to", "pg2", "sync", config=fleet3).exit_code == 1
    assert run_cli("move-shard", "0-3", "--to", "pg9", config=fleet3).exit_code == 2
    assert (
        run_cli("move-shard", "14-17", "--to", "pg3", config=fleet3).exit_code == 2
    )  # two source hosts
    assert run_cli("move-shard", "0-99", "--to", "pg3", config=fleet3).exit_code == 2
    assert run_cli("move-shard", "0-3", config=fleet3).exit_code == 2
    assert run_cli("move-shard", "--abort", config=fleet3).exit_code == 2  # nothing in flight
    assert run_cli("move-shard", "--abort", "--cleanup", config=fleet3).exit_code == 2
    assert (
        run_cli("move-shard", "0-3", "--to", "pg2", "prepare", "--abort", config=fleet3).exit_code
        == 2
    )


def test_kill_during_sync_then_resume(fleet3):
    """A run killed while the initial copy goes on resumes where it was: same subscriptions, no new ones."""
    topo = load(fleet3)
    assert run_cli("move-shard", "0-15", "--to", "pg3", "prepare", config=fleet3).exit_code == 0
    proc = start_shardctl(
        "move-shard",
        "0-15",
        "--to",
        "pg3",
        "sync",
        "--schemas-per-subscription",
        "4",
        config=fleet3,
        text=False,
    )
    try:
        deadline = time.monotonic() + 60
        with connect(topo, "pg3", autocommit=True) as conn:
            while time.monotonic() < deadline:
                subs = conn.execute(
                    "SELECT oid, subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM "
                    "pg_database WHERE datname = current_database())"
                ).fetchall()
                if len(subs) == 4:
                    break
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.02)
            ready = conn.execute(
                "SELECT count(*) FILTER (WHERE srsubstate = 'r'), count(*) FROM pg_subscription_rel"
            ).fetchone()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(subs) == 4, "the sync never created its subscriptions"
    assert ready[0] < 48, f"the copy finished before the kill ({ready}); nothing was interrupted"
    report = move_shards(load(fleet3), list(range(16)), "pg3", phases=["sync"])
    assert report["phase"] == "synced" and report["tables"] == 48
    with connect(topo, "pg3") as conn:
        again = conn.execute(
            "SELECT oid, subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM "
            "pg_database WHERE datname = current_database())"
        ).fetchall()
    assert sorted(again) == sorted(subs)
    before = ids_on(topo, "pg1", list(range(16)))
    report = move_shards(load(fleet3), list(range(16)), "pg3", phases=["cutover"])
    assert report["phase"] == "cut_over"
    assert sorted(ids_on(topo, "pg3", list(range(16)))) == sorted(before)
    assert replication_leftovers(topo) == {}


def test_interrupted_prepare_resumes(fleet3):
    """A prepare that stopped half-way (one shard's schema half-built, no control rows) is finished by the
    next run, which rebuilds that shard."""
    topo = load(fleet3)
    report = move_shards(topo, [4, 5, 6], "pg3", phases=["prepare"])
    with connect(topo, "pg3", autocommit=True) as conn:
        conn.execute(
            "DELETE FROM shardctl.migrations WHERE shard_id = 5; DELETE FROM shardctl.shards WHERE "
            "shard_id = 5; DROP TABLE insta5.likes; UPDATE shardctl.moves SET phase = 'preparing'"
        )
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("UPDATE shardctl.moves SET phase = 'preparing'")
    assert move_status(load(fleet3)).moves[0]["phase"] == "preparing"
    again = move_shards(load(fleet3), [4, 5, 6], "pg3")
    assert again["move_id"] == report["move_id"] and again["phase"] == "cut_over"
    assert any("half-built" in m for m in again["messages"])
    with connect(topo, "pg3") as conn:
        assert conn.execute("SELECT count(*) FROM insta5.photos").fetchone()[0] == 150
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE shard_id = 5").fetchone()[
                0
            ]
            == 2
        )


def test_crash_between_source_commit_and_flip(fleet3, monkeypatch):
    """The source committed its freeze, then the run died before the topology was flipped: the file still
    names the source, but a Router follows the redirect the source recorded in that commit; running the
    command again finishes the cutover."""
    import shardctl.ops.move.cutover as mv

    topo = load(fleet3)
    real_flip = mv.flip_topology

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(mv, "flip_topology", crash)
    with pytest.raises(KeyboardInterrupt):
        move_shards(topo, [7, 8], "pg2")
    monkeypatch.setattr(mv, "flip_topology", real_flip)
    assert load(fleet3).host_of(7).name == "pg1"
    with Router(load(fleet3), move_wait=0.5) as router:
        # Moved, and the file does not say where yet: the source's redirect does.
        assert router.execute(7, "INSERT INTO photos (user_id) VALUES (7)") == 1
        assert router.redirects() == {7: "pg2"}
        status = move_status(load(fleet3))
        assert status.moves[0]["phase"] == "cut_over"
        r = run_cli("move-shard", "7-8", "--to", "pg2", config=fleet3)
        assert r.exit_code == 0 and "finishing the flip" in r.stdout, r
        assert router.execute(7, "INSERT INTO photos (user_id) VALUES (7)") == 1
    assert load(fleet3).host_of(7).name == "pg2"
    assert len(ids_on(topo, "pg2", [7])) == 152
    assert replication_leftovers(topo) == {}


# ---- abort -------------------------------------------------------------------------------------


def test_abort_after_sync_leaves_source_as_it_was(fleet3):
    topo = load(fleet3)
    moving = list(range(4, 12))
    before = snapshot(topo, "pg1", moving)
    topology_text = fleet3.read_text()
    for phase in ("prepare", "sync"):
        assert run_cli("move-shard", "4-11", "--to", "pg3", phase, config=fleet3).exit_code == 0
    assert replication_leftovers(topo)  # there is something to remove
    r = run_cli("move-shard", "4-11", "--abort", config=fleet3)
    assert r.exit_code == 0, r
    assert "phase now aborted" in r.stdout
    assert snapshot(topo, "pg1", moving) == before
    assert fleet3.read_text() == topology_text
    assert replication_leftovers(topo) == {}
    with connect(topo, "pg3") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)",
                ([f"insta{n}" for n in moving],),
            ).fetchone()[0]
            == 0
        )
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.shards WHERE shard_id = ANY(%s)", (moving,)
            ).fetchone()[0]
            == 0
        )
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.migrations WHERE shard_id = ANY(%s)", (moving,)
            ).fetchone()[0]
            == 0
        )
    assert run_cli("migrate", config=fleet3).exit_code == 0
    assert run_cli("verify", config=fleet3).exit_code == 0
    # The same shards can be moved again afterwards.
    before = snapshot(topo, "pg1", moving)  # verify called next_id()
    report = move_shards(load(fleet3), moving, "pg3", phases=["prepare"])
    assert report["phase"] == "prepared"
    abort_move(load(fleet3), shards=moving)
    assert snapshot(topo, "pg1", moving) == before


def test_abort_during_prepare_and_after_cutover(fleet3):
    """Abort right after prepare; then a full move, rows written on the target, and abort after the cutover:
    the rows come back to the source, which is authoritative again."""
    topo = load(fleet3)
    moving = [1, 2, 3]
    before = snapshot(topo, "pg1", moving)
    move_shards(topo, moving, "pg2", phases=["prepare"])
    abort_move(load(fleet3), shards=moving)
    assert snapshot(topo, "pg1", moving) == before

    report = move_shards(load(fleet3), moving, "pg2")
    assert report["phase"] == "cut_over"
    with Router(load(fleet3)) as router:
        new_ids = [
            router.execute(2, "INSERT INTO photos (user_id) VALUES (2) RETURNING id")[0][0]
            for _ in range(5)
        ]
        # the old copy refuses writes
        with pytest.raises(psycopg.Error), connect(topo, "pg1", autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO insta2_moved_{report['move_id']}.photos (user_id) VALUES (1)"
            )
        result = abort_move(load(fleet3), shards=moving)
        assert result["phase"] == "aborted"
        print(f"\nabort after cutover: freeze {result['freeze_seconds']:.3f}s")
        assert load(fleet3).host_of(2).name == "pg1"
        # The router follows the move back too.
        after = router.execute(
            2, "SELECT id FROM photos WHERE id = ANY(%s) ORDER BY id", (new_ids,)
        )
        assert [r[0] for r in after] == sorted(new_ids)
        newer = router.execute(2, "INSERT INTO photos (user_id) VALUES (2) RETURNING id")[0][0]
        assert newer > max(new_ids)
    assert replication_leftovers(topo) == {}
    with connect(topo, "pg2") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname ~ '^insta[123](_|$)'"
            ).fetchone()[0]
            == 0
        )
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM insta2.photos").fetchone()[0] == 150 + 5 + 1
        assert conn.execute("SELECT DISTINCT state FROM shardctl.shards").fetchall() == [
            ("active",)
        ]
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname = 'shardctl_moved_shard'"
            ).fetchone()[0]
            == 0
        )
    assert run_cli("verify", config=fleet3).exit_code == 0
    assert run_cli("migrate", config=fleet3).exit_code == 0


# ---- safety ------------------------------------------------------------------------------------


def test_refuses_tables_without_primary_key(fleet3):
    topo = load(fleet3)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("CREATE TABLE insta6.audit (at timestamptz, what text)")
    r = run_cli("move-shard", "4-7", "--to", "pg2", config=fleet3)
    assert r.exit_code == 1, r
    assert "insta6.audit has no primary key or replica identity" in r.stderr
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT DISTINCT state FROM shardctl.shards").fetchall() == [
            ("active",)
        ]
        assert conn.execute(
            "SELECT to_regclass('shardctl.moves') IS NULL OR "
            "NOT EXISTS (SELECT 1 FROM shardctl.moves)"
        ).fetchone()[0]
    with connect(topo, "pg2") as conn:
        assert (
            conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'insta4'").fetchone()[0]
            == 0
        )
    # With a replica identity the table may move (but it exists only on the source: prepare says so).
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("ALTER TABLE insta6.audit REPLICA IDENTITY FULL")
    with pytest.raises(OperationFailed, match="insta6.audit exists only on pg1"):
        move_shards(load(fleet3), [4, 5, 6, 7], "pg2", phases=["prepare"])
    abort_move(load(fleet3), shards=[4, 5, 6, 7])
    assert replication_leftovers(topo) == {}


def test_one_move_at_a_time_per_shard(fleet3):
    topo = load(fleet3)
    move_shards(topo, [8, 9, 10], "pg2", phases=["prepare"])
    # An overlapping move is refused while the first is in flight.
    with pytest.raises(OperationFailed, match="part of move"):
        move_shards(load(fleet3), [10, 11], "pg3")
    # Another run working on the same shards (its lock held) is refused, not run alongside.
    with connect(topo, "pg1", autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, 9)", (MOVE_LOCK_CLASS,))
        with pytest.raises(LockBusy, match="another shardctl run is moving"):
            move_shards(load(fleet3), [8, 9, 10], "pg2", phases=["sync"])
        r = run_cli("move-shard", "8-10", "--abort", config=fleet3)
        assert r.exit_code == 1 and "another shardctl run" in r.stderr
    # Moves of other shards may go on meanwhile.
    other = move_shards(load(fleet3), [0, 1], "pg3", phases=["prepare"])
    assert other["phase"] == "prepared"
    status = move_status(load(fleet3))
    assert status.in_flight == 2
    r = run_cli("move-shard", "--abort", config=fleet3)
    assert r.exit_code == 2 and "2 moves are in progress" in r.stderr
    abort_move(load(fleet3), shards=[8, 9, 10])
    abort_move(load(fleet3), move_id=other["move_id"])
    assert move_status(load(fleet3)).in_flight == 0


def test_cleanup_needs_cutover_and_cutover_failure_keeps_source(fleet3):
    topo = load(fleet3)
    move_shards(topo, [12, 13], "pg3", phases=["prepare", "sync"])
    with pytest.raises(OperationFailed, match="cleanup drops"):
        cleanup_move(load(fleet3), shards=[12, 13])
    # A cutover whose freeze cannot take its locks in time rolls back: the source stays authoritative.
    with connect(topo, "pg1") as writer:
        writer.execute("INSERT INTO insta13.users (username) VALUES ('in a long transaction')")
        with pytest.raises(OperationFailed, match="gave up after 2 attempts"):
            move_shards(
                load(fleet3),
                [12, 13],
                "pg3",
                phases=["cutover"],
                options=MoveOptions(max_freeze=0.3, attempts=2),
            )
        writer.rollback()
    assert load(fleet3).host_of(13).name == "pg1"
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO insta13.photos (user_id) VALUES (13)"
        )  # writes still go to the source
    report = move_shards(load(fleet3), [12, 13], "pg3", phases=["cutover"])
    assert report["phase"] == "cut_over"
    assert len(ids_on(topo, "pg3", [13])) == 151
    cleanup_move(load(fleet3), move_id=report["move_id"])
    assert replication_leftovers(topo) == {}


def test_router_follows_a_move(fleet3):
    """A router loaded before the move: execute() retries on the new host; connection() users get the
    error once and follow_move() reloads. (pg1's DSN names an application: the subscriptions still are
    found by their slots.)"""
    dsn = load(fleet3).host("pg1").dsn
    fleet3.write_text(fleet3.read_text().replace(dsn, dsn + "?application_name=photo-app"))
    router = Router(load(fleet3), move_wait=5)
    try:
        assert router.execute(14, "SELECT count(*) FROM photos")[0][0] == 150
        move_shards(load(fleet3), [14, 15], "pg2")
        assert router.topology.host_of(14).name == "pg1"  # not reloaded yet
        assert router.execute(14, "INSERT INTO photos (user_id) VALUES (14)") == 1
        assert router.topology.host_of(14).name == "pg2"
    finally:
        router.close()
    # connection() with a stale topology: the error, then follow_move() says retry.
    stale_topo = load(fleet3)
    for h in stale_topo.hosts:  # pretend it was loaded before the move
        if h.name == "pg1":
            h.shards = sorted(h.shards + [15])
    stale_topo._owner[15] = stale_topo.host("pg1")
    with Router(stale_topo, move_wait=1) as r2:
        with pytest.raises(psycopg.Error) as info, r2.connection(15) as conn:
            conn.execute("INSERT INTO photos (user_id) VALUES (15)")
        r2.reload()  # as if another thread had reloaded first: follow_move still sees the move
        assert r2.topology.host_of(15).name == "pg2"
        assert r2.follow_move(15, info.value) is True
        with r2.connection(15) as conn:
            assert conn.execute("SELECT count(*) FROM photos").fetchone()[0] == 150
    # An unrelated missing table is not mistaken for a move.
    with Router(load(fleet3), move_wait=1) as r3, pytest.raises(psycopg.errors.UndefinedTable):
        r3.execute(3, "SELECT * FROM no_such_table")
