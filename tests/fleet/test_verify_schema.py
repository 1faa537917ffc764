"""verify's schema fingerprint on real servers: shards that drifted apart are named, with what differs."""

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


def catalog_snapshot(topo) -> dict:
    """What verify could have changed besides the ID sequences: every relation, constraint and function."""
    out = {}
    for host in topo.hosts:
        with admin(topo, host.name) as conn:
            out[host.name] = conn.execute(
                """SELECT (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_constraint),
                          (SELECT string_agg(md5(prosrc), ',' ORDER BY oid) FROM pg_proc),
                          (SELECT count(*) FROM shardctl.events)"""
            ).fetchone()
    return out


@pytest.fixture
def ready(make_fleet):
    """A 2-host, 16-shard fleet, initialised (pg1: 0-7, pg2: 8-15)."""
    path = make_fleet(hosts=2, shards=16, init=True)
    return path


def test_identical_shards_pass_and_count_one_schema(ready):
    clean = run_cli("verify", "--json", config=ready)
    assert clean.exit_code == 0, clean
    doc = json.loads(clean.stdout)
    assert doc["ok"] is True and doc["distinct_schemas"] == 1
    assert doc["schemas"][0]["count"] == 16 and doc["schemas"][0]["shards"] == "0-15"
    human = run_cli("verify", config=ready)
    assert human.exit_code == 0, human
    assert "Schemas: 16 of 16 shards are what the migration files define" in human.stdout, human
    status = run_cli("status", "--json", config=ready)
    assert status.exit_code == 0 and json.loads(status.stdout)["distinct_schemas"] == 1, status
    assert "1 distinct shard schema)" in run_cli("status", config=ready).stdout


def test_verify_names_an_added_column_and_a_dropped_index(ready):
    topo = load(ready)
    with admin(topo, "pg1") as conn:
        conn.execute("ALTER TABLE insta5.photos ADD COLUMN note text")
    with admin(topo, "pg2") as conn:
        conn.execute("DROP INDEX insta11.photos_user_id_idx")
    before = catalog_snapshot(topo)

    human = run_cli("verify", config=ready)
    assert human.exit_code == 1, human
    line = error_line(human)
    assert line == (
        "error: verify: 2 violation(s); first: pg1 shard 5: extra column note on photos "
        "(no migration makes it); the schema differs from the reference built from the migrations "
        "at V0002"
    ), line
    assert (
        "violation pg2 shard 11 (insta11): missing index photos_user_id_idx on photos "
        "(V0001__create_users_and_photos.sql should have made it); the schema differs"
        in human.stdout
    ), human
    assert "Schemas: 14 of 16 shards are what the migration files define" in human.stdout, human

    doc = json.loads(run_cli("verify", "--json", config=ready).stdout)
    assert doc["ok"] is False and doc["distinct_schemas"] == 3
    assert {(v["host"], v["shard"]) for v in doc["violations"]} == {("pg1", 5), ("pg2", 11)}
    by_shards = {g["shards"]: g for g in doc["schemas"]}
    assert by_shards["5"]["differences"] == ["extra column note on photos (no migration makes it)"]
    assert by_shards["11"]["differences"] == [
        "missing index photos_user_id_idx on photos (V0001__create_users_and_photos.sql should have made it)"
    ]
    assert [by_shards[k]["reference"] for k in ("5", "11")] == [False, False]
    assert by_shards["0-4,6-10,12-15"]["reference"] is True

    status = run_cli("status", config=ready)
    assert (
        status.exit_code == 0 and "3 distinct shard schemas: run shardctl verify)" in status.stdout
    ), status
    assert catalog_snapshot(topo) == before  # verify and status changed nothing


def test_only_the_biggest_groups_are_explained(ready, monkeypatch):
    from shardctl.ops import verify as verify_mod

    topo = load(ready)
    with admin(topo, "pg1") as conn:
        conn.execute("ALTER TABLE insta5.photos ADD COLUMN note text")
    with admin(topo, "pg2") as conn:
        conn.execute("DROP INDEX insta11.photos_user_id_idx")
    monkeypatch.setattr(verify_mod, "EXPLAINED_GROUPS", 1)
    report = verify_mod.verify(topo)
    reasons = {v.shard: v.reason for v in report.violations}
    assert set(reasons) == {5, 11}
    assert reasons[5].startswith("extra column note on photos (no migration makes it); the schema")
    assert reasons[11] == (
        "schema differs from the reference built from the migrations at V0002; 2 groups of shards "
        "differ, only the first 1 explained: compare it with `verify --hosts`"
    )


def test_verify_names_the_shards_a_do_block_skipped_not_the_good_ones(ready):
    """The "126 of 128" case on a fresh database: a DO block looks the constraint up by name in
    pg_constraint with no schema filter, so only the first shard of each host gets it. verify names
    every other shard as missing it (with the migration that should have made it), never the two that
    are right."""
    topo = load(ready)
    (ready.parent / "migrations" / "V0003__photos_caption_unique.sql").write_text(
        "DO $$\nBEGIN\n"
        "    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'photos_caption_user_uniq') THEN\n"
        "        ALTER TABLE {{ schema|ident }}.photos\n"
        "            ADD CONSTRAINT photos_caption_user_uniq UNIQUE (user_id, caption);\n"
        "    END IF;\nEND\n$$;\n"
    )
    migrated = run_cli("migrate", config=ready)
    # every shard ran V3 "successfully", but migrate's check after the work names the wrong ones
    assert migrated.exit_code == 1, migrated
    assert (
        "pg1: 7 shard(s) (1-7) do not have the schema the migrations define; first: shard 1: "
        "missing constraint photos_caption_user_uniq on photos (V0003__photos_caption_unique.sql "
        "should have made it)" in migrated.stderr
    ), migrated
    assert "pg2: 7 shard(s) (9-15)" in migrated.stderr, migrated

    have = set()
    for host in topo.hosts:
        with admin(topo, host.name) as conn:
            have |= {
                topo.shard_of_schema(r[0])
                for r in conn.execute(
                    "SELECT n.nspname FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace "
                    "WHERE k.conname = 'photos_caption_user_uniq'"
                ).fetchall()
            }
    assert have == {0, 8}, have  # the first shard of each host got it, the rest did not

    result = run_cli("verify", "--json", config=ready)
    assert result.exit_code == 1, result
    doc = json.loads(result.stdout)
    named = {v["shard"]: v["reason"] for v in doc["violations"]}
    assert set(named) == set(range(16)) - have, named
    for reason in named.values():
        assert reason == (
            "missing constraint photos_caption_user_uniq on photos (V0003__photos_caption_unique.sql "
            "should have made it); the schema differs from the reference built from the migrations "
            "at V0003"
        ), reason
    assert (
        "first: pg1 shard 1: missing constraint photos_caption_user_uniq on photos"
        in error_line(result)
    )
    good = [g for g in doc["schemas"] if g["reference"]]
    assert [(g["shards"], g["version"]) for g in good] == [("0,8", 3)], doc["schemas"]


def test_verify_shows_three_differences_and_full_shows_all(ready):
    topo = load(ready)
    with admin(topo, "pg2") as conn:
        conn.execute("""ALTER TABLE insta9.photos ADD COLUMN a int, ADD COLUMN b int, ADD COLUMN c int;
                        ALTER TABLE insta9.photos ALTER COLUMN caption SET NOT NULL;
                        CREATE TYPE insta9.mood AS ENUM ('happy', 'sad');
                        GRANT SELECT ON insta9.users TO PUBLIC""")
    short = run_cli("verify", config=ready)
    assert short.exit_code == 1, short
    line = error_line(short)
    assert (
        "first: pg2 shard 9: extra type mood (no migration makes it); extra column a on photos (no "
        "migration makes it); extra column b on photos (no migration makes it); and 3 more (verify "
        "--full lists them); the schema differs" in line
    ), line
    full = run_cli("verify", "--full", "--json", config=ready)
    assert full.exit_code == 1, full
    reason = json.loads(full.stdout)["violations"][0]["reason"]
    assert "column caption on photos differs: '#3 text not null" in reason, reason
    assert "extra column c on photos" in reason and "table users differs:" in reason, reason
    assert "=r/postgres" in reason, reason  # the grant to PUBLIC
    assert "more (verify --full" not in reason


def test_verify_with_a_shard_missing_an_enum_label(ready):
    topo = load(ready)
    (ready.parent / "migrations" / "V0003__mood.sql").write_text(
        "CREATE TYPE {{ schema|ident }}.mood AS ENUM ('happy', 'sad');\n"
    )
    assert run_cli("migrate", config=ready).exit_code == 0
    with admin(topo, "pg2") as conn:
        conn.execute("DROP TYPE insta14.mood; CREATE TYPE insta14.mood AS ENUM ('happy')")
    doc = json.loads(run_cli("verify", "--json", config=ready).stdout)
    assert [(v["shard"], v["reason"].split("; the schema")[0]) for v in doc["violations"]] == [
        (
            14,
            (
                "type mood differs: \"e owner postgres acl labels 'happy'\" "
                "(reference: \"e owner postgres acl labels 'happy', 'sad'\") (V0003__mood.sql "
                "defines it so)"
            ),
        )
    ]


def test_verify_names_an_index_built_differently(ready):
    topo = load(ready)
    with admin(topo, "pg1") as conn:  # same name, without the DESC on id
        conn.execute(
            "DROP INDEX insta3.photos_user_id_idx; CREATE INDEX photos_user_id_idx ON insta3.photos (user_id, id)"
        )
    doc = json.loads(run_cli("verify", "--json", config=ready).stdout)
    assert [(v["shard"], v["reason"].split("; the schema")[0]) for v in doc["violations"]] == [
        (
            3,
            (
                "index photos_user_id_idx on photos differs: 'btree (user_id int8_ops, id int8_ops)' "
                "(reference: 'btree (user_id int8_ops, id int8_ops option 3)') "
                "(V0001__create_users_and_photos.sql defines it so)"
            ),
        )
    ]
