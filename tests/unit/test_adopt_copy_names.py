"""What ``adopt copy`` derives without a server: each host's shard ranges and row filter, the
names of its replication objects, and the plan's identity."""

from __future__ import annotations

from psycopg import sql

from shardctl.model.layouts import instagram
from shardctl.ops.adopt.copy import _ranges
from shardctl.ops.adopt.state import Phase, Run, copy_tag, plan_hash, run_tag, slot_name
from shardctl.sql.catalog.adopt_copy import key_shard, shard_filter


def test_ranges_join_consecutive_shards():
    assert _ranges([5, 0, 1, 2, 7, 8]) == [(0, 2), (5, 5), (7, 8)]
    assert _ranges([]) == []


def test_row_filter_names_the_key_and_every_range():
    layout = instagram(0)  # 41 time, 13 shard (shift 10, mask 8191), 10 sequence bits
    shard = key_shard("user_id", 64, layout, 1 << 40)
    # the Router's rule for an ID-valued key: a pre-adoption ID by its remainder, a next_id() ID
    # by its shard bits (Routing.shard_of_id; a fleet test compares the two on a server)
    expr = (
        '(CASE WHEN "user_id" >= 0 AND "user_id" < 1099511627776 THEN "user_id" % 64 '
        'ELSE (("user_id" >> 10) & 8191) END)'
    )
    assert shard.as_string(None) == expr
    text = shard_filter(shard, [(0, 31), (40, 40)]).as_string(None)
    assert text == f"({expr} BETWEEN 0 AND 31 OR {expr} BETWEEN 40 AND 40)"
    quoted = shard_filter(key_shard('we"ird', 4, layout, 9), [(1, 2)]).as_string(None)
    assert '"we""ird"' in quoted and isinstance(shard_filter(shard, [(0, 0)]), sql.Composed)


def test_slot_names_are_what_a_slot_may_be_called():
    assert slot_name("pg1") == "shardctl_adopt_pg1"
    assert slot_name("DB-East.2") == "shardctl_adopt_db_east_2"
    assert len(slot_name("h" * 200)) == 63


def test_a_runs_tag_makes_its_names_its_own_whatever_the_host_name():
    assert slot_name("pg1", "0a1b2c3d") == "shardctl_adopt_pg1_0a1b2c3d"
    assert slot_name("back_pg1", "0a1b2c3d") == "shardctl_adopt_back_pg1_0a1b2c3d"
    assert slot_name("pg1", "0a1b2c3d") != slot_name("pg1", "99aa88bb")
    # long host names: at most 63 bytes, the tag kept whole, and two hosts sharing a long prefix
    # (which plain truncation would merge) keep names of their own
    one, two = slot_name("h" * 100 + "1", "0a1b2c3d"), slot_name("h" * 100 + "2", "0a1b2c3d")
    assert len(one) == len(two) == 63 and one != two
    assert one.endswith("_0a1b2c3d") and two.endswith("_0a1b2c3d")
    # no tag (a run recorded before tags existed): the names such a run made
    assert slot_name("ids") == "shardctl_adopt_ids"
    assert slot_name("h" * 200) == ("shardctl_adopt_" + "h" * 200)[:63]


def test_copy_keeps_a_runs_tag_and_an_untagged_run_its_untagged_names():
    tagged = Run(Phase.COPYING, "p", None, detail={"tag": "0a1b2c3d"})
    assert copy_tag(tagged) == run_tag(tagged) == "0a1b2c3d"  # a re-run finds its objects
    assert run_tag(None) == "" and run_tag({"hosts": {}}) == ""
    for phase in (Phase.NEW, Phase.COPYING, Phase.SYNCED, Phase.CUT_OVER):
        # recorded before tags existed and still running: finished under the names it made
        assert copy_tag(Run(phase, "p", None, detail={"hosts": {}})) == ""
    for old in (None, Run(Phase.ABORTED, "p", None), Run(Phase.CLEANED, "p", None)):
        # a new run (its objects all gone, or none yet): a tag of its own, a new one each time
        one, two = copy_tag(old), copy_tag(old)
        assert len(one) == 8 and one != two
        assert slot_name("pg1", one) == f"shardctl_adopt_pg1_{one}"


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
