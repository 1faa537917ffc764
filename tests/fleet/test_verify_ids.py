"""Issue 15: verify checks what the layout promises, and nothing more.

The layout promises unique IDs, ordered across milliseconds. A sequence that passes a
multiple of 1024 inside one millisecond gives a smaller next ID in that millisecond: a
wrap, not a fault. verify passes on 100 healthy shards whose sequences sit just below such
a multiple, and still fails, naming the shard, on each fault it exists to catch: wrong
shard bits, a time far from the host clock, a sequence with CACHE > 1, a function that
differs from the template, and real duplicate IDs.
"""

from __future__ import annotations

import itertools
import json

import pytest
from support.fleet import connect, load, run_cli

from shardctl.sql.render import render_next_id


def admin(topo, host):
    return connect(topo, host, autocommit=True)


def park_sequences_below_a_wrap(topo, margin: int = 3) -> None:
    """setval every shard's sequence to a few below a multiple of 1024 (a different multiple per shard)."""
    for host in topo.hosts:
        with admin(topo, host.name) as conn:
            for n in host.shards:
                conn.execute(f"SELECT setval('insta{n}.next_id_seq', {(n + 5) * 1024 - margin})")


@pytest.fixture
def fleet100(make_fleet):
    return make_fleet(hosts=2, shards=100, init=True)


@pytest.fixture
def ready(make_fleet):
    """A 2-host, 16-shard fleet, initialised and verified clean (pg1: 0-7, pg2: 8-15)."""
    path = make_fleet(hosts=2, shards=16, init=True)
    assert run_cli("verify", config=path).exit_code == 0
    return path


def test_verify_passes_on_100_shards_whose_sequences_wrap_while_sampled(fleet100):
    topo = load(fleet100)
    for attempt in range(3):  # the false alarm used to fail 5 runs out of 6
        park_sequences_below_a_wrap(topo)
        result = run_cli("verify", "--json", config=fleet100)
        assert result.exit_code == 0, result
        doc = json.loads(result.stdout)
        assert doc["ok"] is True and doc["violations"] == []
        assert sum(h["shards_checked"] for h in doc["hosts"]) == 100
    # The samples did wrap: every sequence went past its multiple of 1024.
    with admin(topo, "pg1") as conn:
        last = conn.execute("SELECT last_value FROM insta0.next_id_seq").fetchone()[0]
    assert last > 5 * 1024


def test_a_parked_sequence_really_wraps_within_one_millisecond(fleet100):
    """The case above is the real one: 16 IDs in a row from a parked sequence include a smaller ID
    in the same millisecond (the old check called that a fault)."""
    topo = load(fleet100)
    shift = topo.layout.shift("time")
    for attempt in range(5):  # the wrap may, rarely, fall on a millisecond boundary
        park_sequences_below_a_wrap(topo)
        with admin(topo, "pg1") as conn:
            ids = conn.execute(
                "SELECT array_agg(insta0.next_id() ORDER BY g) FROM generate_series(1, 16) g"
            ).fetchone()[0]
        if any(b < a and b >> shift == a >> shift for a, b in itertools.pairwise(ids)):
            return
    raise AssertionError(f"no wrap within one millisecond in 5 tries: {ids}")


def verify_fails(path, shard: int, reason: str) -> list[str]:
    """verify exits 1, and every violation is shard ``shard``'s, one of them holding ``reason``."""
    result = run_cli("verify", "--json", config=path)
    assert result.exit_code == 1, result
    doc = json.loads(result.stdout)
    assert {v["shard"] for v in doc["violations"]} == {shard}, doc["violations"]
    reasons = [v["reason"] for v in doc["violations"]]
    assert any(reason in r for r in reasons), reasons
    human = run_cli("verify", config=path)
    assert human.exit_code == 1
    # The shard is named under the table, or (the first violation, said once) on the error line.
    assert f"shard {shard} (insta{shard})" in human.stdout or f" shard {shard}: " in human.stderr, (
        human
    )
    return reasons


def test_verify_catches_wrong_shard_bits(ready):
    topo = load(ready)
    # Shard 6's function, renamed into insta5: mints IDs with shard bits 6 from insta5.
    with admin(topo, "pg1") as conn:
        conn.execute(render_next_id(topo, 6).replace("insta6", "insta5"))
    verify_fails(ready, 5, "mints IDs for shard 6, not 5")


def test_verify_catches_a_time_far_from_the_host_clock(ready):
    topo = load(ready)
    epoch_ms = topo.layout.epoch_ms
    with admin(topo, "pg2") as conn:
        conn.execute(render_next_id(topo, 10).replace(str(epoch_ms), str(epoch_ms + 3_600_000)))
    verify_fails(ready, 10, "from the host clock")


def test_verify_catches_a_sequence_with_a_cache(ready):
    topo = load(ready)
    with admin(topo, "pg1") as conn:
        conn.execute("ALTER SEQUENCE insta3.next_id_seq CACHE 20")
    verify_fails(ready, 3, "ID sequence has CACHE 20, not 1")


def test_verify_catches_a_function_that_differs_from_the_template(ready):
    topo = load(ready)
    sql = render_next_id(topo, 12)
    changed = (
        sql.replace("BEGIN", "BEGIN\n    -- edited by hand", 1)
        if "BEGIN" in sql
        else sql.replace("SELECT", "SELECT /* edited by hand */", 1)
    )
    assert changed != sql
    with admin(topo, "pg2") as conn:
        conn.execute(changed)
    # It still mints correct IDs: only the comparison with the template catches it.
    assert verify_fails(ready, 12, "differs from the template") == [
        "next_id() differs from the template's rendering (changed by hand or stale)"
    ]


def test_verify_catches_real_duplicates(ready):
    topo = load(ready)
    # A sequence that cycles 1, 2, 1, 2: several IDs in one millisecond repeat.
    with admin(topo, "pg1") as conn:
        conn.execute("ALTER SEQUENCE insta4.next_id_seq MINVALUE 1 MAXVALUE 2 CYCLE RESTART WITH 1")
    reasons = verify_fails(ready, 4, "twice (a duplicate ID")
    assert all("not 4" not in r for r in reasons)
