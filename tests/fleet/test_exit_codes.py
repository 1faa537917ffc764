"""Exit codes that tell the truth: migrate and status exit 4 while shards are missing or failed, and every
failure line names the migration file."""

from __future__ import annotations

import json

import pytest
from support.fleet import connect, load, run_cli


def admin(topo, host):
    return connect(topo, host, autocommit=True)


def error_line(result) -> str:
    lines = [
        ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning: ")
    ]
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    ), result
    return lines[0]


def ledger(topo) -> dict:
    out = {}
    for host in topo.hosts:
        with admin(topo, host.name) as conn:
            out[host.name] = conn.execute(
                "SELECT count(*), max(applied_at) FROM shardctl.migrations"
            ).fetchone()
    return out


@pytest.fixture
def ready(make_fleet):
    return make_fleet(hosts=2, shards=8, init=True)  # pg1: 0-3, pg2: 4-7


def test_missing_shard_makes_migrate_and_status_exit_4(ready):
    topo = load(ready)
    with admin(topo, "pg1") as conn:  # shard 2 was never created (its record and schema gone)
        conn.execute(
            "DROP SCHEMA insta2 CASCADE; DELETE FROM shardctl.migrations WHERE shard_id = 2; "
            "DELETE FROM shardctl.shards WHERE shard_id = 2"
        )
    (ready.parent / "migrations" / "V0003__photo_location.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"
    )

    status = run_cli("status", config=ready)
    assert status.exit_code == 4, status
    assert error_line(status) == "error: status: pg1: shards 2 missing (run shardctl init)"
    doc = json.loads(run_cli("status", "--json", config=ready).stdout)
    assert doc["ok"] is False and [h["missing"] for h in doc["hosts"]] == ["2", ""]

    migrated = run_cli("migrate", config=ready)
    assert migrated.exit_code == 4, migrated
    assert error_line(migrated) == (
        "error: migrate: shards missing, so not migrated: pg1: shards 2 (never created, "
        "or their schema was dropped: run shardctl init)"
    )
    with admin(topo, "pg1") as conn:  # the other shards were migrated all the same
        assert conn.execute(
            "SELECT array_agg(shard_id ORDER BY shard_id) FROM shardctl.migrations "
            "WHERE version = 3"
        ).fetchone()[0] == [0, 1, 3]

    assert run_cli("init", config=ready).exit_code == 0
    assert run_cli("migrate", config=ready).exit_code == 0
    assert run_cli("status", config=ready).exit_code == 0


def test_failed_shard_names_the_file_and_status_exits_4_until_it_is_fixed(ready):
    topo = load(ready)
    with admin(topo, "pg2") as conn:  # one row that the new NOT NULL refuses, on shard 5 only
        conn.execute("INSERT INTO insta5.photos (user_id, caption) VALUES (1, NULL)")
    (ready.parent / "migrations" / "V0003__caption_required.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ALTER COLUMN caption SET NOT NULL;\n"
    )

    failed = run_cli("migrate", config=ready)
    assert failed.exit_code == 1, failed
    line = error_line(failed)
    assert line.startswith(
        "error: migrate: 1 shard(s) failed: shard 5 on pg2 at V0003__caption_required.sql: "
    ), line
    assert "contains null values" in line
    assert (
        "failed shard 5 (insta5) on pg2 at V0003__caption_required.sql" not in failed.stdout
    )  # said once
    doc = json.loads(run_cli("migrate", "--json", config=ready).stdout)
    assert [(f["shard"], f["file"]) for f in doc["hosts"][1]["failed"]] == [
        (5, "V0003__caption_required.sql")
    ]

    before = ledger(topo)
    status = run_cli("status", config=ready)
    assert status.exit_code == 4, status
    assert error_line(status) == (
        "error: status: pg2: shards 5 at V0003__caption_required.sql failed (fix it, then "
        "re-run shardctl migrate)"
    )
    assert "failed: shards 5 at V0003__caption_required.sql" in " ".join(status.stdout.split())
    # migrate --check says what status says, with the same exit code (ops.health: one truth)
    check = run_cli("migrate", "--check", config=ready)
    assert check.exit_code == 4 and error_line(check) == error_line(status).replace(
        "status:", "migrate:"
    ), check
    assert ledger(topo) == before  # status and --check changed nothing

    with admin(topo, "pg2") as conn:
        conn.execute("UPDATE insta5.photos SET caption = '' WHERE caption IS NULL")
    assert run_cli("migrate", config=ready).exit_code == 0
    fixed = run_cli("status", "--json", config=ready)
    assert fixed.exit_code == 0 and json.loads(fixed.stdout)["ok"] is True, fixed


@pytest.mark.parametrize("as_json", [False, True])
def test_a_servers_error_no_library_function_expected_is_one_line_and_exit_1(
    ready, monkeypatch, as_json
):
    """A psycopg error that reaches the CLI (a bug of ours, or a server limit nobody foresaw, as
    "out of shared memory" was) is one line with the server's own first line and SQLSTATE, exit 1,
    never a traceback. The error is a real one, from a real server: ``status`` is made to run a
    division by zero there."""
    import shardctl.ops.status as ops_status

    topo = load(ready)

    def failing(*args, **kwargs):
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute("SELECT 1 / 0")

    monkeypatch.setattr(ops_status, "status", failing)
    r = run_cli("status", *(["--json"] if as_json else []), config=ready)
    assert r.exit_code == 1, r
    line = error_line(r)
    assert line == (
        "error: status: stopped by a server's error: division by zero (SQLSTATE 22012) "
        "(--debug: where)"
    ), line
    if as_json:
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["error"] == line.removeprefix("error: "), doc
