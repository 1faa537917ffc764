"""verify compares every shard with a reference built from the migration files in a scratch database,
never with the majority: shadowed migrations (0 of N right), lagging hosts, unprovable fleets."""

from __future__ import annotations

import json
import re

from support.fleet import connect, load, run_cli

from shardctl.ops import reference
from shardctl.ops.reference import REFERENCE_KEY
from shardctl.ops.verify import per_shard_functions
from shardctl.sql.host_migrations import host_for_topology
from shardctl.sql.migrations import for_topology

# A migration that tests for its constraint by name with no schema filter (the eight lines).
SHADOWED = """DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'photos_caption_user_uniq') THEN
        ALTER TABLE {{ schema|ident }}.photos
            ADD CONSTRAINT photos_caption_user_uniq UNIQUE (user_id, caption);
    END IF;
END
$$;
"""
ADD_COLUMN = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"


def scratch_databases(topo) -> set[str]:
    with connect(topo, "pg1", autocommit=True) as conn:
        return {
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'shardctl\\_ref\\_%'"
            )
        }


def forget_reference(topo) -> None:
    """Delete the reference earlier runs kept on every host (ops/reference.py, REFERENCE_KEY)."""
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            conn.execute("DELETE FROM shardctl.meta WHERE key = %s", (REFERENCE_KEY,))


def test_shadowed_migration_fails_verify_on_every_shard(make_fleet):
    """An app already in public holds a table with the constraint's name: every shard's DO block finds
    it and skips. The fleet is uniform (all 8 shards agree), but not what the migrations define."""
    path = make_fleet(hosts=2, shards=8)
    (path.parent / "migrations" / "V0003__photos_caption_unique.sql").write_text(SHADOWED)
    topo = load(path)
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE public.photos (user_id bigint, caption text, "
                "CONSTRAINT photos_caption_user_uniq UNIQUE (user_id, caption))"
            )
    before = scratch_databases(topo)
    init = run_cli("init", config=path)
    assert init.exit_code == 1, init  # its own check after the work names the shards
    assert (
        "pg1: 4 shard(s) (0-3) do not have the schema the migrations define; first: shard 0: "
        "missing constraint photos_caption_user_uniq on photos" in init.stderr
    ), init
    assert "pg2: 4 shard(s) (4-7)" in init.stderr, init
    result = run_cli("verify", "--full", "--json", config=path)
    assert result.exit_code == 1, result
    doc = json.loads(result.stdout)
    named = {v["shard"]: v["reason"] for v in doc["violations"]}
    assert set(named) == set(range(8)), named  # 0 of 8 right: every one is named
    assert set(named.values()) == {
        (
            "missing constraint photos_caption_user_uniq on photos (V0003__photos_caption_unique.sql "
            "should have made it); the schema differs from the reference built from the migrations "
            "at V0003"
        )
    }
    assert not any(g["reference"] for g in doc["schemas"]), doc["schemas"]
    assert scratch_databases(topo) == before  # the reference databases are gone again


def test_lagging_host_after_migrate_with_a_host_down_is_named_once(make_fleet):
    path = make_fleet(hosts=2, shards=16, init=True)
    (path.parent / "migrations" / "V0003__photos_location.sql").write_text(ADD_COLUMN)
    # the same fleet with pg2 unreachable (a closed port) while migrate runs
    down = path.with_name("down.yaml")
    text = path.read_text()
    pg2 = text.index("- name: pg2")
    down.write_text(
        text[:pg2]
        + re.sub(
            r"port=\d+|:\d+/", lambda m: "port=1" if "=" in m[0] else ":1/", text[pg2:], count=1
        )
    )
    assert run_cli("migrate", config=down).exit_code == 3
    # One truth (ops.health): the lagging host is one line, exit 4, as status and plan say it; the
    # level host's shards are still compared with the reference.
    lagging = (
        "verify: pg2: V0003__photos_location.sql pending on shards 8-15 while other shards are at "
        "V3 (run shardctl migrate)"
    )
    result = run_cli("verify", "--json", config=path)
    assert result.exit_code == 4, result
    assert f"error: {lagging}" in result.stderr, result
    doc = json.loads(result.stdout)
    assert doc["violations"] == [], doc["violations"]  # behind, not divergent
    assert {(g["shards"], g["version"], g["reference"]) for g in doc["schemas"]} == {
        ("0-7", 3, True)
    }
    human = run_cli("verify", config=path)
    assert human.exit_code == 4 and f"error: {lagging}" in human.stderr, human
    assert human.stderr.count("pending") == 1, human  # named once, not per shard
    assert run_cli("migrate", config=path).exit_code == 0
    assert run_cli("verify", config=path).exit_code == 0


def test_a_shard_behind_on_its_host_is_named_with_its_host(make_fleet):
    path = make_fleet(hosts=2, shards=8, init=True)
    (path.parent / "migrations" / "V0003__photos_location.sql").write_text(ADD_COLUMN)
    assert run_cli("migrate", "--shards", "0-2,4-7", config=path).exit_code == 0
    result = run_cli("verify", "--json", config=path)
    assert result.exit_code == 4, result
    assert (
        "error: verify: pg1: V0003__photos_location.sql pending on shards 3 while other shards "
        "are at V3 (run shardctl migrate)"
    ) in result.stderr, result
    assert json.loads(result.stdout)["violations"] == []


def test_verify_without_create_database_says_what_it_could_not_prove(make_fleet):
    path = make_fleet(hosts=1, shards=4, init=True)
    topo = load(path)
    with connect(topo, "pg1", autocommit=True) as conn:
        role = "verify_" + conn.info.dbname[-8:].lower()
        conn.execute(
            f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN NOCREATEDB; "
            f"GRANT pg_read_all_data, pg_write_all_data TO {role}"
        )
    try:
        limited = path.with_name("limited.yaml")
        limited.write_text(path.read_text().replace("://postgres@", f"://{role}@"))
        # A reference an earlier run built here (init's check) proves the schemas for this role too:
        kept = run_cli("verify", "--json", config=limited)
        assert kept.exit_code == 0 and not json.loads(kept.stdout)["violations"], kept
        # without it, this role cannot build one
        forget_reference(topo)
        result = run_cli("verify", "--json", config=limited)
        assert result.exit_code == 1, result
        reasons = [v["reason"] for v in json.loads(result.stdout)["violations"]]
        assert len(reasons) == 1, reasons
        line = reasons[0]
        assert line == (
            "schemas of 4 shard(s) (0-3) not proven to be what the migrations define: role "
            f"'{role}' may not CREATE DATABASE on pg1, so verify could not build the reference "
            "schema there (grant CREATEDB, or run verify as a role that has it)"
        ), line
    finally:
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_host_level_file_that_acts_on_the_cluster_does_not_stop_the_reference(make_fleet):
    """A role is the cluster's: the reference database finds it made already. The reference goes on
    (the shard migrations find the role), says which file failed there, and verify passes."""
    path = make_fleet(hosts=1, shards=4)
    role = "readers_" + path.parent.name[-8:].lower().replace("-", "_")
    (path.parent / "migrations" / "H0001__roles.sql").write_text(f"CREATE ROLE {role};\n")
    (path.parent / "migrations" / "V0003__grant.sql").write_text(
        f"GRANT SELECT ON {{{{ schema|ident }}}}.photos TO {role};\n"
    )
    topo = load(path)
    try:
        assert run_cli("init", config=path).exit_code == 0
        result = run_cli("verify", "--json", config=path)
        assert result.exit_code == 0, result
        (note,) = json.loads(result.stdout)["reference_notes"]
        assert note.startswith(
            f'host-level H0001__roles.sql failed in the reference database: role "{role}" already'
        ), note
    finally:
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_database_wide_default_privileges_are_the_environment_not_a_difference(make_fleet):
    """``ALTER DEFAULT PRIVILEGES`` without IN SCHEMA (a read-only role an adopted app already has)
    gives every new shard table its grant; the reference database gets the same defaults."""
    path = make_fleet(hosts=1, shards=4)
    topo = load(path)
    role = "ro_" + path.parent.name[-8:].lower().replace("-", "_")
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(
            f"CREATE ROLE {role}; ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO {role}; "
            f"ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC"
        )
    try:
        assert run_cli("init", config=path).exit_code == 0
        with connect(topo, "pg1", autocommit=True) as conn:
            acl = conn.execute(
                "SELECT relacl::text FROM pg_class WHERE oid = 'insta2.photos'::regclass"
            )
            assert role in acl.fetchone()[0]
        result = run_cli("verify", "--json", config=path)
        assert result.exit_code == 0, result
        assert json.loads(result.stdout)["reference_notes"] == []
    finally:
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute(
                f"ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC; "
                f"DROP OWNED BY {role}; DROP ROLE {role}"
            )


def test_a_scratch_database_a_killed_run_left_is_dropped(make_fleet):
    path = make_fleet(hosts=1, shards=4, init=True)
    topo = load(path)
    left = "shardctl_ref_1000_" + path.parent.name[-8:].lower().replace("-", "_")
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {left}")
    try:
        result = run_cli("verify", "--json", config=path)
        assert result.exit_code == 0, result
        # (another test's verify on the same servers may sweep it first: then its report says so)
        notes = json.loads(result.stdout)["reference_notes"]
        assert set(notes) <= {f"dropped {left}, a scratch database a killed run left behind"}, notes
        assert left not in scratch_databases(topo)
    finally:
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {left}")


def test_the_reference_is_kept_and_built_again_when_a_file_changes(make_fleet):
    """A complete reference is kept on the host that built it and read back while every input is the
    same (the same prints and objects as a fresh build); a new or edited migration builds a new one."""
    path = make_fleet(hosts=1, shards=4, init=True)
    topo = load(path)

    def build() -> reference.Reference:
        t = load(path)
        return reference.build(
            t, t.hosts[0], for_topology(t), host_for_topology(t), per_shard_functions(t)
        )

    forget_reference(topo)
    fresh, kept = build(), build()
    assert (fresh.cached, kept.cached) == (False, True)
    assert kept.prints == fresh.prints and kept.objects == fresh.objects and len(kept.prints) == 3

    v3 = path.parent / "migrations" / "V0003__photo_location.sql"
    v3.write_text(ADD_COLUMN)
    added = build()
    assert not added.cached and len(added.prints) == 4
    assert ("column", "photos", "location") in added.objects[3]
    v3.write_text(ADD_COLUMN.replace("location", "place"))
    edited = build()
    assert not edited.cached and ("column", "photos", "place") in edited.objects[3]
    assert ("column", "photos", "location") not in edited.objects[3]
    assert build().cached
