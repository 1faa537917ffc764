"""Parallel streams per host (issue 16): init, add-shard and migrate with N connections per host."""

from __future__ import annotations

import json
import re

import psycopg
from support.fleet import load, run_cli

from shardctl.engine import connections as db
from shardctl.engine.fanout import host_jobs

V3 = """ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;
CREATE INDEX photos_location_idx ON {{ schema|ident }}.photos (location);
"""


def whole(dsn: str, latest: int) -> dict[int, int]:
    """shard → version; every recorded shard has a gap-free ledger and its schema, nothing else exists."""
    with psycopg.connect(dsn) as conn:
        versions = dict(
            conn.execute(
                """SELECT s.shard_id, coalesce(max(m.version), 0) FROM shardctl.shards s
               LEFT JOIN shardctl.migrations m USING (shard_id) GROUP BY 1"""
            ).fetchall()
        )
        gaps = conn.execute(
            "SELECT shard_id FROM shardctl.migrations GROUP BY 1 HAVING count(*) <> max(version)"
        )
        assert not gaps.fetchall()
        schemas = {
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname ~ '^insta[0-9]+$'"
            )
        }
        assert schemas == {f"insta{n}" for n in versions}
        if latest >= 3:
            with_column = {
                r[0]
                for r in conn.execute(
                    """SELECT n.nspname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.relname = 'photos' AND a.attname = 'location'"""
                )
            }
            assert with_column == {f"insta{n}" for n, v in versions.items() if v >= 3}
    return versions


def test_init_and_migrate_run_the_requested_streams(make_fleet):
    path = make_fleet(hosts=2, shards=512)
    out = run_cli("init", "--json", "--jobs", "3", "--batch-size", "8", config=path)
    assert out.exit_code == 0, out
    doc = json.loads(out.stdout)
    assert [(h["jobs"], h["jobs_rule"], h["created_count"]) for h in doc["hosts"]] == [
        (3, "--jobs", 256)
    ] * 2
    topo = load(path)
    for host in topo.hosts:
        assert len(whole(host.dsn, 2)) == 256
    (path.parent / "migrations" / "V0003__add_photo_location.sql").write_text(V3)
    out = run_cli("migrate", "--json", "--jobs", "2", config=path)
    assert out.exit_code == 0, out
    assert [h["jobs"] for h in json.loads(out.stdout)["hosts"]] == [2, 2]
    for host in topo.hosts:
        assert set(whole(host.dsn, 3).values()) == {3}
    assert run_cli("verify", config=path).exit_code == 0


def test_a_failure_in_one_stream_stops_the_others_and_leaves_every_shard_whole(make_fleet):
    path = make_fleet(hosts=1, shards=512)
    v2 = path.parent / "migrations" / "V0002__create_likes.sql"
    v2.write_text("{% if shard_id == 40 %}SELECT 1/0;{% endif %}\n" + v2.read_text())
    failed = run_cli("init", "--json", "--jobs", "2", "--batch-size", "4", config=path)
    assert failed.exit_code == 1, failed
    host = json.loads(failed.stdout)["hosts"][0]
    assert host["jobs"] == 2
    assert [f["shard"] for f in host["failed"]] == [40]
    # Both streams stopped: not everything was created, and what was is whole.
    assert 0 < host["created_count"] < 511 and host["not_started"]
    versions = whole(load(path).hosts[0].dsn, 2)
    assert (
        set(versions.values()) == {2}
        and 40 not in versions
        and len(versions) == host["created_count"]
    )
    v2.write_text(v2.read_text().replace("{% if shard_id == 40 %}SELECT 1/0;{% endif %}\n", ""))
    again = run_cli("init", "--json", "--jobs", "2", config=path)
    assert again.exit_code == 0, again
    assert len(whole(load(path).hosts[0].dsn, 2)) == 512
    assert run_cli("verify", config=path).exit_code == 0


def test_add_shard_in_parallel(make_fleet):
    path = make_fleet(hosts=2, shards=128, init=True)
    out = run_cli(
        "add-shard", "--host", "pg2", "--count", "256", "--jobs", "2", "--json", config=path
    )
    assert out.exit_code == 0, out
    assert load(path).shard_count == 384
    assert len(whole(load(path).host("pg2").dsn, 2)) == 64 + 256
    assert run_cli("verify", config=path).exit_code == 0


def test_max_jobs_and_connection_headroom_bound_the_streams(make_fleet):
    path = make_fleet(hosts=2, shards=256)
    text = path.read_text()
    first_dsn = re.search(r'(    dsn: "[^"]+"\n)', text).group(1)
    path.write_text(text.replace(first_dsn, first_dsn + "    max_jobs: 1\n", 1))
    topo = load(path)
    assert topo.hosts[0].max_jobs == 1 and topo.hosts[1].max_jobs is None
    out = run_cli("init", "--json", "--jobs", "4", config=path)
    assert out.exit_code == 0, out
    hosts = json.loads(out.stdout)["hosts"]
    assert (hosts[0]["jobs"], hosts[0]["jobs_rule"]) == (1, "hosts[].max_jobs")
    assert (hosts[1]["jobs"], hosts[1]["jobs_rule"]) == (
        2,
        "--jobs",
    )  # 128 shards: at most 2 streams of 64
    with db.connect(topo.hosts[1], autocommit=True) as conn:
        free = conn.execute("SELECT current_setting('max_connections')::int").fetchone()[0]
        chosen = host_jobs(topo.hosts[1], conn, requested=1000)
        assert chosen.rule == "connection headroom" and chosen.count < free // 2
        default = host_jobs(
            topo.hosts[1], conn
        )  # the sandbox role is a superuser: the server's cores
        assert default.rule == "server cores" and default.count >= 1


def test_max_jobs_must_be_a_positive_integer(make_fleet):
    path = make_fleet(hosts=1, shards=8)
    text = path.read_text()
    first_dsn = re.search(r'(    dsn: "[^"]+"\n)', text).group(1)
    path.write_text(text.replace(first_dsn, first_dsn + "    max_jobs: 0\n", 1))
    out = run_cli("info", config=path)
    assert (
        out.exit_code == 2 and "max_jobs must be a positive integer" in out.stdout + out.stderr
    ), out


def _sessions(dsn: str) -> int:
    """Sessions ever opened on the fleet's database (pg_stat_database.sessions, counted at disconnect)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        return conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]


def test_a_stream_keeps_its_connection_from_chunk_to_chunk(make_fleet):
    """512 shards in 2 streams go out in chunks of 64 (a few per stream): each stream applies all of its
    chunks on one connection (a new backend per chunk cost a connection and a cold catalog cache, and
    restarted the live batch size at its first, small size)."""
    path = make_fleet(hosts=1, shards=512)
    assert run_cli("init", "--jobs", "2", config=path).exit_code == 0
    (path.parent / "migrations" / "V0003__add_photo_location.sql").write_text(V3)
    dsn = load(path).hosts[0].dsn
    before = _sessions(dsn)
    out = run_cli("migrate", "--json", "--jobs", "2", config=path)
    assert out.exit_code == 0, out
    assert [h["jobs"] for h in json.loads(out.stdout)["hosts"]] == [2]
    assert set(whole(dsn, 3).values()) == {3}
    # The host's lock connection, two streams, whole()'s and the one that read the count above; one
    # connection per chunk would be 8 for the streams alone.
    assert _sessions(dsn) - before <= 5
