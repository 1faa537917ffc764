"""verify's set-based reads (issue 16): body shapes for every shard, IDs of every shard in one query."""

from __future__ import annotations

import json

import psycopg
from support.fleet import load, run_cli

from shardctl.ops.verify import verify
from shardctl.sql.render import render_next_id


def violations(path, *args: str) -> list[dict]:
    out = run_cli("verify", "--json", *args, config=path)
    assert out.exit_code == 1, out
    return json.loads(out.stdout)["violations"]


def test_a_body_edited_on_a_shard_outside_the_rendered_sample_is_caught(make_fleet):
    path = make_fleet(hosts=2, shards=64, init=True)
    topo = load(path)
    # Shard 6 is not among the shards whose body verify renders by default (0, 4, 9, ... on pg1); the
    # edit changes no ID, so only the body comparison can see it.
    edited = render_next_id(topo, 6).replace("BEGIN", "BEGIN\n    -- edited by hand", 1)
    with psycopg.connect(topo.host("pg1").dsn, autocommit=True) as conn:
        conn.execute(edited)
    for args in ((), ("--full",)):
        found = violations(path, *args)
        assert [(v["shard"], v["reason"]) for v in found] == [
            (6, "next_id() differs from the template's rendering (changed by hand or stale)")
        ], found
    report = verify(topo)
    assert [h.value.shards_checked for h in report.hosts] == [32, 32]


def test_a_body_with_another_shards_number_is_caught_by_its_shape(make_fleet):
    """The shape takes out the shard's own number only (as a whole number): a body that mints another
    shard's IDs (26, or 66, which holds 6's digits) has a shape of its own, found without rendering it."""
    path = make_fleet(hosts=2, shards=64, init=True)
    topo = load(path)
    with psycopg.connect(topo.host("pg1").dsn, autocommit=True) as conn:
        for shard, other in ((6, 26), (7, 77)):
            body = render_next_id(topo, shard)
            assert (
                f"({shard}::bigint" in body
            )  # the template's shard bits (a change here needs a new edit)
            conn.execute(body.replace(f"({shard}::bigint", f"({other}::bigint"))
    # id_shards=0: no IDs minted except for suspects, so the shapes alone must single out 6 and 7.
    report = verify(topo, id_shards=0)
    found = sorted({(v.shard, v.reason) for v in report.violations if "differs" in v.reason})
    assert found == [
        (6, "next_id() differs from the template's rendering (changed by hand or stale)"),
        (7, "next_id() differs from the template's rendering (changed by hand or stale)"),
    ], found


def test_a_failing_next_id_is_named_and_the_other_shards_are_still_checked(make_fleet):
    path = make_fleet(hosts=2, shards=64, init=True)
    topo = load(path)
    with psycopg.connect(topo.host("pg2").dsn, autocommit=True) as conn:
        conn.execute("DROP SEQUENCE insta40.next_id_seq CASCADE")
    found = violations(path)
    assert [v["shard"] for v in found] == [40, 40]
    assert (
        found[0]["reason"].startswith("next_id() fails: ") and "next_id_seq" in found[0]["reason"]
    ), found
    # ... and the schema fingerprint names the dropped sequence against the reference.
    assert found[1]["reason"] == (
        "missing sequence next_id_seq (the shard template should have made it); the schema differs "
        "from the reference built from the migrations at V0002"
    ), found
    report = verify(topo)
    assert [h.value.shards_checked for h in report.hosts] == [32, 31]
    assert sum(h.value.ids_checked for h in report.hosts) == 63 * 16


def test_verify_leaves_no_object_behind(make_fleet):
    path = make_fleet(hosts=1, shards=16, init=True)
    assert run_cli("verify", config=path).exit_code == 0
    with psycopg.connect(load(path).hosts[0].dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'shardctl_sample_ids'"
        ).fetchone()[0]
    assert left == 0  # the sampling function lived in verify's own session (pg_temp)
