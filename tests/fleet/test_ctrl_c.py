"""Ctrl-C during a fleet command: a real SIGINT to a real ``shardctl init`` process stops it at a shard
boundary, with a report of what was done and what was not, exit 130, every shard complete or absent,
and a re-run that finishes the job."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable

import psycopg
import pytest
from support.fleet import connect, load, run_cli
from support.migrations import add_migration, ledger, migrated, shards_with_column
from support.moves import ids_on, load_rows
from support.process import process_env, shardctl_argv

SHARDS = 512
# Generous: the machine running the suite may be loaded. The stop itself is one batch away (one
# transaction of --batch-size shards).
STOP_WITHIN = 30.0
# A copy paced to run for tens of seconds more must stop at once: its COPY is cancelled.
COPY_STOP_WITHIN = 5.0


def recorded(topo) -> dict[str, set[int]]:
    out = {}
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('shardctl.shards')").fetchone()[0] is None:
                out[host.name] = set()
                continue
            out[host.name] = {r[0] for r in conn.execute("SELECT shard_id FROM shardctl.shards")}
    return out


def complete_or_absent(topo, latest: int) -> set[int]:
    """Every shard schema on every host is recorded with all ``latest`` migrations and its tables,
    and every recorded shard has its schema: returns the complete shards."""
    complete: set[int] = set()
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            schemas = {
                int(r[0][5:])
                for r in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname ~ '^insta[0-9]+$'"
                )
            }
            ledger = dict(
                conn.execute(
                    "SELECT s.shard_id, count(m.version) FROM shardctl.shards s "
                    "LEFT JOIN shardctl.migrations m USING (shard_id) GROUP BY 1"
                ).fetchall()
            )
            tables = dict(
                conn.execute(
                    "SELECT substr(n.nspname, 6)::int, count(*) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname ~ '^insta[0-9]+$' AND c.relkind = 'r' GROUP BY 1"
                ).fetchall()
            )
        assert schemas == set(ledger), (host.name, sorted(schemas ^ set(ledger))[:10])
        assert set(ledger.values()) <= {latest}, (host.name, set(ledger.values()))
        assert len(set(tables.values())) <= 1 and set(tables) == schemas, host.name
        complete |= schemas
    return complete


def interrupted(
    argv: list[str], mid_run: Callable[[], bool], within: float = STOP_WITHIN
) -> tuple[str, str, str]:
    """Run ``argv`` as a real process, send it a real SIGINT once ``mid_run()`` is true, and return its
    stdout, stderr and its one ``error:`` line, having checked exit 130 within ``within`` seconds."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env()
    )
    try:
        deadline = time.monotonic() + 120
        while not mid_run():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        stopped_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert stopped_after < within, stopped_after
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return out, err, lines[0]


def done_and_not_started(command: str, line: str, rerun: str | None = None) -> tuple[int, int]:
    said = re.fullmatch(
        rf"error: {command}: interrupted \(Ctrl-C\): stopped at a shard boundary; (\d+) shard\(s\) "
        rf"done, (\d+) not started; every shard is complete or absent: run "
        rf"{re.escape(rerun or 'shardctl ' + command)} again to finish",
        line,
    )
    assert said, line
    return int(said[1]), int(said[2])


def test_ctrl_c_stops_init_at_a_shard_boundary_and_a_rerun_finishes(make_fleet):
    path = make_fleet(hosts=2, shards=SHARDS)
    topo = load(path)
    out, _, line = interrupted(
        shardctl_argv("init", "--json", "--batch-size", "8", config=path),
        lambda: any(recorded(topo).values()),  # mid-run: some shards made, not all
    )
    done, not_started = done_and_not_started("init", line)
    assert done + not_started == SHARDS and not_started > 0, line

    doc = json.loads(out)
    assert doc["command"] == "init" and doc["ok"] is False and doc["interrupted"] is True
    assert doc["exit_code"] == 130
    assert sum(h["created_count"] for h in doc["hosts"]) == done
    complete = complete_or_absent(topo, doc["latest_version"])
    assert len(complete) == done

    again = run_cli("init", "--json", config=path)
    assert again.exit_code == 0, again
    assert sum(h["created_count"] for h in json.loads(again.stdout)["hosts"]) == not_started
    assert len(complete_or_absent(topo, doc["latest_version"])) == SHARDS
    assert run_cli("verify", config=path).exit_code == 0


def ledger_at(topo, version: int) -> set[int]:
    """The shards whose ledger has ``version``, on any host."""
    return set().union(*(ledger(topo, h.name, version) for h in topo.hosts))


def with_column(topo, table: str, column: str) -> set[int]:
    """The shards whose ``table`` has ``column``, read from the catalog, on any host."""
    return set().union(*(shards_with_column(topo, h.name, table, column) for h in topo.hosts))


@pytest.mark.slow
def test_ctrl_c_stops_migrate_at_a_shard_boundary_and_a_rerun_finishes(make_fleet):
    path = make_fleet(hosts=2, shards=SHARDS, init=True)
    topo = load(path)
    add_migration(
        path,
        "V0003__photo_note.sql",
        "ALTER TABLE {{ schema }}.photos ADD COLUMN note text;\nSELECT pg_sleep(0.005);\n",
    )
    _, _, line = interrupted(
        shardctl_argv("migrate", "--batch-size", "4", config=path),
        lambda: bool(ledger_at(topo, 3)),
    )
    done, not_started = done_and_not_started("migrate", line)
    assert done + not_started == SHARDS and not_started > 0, line
    # nothing half-built: a shard has V3 in its ledger exactly when it has the column
    at_v3 = ledger_at(topo, 3)
    assert at_v3 == with_column(topo, "photos", "note") and len(at_v3) == done, line

    again = run_cli("migrate", "--json", config=path)
    assert again.exit_code == 0, again
    assert len(migrated(json.loads(again.stdout))) == not_started, again.stdout[:2000]
    assert with_column(topo, "photos", "note") == set(range(SHARDS))
    assert ledger_at(topo, 3) == set(range(SHARDS))
    assert run_cli("verify", config=path).exit_code == 0


def test_ctrl_c_stops_add_shard_and_the_same_command_finishes(make_fleet):
    start, total = 16, 256
    path = make_fleet(hosts=2, shards=start, init=True)
    topo = load(path)
    before = path.read_text()
    argv = ["add-shard", "--host", "pg2", "--count", str(total - start), "--batch-size", "4"]
    _, _, line = interrupted(
        shardctl_argv(*argv, config=path),
        lambda: len(recorded(topo)["pg2"]) > start // 2,  # some new shards made on pg2
    )
    done, not_started = done_and_not_started(
        "add-shard", line, rerun="the same shardctl add-shard command"
    )
    assert done + not_started == total - start and not_started > 0, line
    assert path.read_text() == before  # the topology names no shard that may be absent
    made = set().union(*recorded(topo).values())
    assert len(made) == start + done and len(complete_or_absent(topo, 2)) == start + done

    again = run_cli(*argv, config=path)
    assert again.exit_code == 0, again
    assert load(path).shard_count == total
    assert len(complete_or_absent(topo, 2)) == total
    assert run_cli("verify", config=path).exit_code == 0


def test_ctrl_c_during_a_move_names_it_and_the_same_command_finishes(make_fleet):
    """move-shard keeps its own state: Ctrl-C while the move waits on the target (behind a lock the
    test holds on the target's table) exits 130 with the lock still held, in one line naming the
    move in flight and both ways out; the same command then finishes it, every row on the target."""
    path = make_fleet(hosts=2, shards=8, init=True)
    topo = load(path)
    load_rows(topo, [0], 500)
    held = connect(topo, "pg2")  # not autocommit: the lock lasts until the rollback
    argv = shardctl_argv("move-shard", "0", "--to", "pg2", "--copy-workers", "1", config=path)

    def move_is_waiting() -> bool:
        """The test holds the target's photos table as soon as prepare made it; the move queues."""
        try:
            held.execute("LOCK TABLE insta0.photos IN ACCESS EXCLUSIVE MODE NOWAIT")
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):  # not made yet
            held.rollback()
            return False
        with connect(topo, "pg2", autocommit=True) as conn:
            return bool(
                conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                    "'insta0.photos'::regclass"
                ).fetchone()[0]
            )

    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env()
    )
    try:
        deadline = time.monotonic() + 120
        while not move_is_waiting():
            if proc.poll() is not None or time.monotonic() > deadline:
                held.rollback()  # the move may be queued behind the lock: let it end
                raise AssertionError(proc.communicate(timeout=120))
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        # what it waits on is cancelled, not waited for: it stops while the lock is still held
        _, err = proc.communicate(timeout=STOP_WITHIN)
        stopped_after = time.monotonic() - sent
        held.rollback()
    finally:
        held.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert stopped_after < STOP_WITHIN, stopped_after
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    said = re.fullmatch(
        r"error: move-shard: interrupted \(Ctrl-C\): move (mv\w+) \(shards 0 pg1 → pg2, phase "
        r"\w+\): in flight \(migrate waits for it\): finish with shardctl move-shard 0 --to pg2, "
        r"or roll back with shardctl move-shard --abort --move (mv\w+)",
        lines[0],
    )
    assert said and said[1] == said[2], lines[0]

    again = run_cli("move-shard", "0", "--to", "pg2", config=path)
    assert again.exit_code == 0, again
    assert load(path).host_of(0).name == "pg2"
    assert len(ids_on(load(path), "pg2", [0])) == 500


@pytest.mark.slow
def test_ctrl_c_during_a_moves_copy_stops_it_now(make_fleet):
    """Ctrl-C while a move's copy streams (paced by --nice, so it would run for many seconds more)
    stops the COPY at once rather than after its table: exit 130 within a few seconds, the one line
    naming the move; the same command then finishes it, every row on the target."""
    path = make_fleet(hosts=2, shards=8, init=True)
    topo = load(path)
    rows = 300_000
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO insta0.photos (user_id, caption) "
            f"SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, {rows}) g"
        )
    argv = shardctl_argv(
        "move-shard", "0", "--to", "pg2", "--copy-workers", "1", "--nice", "30", config=path
    )

    def copying() -> bool:
        with connect(topo, "pg1", autocommit=True) as conn:
            return bool(
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'COPY%insta0%photos%'"
                ).fetchone()[0]
            )

    _, _, line = interrupted(argv, copying, within=COPY_STOP_WITHIN)
    assert line.startswith("error: move-shard: interrupted (Ctrl-C): move "), line
    again = run_cli("move-shard", "0", "--to", "pg2", config=path)
    assert again.exit_code == 0, again
    assert len(ids_on(load(path), "pg2", [0])) == rows
