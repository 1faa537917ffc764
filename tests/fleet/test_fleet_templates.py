"""shardctl.testing's initialised fleets: each a copy of one template that init built for its shape."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import psycopg
from support.fleet import connect, load, run_cli

from shardctl.dev.process import ram_backed_dir
from shardctl.testing import RAM_DIR_NEED_GB


def count_users(topo, host: str, shard: int) -> int:
    with connect(topo, host) as conn:
        return conn.execute(f"SELECT count(*) FROM insta{shard}.users").fetchone()[0]


def test_initialised_fleets_are_separate_copies_of_what_init_leaves(make_fleet, shardctl_fleet):
    first = make_fleet(hosts=2, shards=8, init=True)
    second = make_fleet(hosts=2, shards=8, init=True)
    a, b = load(first), load(second)
    assert {h.dsn for h in a.hosts}.isdisjoint(h.dsn for h in b.hosts)

    # What init leaves: a second init has nothing to do, and verify passes.
    again = run_cli("init", "--json", config=first)
    assert again.exit_code == 0, again
    assert [h["unchanged"] for h in json.loads(again.stdout)["hosts"]] == [4, 4]
    assert run_cli("verify", config=first).exit_code == 0

    # A write to one copy is in neither the other copy nor the next one made.
    with connect(a, "pg2", autocommit=True) as conn:
        conn.execute("INSERT INTO insta5.users (username) VALUES ('only-in-first')")
    third = load(make_fleet(hosts=2, shards=8, init=True))
    assert [count_users(t, "pg2", 5) for t in (a, b, third)] == [1, 0, 0]

    # The template behind them refuses connections (a connection would stop the next copy).
    server, _ = make_fleet.created[0]
    with psycopg.connect(server.dsn("postgres")) as conn:
        templates = conn.execute(
            "SELECT datname FROM pg_database WHERE NOT datallowconn AND datname LIKE 't\\_%'"
        ).fetchall()
    assert templates


def test_a_fleet_shape_of_its_own_gets_a_template_of_its_own(make_fleet, shardctl_fleet):
    plain = load(make_fleet(hosts=2, shards=4, init=True))
    before = len(shardctl_fleet.templates)
    other = make_fleet(hosts=2, shards=4)
    (other.parent / "migrations" / "V0003__note.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.users ADD COLUMN note text;\n"
    )
    other = make_fleet(hosts=2, shards=4, init=True, migrations=other.parent / "migrations")
    assert len(shardctl_fleet.templates) == before + 1
    with connect(load(other), "pg1") as conn:
        assert conn.execute(
            "SELECT max(version) FROM shardctl.migrations WHERE shard_id = 0"
        ).fetchone() == (3,)
    with connect(plain, "pg1") as conn:
        assert conn.execute(
            "SELECT max(version) FROM shardctl.migrations WHERE shard_id = 0"
        ).fetchone() == (2,)


def test_fleets_that_differ_only_in_their_pooler_keys_share_a_template(make_fleet, shardctl_fleet):
    """init never reads ``pooler:``: a direct fleet, a pooled one and one without the key are copies
    of one template (one init, not three), and each file keeps its own key."""
    direct = make_fleet(hosts=2, shards=4, init=True, pooler="none")
    before = len(shardctl_fleet.templates)
    pooled = make_fleet(hosts=2, shards=4, init=True, pooler="session")
    plain = make_fleet(hosts=2, shards=4, init=True)
    assert len(shardctl_fleet.templates) == before
    assert [h.pooler for h in load(direct).hosts] == ["none", "none"]
    assert [h.pooler for h in load(pooled).hosts] == ["session", "session"]
    assert "pooler" not in plain.read_text()
    for path in (direct, pooled, plain):
        assert run_cli("migrate", "--check", config=path).exit_code == 0
        assert run_cli("verify", config=path).exit_code == 0


def test_cleanup_drops_the_databases_and_what_a_failed_move_left_in_them(shardctl_fleet, tmp_path):
    maker = shardctl_fleet.maker(tmp_path, hosts=2, shards=4, routing=False)
    maker(init=True)
    (source, source_db), (target, target_db) = maker.created
    with psycopg.connect(source.dsn(source_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE public.leftover (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION leftover FOR TABLE public.leftover")
    with psycopg.connect(target.dsn(target_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE public.leftover (id int PRIMARY KEY)")
        conn.execute(
            f"CREATE SUBSCRIPTION leftover CONNECTION '{source.dsn(source_db)}' PUBLICATION leftover"
        )
    maker.cleanup()
    assert maker.created == []
    for server, db in ((source, source_db), (target, target_db)):
        with psycopg.connect(server.dsn("postgres")) as conn:
            assert (
                conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone()
                is None
            )
            assert (
                conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE slot_name = 'leftover'"
                ).fetchall()
                == []
            )
            assert conn.execute("SELECT subname FROM pg_subscription").fetchall() == []


def test_the_session_servers_keep_their_data_on_tmpfs_when_it_has_room(shardctl_fleet):
    """shardctl_data_dir = auto: the servers' data directories are under /dev/shm when it has room
    (dev.process.ram_backed_dir), else under the temporary directory."""
    expected = ram_backed_dir(RAM_DIR_NEED_GB) or tempfile.gettempdir()
    for server in shardctl_fleet.servers:
        with psycopg.connect(server.dsn("postgres")) as conn:
            data = Path(conn.execute("SHOW data_directory").fetchone()[0])
        assert data.is_relative_to(Path(expected).resolve()), (data, expected)
        assert data.is_relative_to(shardctl_fleet.workdir.resolve()), data
