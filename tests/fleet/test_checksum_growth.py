"""Ledger checksums survive growth: a migration that uses fleet-wide values (``shard_count``) is not
"changed after it was applied" once add-shard changes them (issue 13, item 6; docs/migrations.md)."""

from __future__ import annotations

import hashlib
import shutil

from support.fleet import connect, load, run_cli

SHARD_COMMENT = (
    "COMMENT ON SCHEMA {{ schema|ident }} IS 'shard {{ shard_id }} of {{ shard_count }}';\n"
)


def test_add_shard_leaves_applied_checksums_valid_and_edits_still_fail(make_fleet):
    fleet = make_fleet(hosts=2, shards=8)
    migrations = fleet.parent / "migrations"
    (migrations / "V0003__shard_comment.sql").write_text(SHARD_COMMENT)
    assert run_cli("init", config=fleet).exit_code == 0
    pg3 = make_fleet.new_database(2)
    assert run_cli("add-host", "pg3", "--dsn", pg3, config=fleet).exit_code == 0
    grown = run_cli("add-shard", "--count", "8", "--host", "pg3", config=fleet)
    assert grown.exit_code == 0, grown
    topo = load(fleet)
    assert topo.shard_count == 16

    # The old shards' V3 was rendered with shard_count 8, the new ones' with 16: all are valid.
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute("SELECT obj_description('insta1'::regnamespace)").fetchone()[0]
            == "shard 1 of 8"
        )
    with connect(topo, "pg3") as conn:
        assert (
            conn.execute("SELECT obj_description('insta9'::regnamespace)").fetchone()[0]
            == "shard 9 of 16"
        )
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 0 and "Nothing pending" in check.stdout, check
    plan = run_cli("plan", "--json", config=fleet)
    assert all(h["drift"] == [] for h in __import__("json").loads(plan.stdout)["hosts"]), plan
    base = fleet.parent / "base"
    shutil.copytree(migrations, base)
    gate = run_cli("migrate", "--check", "--base", str(base), config=fleet)
    assert gate.exit_code == 0, gate

    # An edit of the file itself is still caught, on old and new shards alike.
    (migrations / "V0003__shard_comment.sql").write_text(
        SHARD_COMMENT.replace("shard ", "logical shard ")
    )
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 1, check
    for host, shards in (("pg1", "0-3"), ("pg2", "4-7"), ("pg3", "8-15")):
        assert (
            f"{host}: V0003__shard_comment.sql changed after it was applied (shards {shards})"
            in check.stderr
        )


def test_ledger_rows_written_before_the_change_still_verify(make_fleet):
    """Rows written with the old checksum (sha256 of the rendered SQL) are accepted while they match."""
    fleet = make_fleet(hosts=1, shards=4, init=True)
    topo = load(fleet)
    from shardctl.sql.migrations import for_topology

    v1 = for_topology(topo)[0]
    legacy = hashlib.sha256(v1.render(topo, 2).encode()).hexdigest()
    assert legacy != v1.checksum_for(topo, 2)
    with connect(topo, "pg1") as conn:
        conn.execute(
            "UPDATE shardctl.migrations SET checksum = %s WHERE shard_id = 2 AND version = 1",
            (legacy,),
        )
        conn.execute(
            "UPDATE shardctl.migrations SET checksum = %s WHERE shard_id = 3 AND version = 1",
            ("0" * 64,),
        )
        conn.execute("DELETE FROM shardctl.meta")  # no cached verdicts: check every row
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 1, check
    assert (
        "V0001__create_users_and_photos.sql changed after it was applied (shards 3)" in check.stderr
    )
