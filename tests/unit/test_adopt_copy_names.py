"""What ``adopt copy`` derives without a server: each host's shard ranges and row filter, the
names of its replication objects, and the plan's identity."""

from __future__ import annotations

from psycopg import sql

from shardctl.ops.adopt.copy import _ranges
from shardctl.ops.adopt.state import plan_hash, slot_name
from shardctl.sql.catalog.adopt_copy import shard_filter


def test_ranges_join_consecutive_shards():
    assert _ranges([5, 0, 1, 2, 7, 8]) == [(0, 2), (5, 5), (7, 8)]
    assert _ranges([]) == []


def test_row_filter_names_the_key_and_every_range():
    text = shard_filter("user_id", 64, [(0, 31), (40, 40)]).as_string(None)
    assert text == '(("user_id" % 64) BETWEEN 0 AND 31 OR ("user_id" % 64) BETWEEN 40 AND 40)'
    quoted = shard_filter('we"ird', 4, [(1, 2)]).as_string(None)
    assert '"we""ird"' in quoted and isinstance(shard_filter("k", 4, [(0, 0)]), sql.Composed)


def test_slot_names_are_what_a_slot_may_be_called():
    assert slot_name("pg1") == "shardctl_adopt_pg1"
    assert slot_name("DB-East.2") == "shardctl_adopt_db_east_2"
    assert len(slot_name("h" * 200)) == 63


def test_plan_hash_ignores_what_does_not_place_a_table():
    doc = {
        "schema": "public",
        "root": "users",
        "shard_count": 4,
        "tables": [{"name": "users", "kind": "root", "key": "id", "id_column": "id"}],
        "queries": {"calls": 1},
    }
    same = {**doc, "queries": {"calls": 999}, "seconds": 3}
    moved = {**doc, "tables": [{**doc["tables"][0], "key": "org_id"}]}
    assert plan_hash(doc) == plan_hash(same) != plan_hash(moved)
