"""A move that finishes brings its shards to the fleet's version: migrate leaves shards in flight pending,
and the move's cutover (or its re-run after a crash) migrates them on their new host."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from support import crash_at
from support.fleet import connect, load, run_cli

V3 = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"
V4 = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN filter text;\n"


def _versions(topo, host: str, shards: list[int]) -> dict[int, int]:
    with connect(topo, host) as conn:
        return dict(
            conn.execute(
                "SELECT shard_id, max(version) FROM shardctl.migrations WHERE shard_id = ANY(%s) "
                "GROUP BY 1",
                (shards,),
            ).fetchall()
        )


def _columns(topo, host: str, schema: str) -> list[str]:
    with connect(topo, host) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                "%s AND table_name = 'photos' ORDER BY ordinal_position",
                (schema,),
            ).fetchall()
        ]


def _migrate_while_in_flight(path: Path) -> None:
    """A new migration while shards 0-3 are in flight: migrate applies it elsewhere, leaves them pending."""
    (path.parent / "migrations" / "V0003__photo_location.sql").write_text(V3)
    r = run_cli("migrate", "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert any("shards 0-3 are being moved to pg2" in line for line in doc["held"]), doc["held"]
    topo = load(path)
    assert set(_versions(topo, "pg1", [0, 1, 2, 3]).values()) == {2}
    assert set(_versions(topo, "pg1", [4, 5]).values()) == {3}
    assert set(_versions(topo, "pg2", [0, 1, 2, 3]).values()) == {
        2
    }  # the target's copies, moving_in
    check = run_cli("migrate", "--check", config=path)
    assert check.exit_code == 1 and "shards 0-3 are being moved" in check.stderr, check


def test_cutover_brings_moved_shards_to_the_fleets_version(fleet3):
    path = fleet3
    assert run_cli("move-shard", "0-3", "--to", "pg2", "prepare", config=path).exit_code == 0
    assert run_cli("move-shard", "0-3", "--to", "pg2", "sync", config=path).exit_code == 0
    _migrate_while_in_flight(path)
    # A file on disk that no shard has applied yet is not the fleet's version: the move stops at V3.
    v4 = path.parent / "migrations" / "V0004__photo_filter.sql"
    v4.write_text(V4)
    r = run_cli("move-shard", "0-3", "--to", "pg2", "--json", config=path)
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert report["phase"] == "cut_over"
    assert report["caught_up"] == {
        "host": "pg2",
        "to": 3,
        "shards": "0-3",
        "from": {"V2": "0-3"},
    }, report
    assert "brought shards 0-3 from V2 to V3 on pg2 (the fleet's version)" in report["messages"]
    v4.unlink()
    topo = load(path)
    assert _versions(topo, "pg2", [0, 1, 2, 3]) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert "location" in _columns(topo, "pg2", "insta0") and "filter" not in _columns(
        topo, "pg2", "insta0"
    )
    with connect(topo, "pg2") as conn:  # new ledger rows, written by this run on pg2 (not copied)
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.migrations WHERE version = 3 AND shard_id = ANY(%s) "
                "AND applied_at > now() - interval '5 minutes'",
                ([0, 1, 2, 3],),
            ).fetchone()[0]
            == 4
        )
    check = run_cli("migrate", "--check", config=path)
    assert check.exit_code == 0, check
    assert run_cli("verify", config=path).exit_code == 0
    # The source's old copies stay as they were frozen (V2), and --cleanup drops them.
    assert set(_versions(topo, "pg1", [0, 1, 2, 3]).values()) == {2}
    cleaned = run_cli("move-shard", "--cleanup", "--move", report["move_id"], "--json", config=path)
    assert cleaned.exit_code == 0, cleaned
    assert "caught_up" not in json.loads(cleaned.stdout)  # nothing left behind
    assert run_cli("migrate", "--check", config=path).exit_code == 0


def test_rerun_after_a_crash_after_the_flip_brings_the_shards(fleet3):
    """Killed right after the topology flip (before the catch-up): the re-run finishes the switch and
    migrates the shards, and says so in its human output."""
    path = fleet3
    assert run_cli("move-shard", "0-3", "--to", "pg2", "prepare", config=path).exit_code == 0
    _migrate_while_in_flight(path)
    killed = crash_at.run("after-flip", "--config", str(path), "move-shard", "0-3", "--to", "pg2")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    topo = load(path)
    assert all(topo.host_of(n).name == "pg2" for n in range(4))
    assert set(_versions(topo, "pg2", [0, 1, 2, 3]).values()) == {2}  # killed before the catch-up
    again = run_cli("move-shard", "0-3", "--to", "pg2", config=path)
    assert again.exit_code == 0, again
    assert "brought shards 0-3 from V2 to V3 on pg2" in again.stdout, again.stdout
    assert _versions(load(path), "pg2", [0, 1, 2, 3]) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert run_cli("migrate", "--check", config=path).exit_code == 0
    assert run_cli("verify", config=path).exit_code == 0
    # The old copies on pg1 are at V2: an abort could not take the new rows back, and says so.
    refused = run_cli("move-shard", "0-3", "--abort", config=path)
    assert refused.exit_code == 1 and "migrations ran on pg2 after the cutover" in refused.stderr, (
        refused
    )
    assert run_cli("migrate", "--check", config=path).exit_code == 0
