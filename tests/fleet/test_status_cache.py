"""status keeps the shards' catalog fingerprints in the control schema while no DDL commits on the host
(issue #40: status had become 8x slower computing them on every run), and never shows a stale count."""

from __future__ import annotations

import json

import pytest
from support.fleet import connect, load, run_cli

from shardctl.sql import fingerprint
from shardctl.sql.catalog.control import REPEATABLE_READ


def distinct(path) -> int:
    result = run_cli("status", "--json", config=path)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)["distinct_schemas"]


def cached(topo, host: str) -> dict | None:
    with connect(topo, host, autocommit=True) as conn:
        row = conn.execute(
            "SELECT value FROM shardctl.meta WHERE key = 'status_fingerprints'"
        ).fetchone()
    return row[0] if row else None


@pytest.fixture
def fleet(make_fleet):
    return make_fleet(hosts=2, shards=8, init=True)  # pg1: 0-3, pg2: 4-7


def test_status_keeps_fingerprints_until_ddl_commits(fleet):
    topo = load(fleet)
    assert distinct(fleet) == 1
    first = cached(topo, "pg2")
    assert first is not None and list(first["prints"].values()) == ["4-7"], first
    assert distinct(fleet) == 1 and cached(topo, "pg2") == first  # read back, not recomputed

    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("ALTER TABLE insta5.photos ADD COLUMN hand_made int")
    assert distinct(fleet) == 2
    assert sorted(cached(topo, "pg2")["prints"].values()) == ["4,6-7", "5"]

    # DDL still uncommitted while status computes: not seen, and not taken for seen once it commits.
    with connect(topo, "pg2") as conn:
        conn.execute("ALTER TABLE insta6.photos ADD COLUMN also_hand_made int")
        assert distinct(fleet) == 2
        conn.commit()
    assert distinct(fleet) == 3

    # A rolled back change and DDL elsewhere in the database only cost a recomputation.
    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("CREATE TABLE public.not_a_shard (x int)")
    assert distinct(fleet) == 3


def test_without_the_watch_status_computes_every_time(fleet):
    """A host whose DDL is not watched (its control schema made by a role that may not create event
    triggers) keeps nothing, and still answers right."""
    topo = load(fleet)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("DROP EVENT TRIGGER shardctl_catalog_watch")
    assert distinct(fleet) == 1
    assert cached(topo, "pg1") is None and cached(topo, "pg2") is not None
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("ALTER TABLE insta1.photos ADD COLUMN hand_made int")
    assert distinct(fleet) == 2
    assert run_cli("init", config=fleet).exit_code == 0  # init puts the watch back
    with connect(topo, "pg1", autocommit=True) as conn:
        assert conn.execute(
            "SELECT evtenabled FROM pg_event_trigger WHERE evtname = 'shardctl_catalog_watch'"
        ).fetchone() == ("O",)


def test_verify_shares_the_kept_fingerprints_and_sees_new_ddl(fleet):
    """verify reads and keeps the same per-host fingerprints as status (one mechanism): a run with no
    DDL since reads them back (verify's own temporary function is not DDL that counts); DDL committed
    since is seen, and each shard that differs is named."""
    topo = load(fleet)
    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("DELETE FROM shardctl.meta WHERE key = 'status_fingerprints'")
    assert run_cli("verify", config=fleet).exit_code == 0
    first = cached(topo, "pg2")
    assert first is not None and list(first["prints"].values()) == ["4-7"], first
    assert distinct(fleet) == 1 and cached(topo, "pg2") == first  # status reads what verify kept

    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("ALTER TABLE insta5.photos ALTER COLUMN caption SET NOT NULL")
    with connect(topo, "pg2") as conn:  # a temporary object (not noted) beside a DROP (noted)
        conn.execute("CREATE TEMP TABLE scratch (x int)")
        conn.execute("DROP INDEX insta6.photos_user_id_idx")
        conn.commit()
    result = run_cli("verify", "--json", config=fleet)
    assert result.exit_code == 1, result
    wrong = {v["shard"] for v in json.loads(result.stdout)["violations"]}
    assert wrong == {5, 6}, result.stdout
    assert sorted(cached(topo, "pg2")["prints"].values()) == ["4,7", "5", "6"]


def test_verify_full_sees_ddl_the_watch_missed(fleet):
    """DDL run where the watch does not fire (``session_replication_role = replica``) leaves the kept
    fingerprints as they were; ``verify --full`` never reads them back, so it names the shard."""
    topo = load(fleet)
    assert run_cli("verify", config=fleet).exit_code == 0
    kept = cached(topo, "pg2")
    with connect(topo, "pg2", autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("ALTER TABLE insta5.photos ALTER COLUMN caption SET NOT NULL")
    assert cached(topo, "pg2") == kept  # the watch did not see it
    result = run_cli("verify", "--full", "--json", config=fleet)
    assert result.exit_code == 1, result
    assert {v["shard"] for v in json.loads(result.stdout)["violations"]} == {5}, result.stdout


def test_init_brings_an_older_watch_function_up_to_date(fleet):
    """A watch made by an older shardctl (noting every DDL, temporary objects too) is brought up to
    date by the next ``init``, so that verify's own temporary function stops emptying the cache."""
    topo = load(fleet)
    older = (
        "CREATE OR REPLACE FUNCTION shardctl.note_catalog_change() RETURNS event_trigger "
        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$ BEGIN "
        "INSERT INTO shardctl.catalog_changes DEFAULT VALUES ON CONFLICT DO NOTHING; END $$"
    )
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(older)
    assert run_cli("verify", config=fleet).exit_code == 0
    first = cached(topo, "pg1")
    assert run_cli("verify", config=fleet).exit_code == 0
    assert cached(topo, "pg1")["key"] != first["key"]  # the older function noted the sampling
    assert run_cli("init", config=fleet).exit_code == 0
    assert run_cli("verify", config=fleet).exit_code == 0
    first = cached(topo, "pg1")
    assert run_cli("verify", config=fleet).exit_code == 0
    assert cached(topo, "pg1") == first


def test_fingerprints_split_over_two_connections_read_one_snapshot(fleet, monkeypatch):
    """With a second connection, half of a host's fingerprints are computed on it, in the first
    connection's snapshot: a column committed after that snapshot is seen on neither half, and the
    digests are the ones a single connection computes."""
    monkeypatch.setattr(fingerprint, "SPLIT_FROM", 2)
    topo = load(fleet)
    schemas = [topo.schema_name(n) for n in range(4, 8)]  # pg2; the second connection: 6-7
    with connect(topo, "pg2", autocommit=True) as conn:
        alone = fingerprint.fingerprints(conn, schemas)
        conn.execute(REPEATABLE_READ)
        conn.execute("SELECT count(*) FROM pg_class").fetchone()  # the snapshot is taken
        with connect(topo, "pg2", autocommit=True) as other:
            other.execute("ALTER TABLE insta7.photos ADD COLUMN later int")
        split = fingerprint._split(
            conn, schemas, fingerprint.NEXT_ID, lambda: connect(topo, "pg2", autocommit=True)
        )
        conn.execute("COMMIT")
        after = fingerprint.fingerprints(conn, schemas)
    assert split == alone and len(set(split.values())) == 1
    assert after["insta7"] != alone["insta7"] and after["insta6"] == alone["insta6"]
