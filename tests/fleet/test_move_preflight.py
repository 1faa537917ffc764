"""Preflight: a move that cannot finish fails before any state changes, naming the setting or grant;
subscriptions are sized to the target's free logical replication workers."""

from __future__ import annotations

import json

import pytest
from support.fleet import connect, load, run_cli
from support.moves import ids_on, load_rows

from shardctl.errors import OperationFailed
from shardctl.ops.move import move_shards


def _unchanged(topo) -> None:
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            assert conn.execute("SELECT DISTINCT state FROM shardctl.shards").fetchall() == [
                ("active",)
            ]
            assert conn.execute(
                "SELECT to_regclass('shardctl.moves') IS NULL OR "
                "NOT EXISTS (SELECT 1 FROM shardctl.moves)"
            ).fetchone()[0]


def test_role_without_replication_is_refused_before_any_change(fleet3):
    topo = load(fleet3)
    with connect(topo, "pg1", autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute("DROP ROLE IF EXISTS mover_norepl")
        conn.execute("CREATE ROLE mover_norepl LOGIN")
        conn.execute(f'GRANT CONNECT ON DATABASE "{db}" TO mover_norepl')
        conn.execute(
            "GRANT USAGE ON SCHEMA shardctl TO mover_norepl; "
            "GRANT SELECT ON ALL TABLES IN SCHEMA shardctl TO mover_norepl"
        )
    dsn = topo.host("pg1").dsn
    fleet3.write_text(fleet3.read_text().replace(dsn, dsn.replace("postgres@", "mover_norepl@")))
    try:
        r = run_cli("move-shard", "0-3", "--to", "pg2", config=fleet3)
        assert r.exit_code == 1, r
        assert (
            "preflight: host pg1: role mover_norepl lacks REPLICATION (ALTER ROLE mover_norepl REPLICATION)"
            in r.stderr
        )
        assert "pg_monitor" not in r.stderr and "pg_read_all_stats" not in r.stderr  # not needed
        assert (
            "lacks CREATE on the database" in r.stderr
            and "does not own 12 of the shards' tables" in r.stderr
        )
        assert (
            "(nothing was changed)" in r.stderr
            and len([ln for ln in r.stderr.splitlines() if ln.startswith("error")]) <= 1
        )
    finally:
        fleet3.write_text(fleet3.read_text().replace("mover_norepl@", "postgres@"))
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute("DROP OWNED BY mover_norepl; DROP ROLE mover_norepl")
    _unchanged(topo)


def test_subscriptions_sized_to_a_target_with_two_workers(private_sandbox):
    """A target with max_logical_replication_workers = 2 (stock is 4): one subscription with a table-sync
    worker to spare instead of four that would take every worker and stall; with none free it refuses."""
    box = private_sandbox(hosts=2, shards=16)
    path = box.topology_path
    assert run_cli("init", config=path).exit_code == 0
    topo = load(path)
    load_rows(topo, list(range(8)), 50)
    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_logical_replication_workers = 2")
    box.stop_host("pg2")
    box.start_host("pg2")
    moving = topo.host("pg1").shards[:4]
    before = ids_on(topo, "pg1", moving)
    r = run_cli("move-shard", f"{moving[0]}-{moving[-1]}", "--to", "pg2", "--json", config=path)
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert report["phase"] == "cut_over"
    assert sorted(ids_on(topo, "pg2", moving)) == sorted(before)
    with connect(topo, "pg2", autocommit=True) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.moves WHERE (detail->>'max_subscriptions')::int = 1"
            ).fetchone()[0]
            == 1
        )
        # Take the workers away: another subscription that holds them (disabled ones are not counted).
        conn.execute("ALTER SYSTEM SET max_logical_replication_workers = 1")
    box.stop_host("pg2")
    box.start_host("pg2")
    nxt = topo.host("pg1").shards[4:6]
    with pytest.raises(
        OperationFailed,
        match="max_logical_replication_workers=1 with 0 in use: a move needs 2 free",
    ):
        move_shards(load(path), nxt, "pg2")


# ---- the target's server must run every migration the moving shards have applied ----------------


@pytest.fixture
def pg16_target(make_fleet):
    """pg1 (a session server, PostgreSQL 18) with shards 0-15 and pg16 (a server of its own, PostgreSQL 16)
    with 16-31, initialised."""
    from support.fleet import sandbox_dir
    from support.versions import need

    from shardctl.dev.sandbox import Sandbox

    box = Sandbox(sandbox_dir("pg16"))
    try:
        box.up(hosts=1, shards=1, pg=need("16"))
        extra = f'  - name: pg16\n    dsn: "{box.state.hosts[0].dsn}"\n    shards: "16-31"\n'
        path = make_fleet(hosts=1, shards=32, ranges=["0-15"], extra=extra, init=True)
        yield path
    finally:
        box.destroy()


def _everything(topo) -> dict:
    from support.moves import snapshot

    out = {}
    for host in ("pg1", "pg16"):
        out[host] = snapshot(topo, host, topo.host(host).shards[:4])
        with connect(topo, host) as conn:
            out[host]["moves"] = conn.execute(
                "SELECT to_regclass('shardctl.moves') IS NOT NULL AND EXISTS "
                "(SELECT 1 FROM shardctl.moves)"
            ).fetchone()[0]
            out[host]["events"] = conn.execute("SELECT count(*) FROM shardctl.events").fetchone()[0]
            out[host]["slots"] = conn.execute(
                "SELECT count(*) FROM pg_replication_slots"
            ).fetchone()[0]
            out[host]["publications"] = conn.execute(
                "SELECT count(*) FROM pg_publication"
            ).fetchone()[0]
    return out


def test_a_migration_the_target_server_cannot_run_stops_the_move_before_any_change(pg16_target):
    """V3 builds an index CONCURRENTLY (no transaction: tried in its transactional form), V4 adds a virtual
    generated column (PostgreSQL 18 only). Moving shards at V4 to the PostgreSQL 16 host fails in
    preflight, in one line naming V4 and the server version, and changes nothing on either host."""
    path = pg16_target
    folder = path.parent / "migrations"
    (folder / "V0003__photos_created_idx.sql").write_text(
        "-- shardctl:no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS photos_created_idx ON {{ schema|ident }}.photos (created_at);\n"
    )
    (folder / "V0004__caption_length.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN caption_length int "
        "GENERATED ALWAYS AS (length(caption)) VIRTUAL;\n"
    )
    assert run_cli("migrate", "--hosts", "pg1", config=path).exit_code == 0
    topo = load(path)
    load_rows(topo, [0, 1, 2, 3], 10)
    before = _everything(topo)
    r = run_cli("move-shard", "0-3", "--to", "pg16", config=path)
    assert r.exit_code == 1, r
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "prepare:" not in r.stderr, r.stderr  # nothing ran
    assert "preflight: host pg16 runs PostgreSQL 16." in errors[0], errors[0]
    assert "cannot run migration V0004__caption_length.sql (rendered for shard 0)" in errors[0], (
        errors[0]
    )
    assert "V0003" not in errors[0] and "(nothing was changed)" in errors[0]
    assert _everything(load(path)) == before
    assert all(load(path).host_of(n).name == "pg1" for n in range(4))
    # Without V4 on the shards the same move passes the preflight (V3 runs there in its transactional form).
    (folder / "V0004__caption_length.sql").unlink()
    with connect(topo, "pg1", autocommit=True) as conn:  # take V4 back off shards 4-5 by hand
        conn.execute(
            "ALTER TABLE insta4.photos DROP COLUMN caption_length; "
            "DELETE FROM shardctl.migrations WHERE shard_id = 4 AND version = 4"
        )
    r = run_cli("move-shard", "4", "--to", "pg16", "prepare", "--json", config=path)
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["preflight_trial"] == {"shard": 4, "migrations": 3, "skipped": []}
    assert run_cli("move-shard", "4", "--abort", config=path).exit_code == 0


def test_prepare_accepts_a_ledger_written_before_checksums_left_out_fleet_values(fleet3):
    """Ledger rows holding the checksum of the rendered SQL (as older shardctl wrote them) match, as they do
    for migrate; the target copies them as they are."""
    from shardctl.sql.migrations import checksum, for_topology

    topo = load(fleet3)
    with connect(topo, "pg1", autocommit=True) as conn:
        for m in for_topology(topo):
            for n in range(4):
                conn.execute(
                    "UPDATE shardctl.migrations SET checksum = %s WHERE shard_id = %s AND version = %s",
                    (checksum(m.render(topo, n)), n, m.version),
                )
        old = conn.execute(
            "SELECT shard_id, version, checksum FROM shardctl.migrations WHERE shard_id < 4 "
            "ORDER BY 1, 2"
        ).fetchall()
    assert run_cli("migrate", "--check", config=fleet3).exit_code == 0
    r = run_cli("move-shard", "0-3", "--to", "pg2", "prepare", config=fleet3)
    assert r.exit_code == 0, r
    with connect(topo, "pg2") as conn:
        assert (
            conn.execute(
                "SELECT shard_id, version, checksum FROM shardctl.migrations WHERE shard_id < 4 "
                "ORDER BY 1, 2"
            ).fetchall()
            == old
        )
    assert run_cli("move-shard", "0-3", "--abort", config=fleet3).exit_code == 0
