"""rebalance: the plan (offline) and --apply on real servers after add-host."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from support.fleet import connect, load, run_cli
from support.moves import ids_on, load_rows, replication_leftovers

from shardctl.model.topology import Topology
from shardctl.ops.rebalance import goals, plan, rebalance_plan


def topology(count: int, ranges: list[str | None]) -> Topology:
    lines = [
        "version: 1",
        "id:",
        "  layout: instagram",
        '  epoch: "2026-01-01T00:00:00Z"',
        "shards:",
        f"  count: {count}",
        "hosts:",
    ]
    for i, r in enumerate(ranges):
        lines += [
            f"  - name: pg{i + 1}",
            f'    dsn: "postgresql://app@db{i + 1}/app"',
            f'    shards: "{r}"' if r else "    shards: []",
        ]
    return Topology.from_text("\n".join(lines) + "\n")


def after(topo: Topology) -> dict[str, list[int]]:
    owned = {h.name: set(h.shards) for h in topo.hosts}
    for m in plan(topo):
        assert set(m.shards) <= owned[m.source]
        owned[m.source] -= set(m.shards)
        owned[m.target] |= set(m.shards)
    return {k: sorted(v) for k, v in owned.items()}


def test_plan_after_adding_a_host():
    topo = topology(32, ["0-15", "16-31", None])
    moves = [m.to_dict() for m in plan(topo)]
    assert moves == [
        {"source": "pg1", "target": "pg3", "shards": "11-15", "count": 5},
        {"source": "pg2", "target": "pg3", "shards": "27-31", "count": 5},
    ]
    assert goals(topo) == {"pg1": 11, "pg2": 11, "pg3": 10}
    report = rebalance_plan(topo)
    assert report.shards_to_move == 10
    assert [h.after for h in report.hosts] == [11, 11, 10]
    doc = report.to_dict()
    assert doc["shards_to_move"] == 10
    assert [h["after"] for h in doc["hosts"]] == [11, 11, 10]


def test_plan_balanced_moves_nothing():
    assert plan(topology(30, ["0-9", "10-19", "20-29"])) == []
    assert plan(topology(31, ["0-10", "11-20", "21-30"])) == []  # within one shard is balanced


def test_plan_several_new_hosts_and_remainders():
    topo = topology(30, ["0-9", "10-19", "20-29", None])
    assert goals(topo) == {"pg1": 8, "pg2": 8, "pg3": 7, "pg4": 7}
    assert [m.to_dict()["shards"] for m in plan(topo)] == ["8-9", "18-19", "27-29"]
    topo = topology(20, ["0-19", None, None])
    assert [(m.target, m.to_dict()["shards"]) for m in plan(topo)] == [
        ("pg2", "7-13"),
        ("pg3", "14-19"),
    ]


def test_plan_prefers_fewer_host_pairs():
    # 1024 over 3: pg3 holds 342 = 341 + 1 already, so only pg2 gives shards.
    topo = topology(1024, ["0-299", "300-681", "682-1023"])
    assert [m.to_dict() for m in plan(topo)] == [
        {"source": "pg2", "target": "pg1", "shards": "641-681", "count": 41}
    ]


@pytest.mark.parametrize("seed", range(20))
def test_plan_is_minimal_and_even(seed):
    rnd = random.Random(seed)
    hosts = rnd.randint(2, 6)
    count = rnd.randint(hosts, 200)
    cuts = sorted(rnd.sample(range(1, count), min(hosts - 1, count - 1)))
    bounds = [0] + cuts + [count]
    ranges = [f"{a}-{b - 1}" for a, b in itertools.pairwise(bounds)]
    ranges += [None] * (hosts - len(ranges))
    topo = topology(count, ranges)
    final = after(topo)
    sizes = [len(v) for v in final.values()]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(n for v in final.values() for n in v) == list(range(count))
    # Fewest moves: exactly the shards above each host's even share move, and no shard moves twice.
    base = count // len(topo.hosts)
    surplus_floor = sum(max(0, len(h.shards) - (base + 1)) for h in topo.hosts)
    moved = [n for m in plan(topo) for n in m.shards]
    assert len(moved) == len(set(moved))
    assert (
        surplus_floor
        <= len(moved)
        == sum(max(0, len(h.shards) - goals(topo)[h.name]) for h in topo.hosts)
    )
    assert len(moved) == sum(max(0, goals(topo)[h.name] - len(h.shards)) for h in topo.hosts)


def test_plan_cli_offline(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(
        "version: 1\n"
        "id:\n"
        "  layout: instagram\n"
        '  epoch: "2026-01-01T00:00:00Z"\n'
        "shards:\n"
        "  count: 12\n"
        "hosts:\n"
        "  - name: a\n"
        '    dsn: "postgresql://x@127.0.0.1:1/none"\n'
        '    shards: "0-11"\n'
        "  - name: b\n"
        '    dsn: "postgresql://x@127.0.0.1:1/none_b"\n'
        "    shards: []\n"
    )
    r = run_cli("rebalance", "--plan", "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert doc["moves"] == [{"source": "a", "target": "b", "shards": "6-11", "count": 6}]
    r = run_cli("rebalance", config=path)
    assert r.exit_code == 0 and "shardctl rebalance --apply" in r.stdout
    assert run_cli("rebalance", "--plan", "--apply", config=path).exit_code == 2
    assert run_cli("rebalance", "--cleanup", config=path).exit_code == 2


def test_apply_after_add_host(make_fleet):
    path = make_fleet(hosts=2, shards=24, init=True)  # pg1 0-11, pg2 12-23
    topo = load(path)
    load_rows(topo, list(range(24)), 40)
    before = {n: sorted(ids_on(topo, topo.host_of(n).name, [n])) for n in range(24)}
    r = run_cli("add-host", "pg3", "--dsn", make_fleet.new_database(2), config=path)
    assert r.exit_code == 0, r
    r = run_cli("rebalance", "--plan", "--json", config=path)
    assert [m["shards"] for m in json.loads(r.stdout)["moves"]] == ["8-11", "20-23"]
    r = run_cli("rebalance", "--apply", "--cleanup", "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    assert [res["phase"] for res in doc["results"]] == ["cut_over", "cut_over"]
    assert [res["cleanup"]["phase"] for res in doc["results"]] == ["cleaned", "cleaned"]
    print(
        f"\nrebalance: freezes {[res['freeze_seconds'] for res in doc['results']]}s, {doc['seconds']:.1f}s in all"
    )
    topo = load(path)
    assert [len(h.shards) for h in topo.hosts] == [8, 8, 8]
    assert topo.host("pg3").shards == [8, 9, 10, 11, 20, 21, 22, 23]
    for n in range(24):
        assert sorted(ids_on(topo, topo.host_of(n).name, [n])) == before[n]
    assert replication_leftovers(topo) == {}
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'insta%%'"
            ).fetchone()[0]
            == 8
        )
    assert run_cli("verify", config=path).exit_code == 0
    assert run_cli("migrate", "--check", config=path).exit_code == 0
    r = run_cli("rebalance", "--apply", config=path)
    assert r.exit_code == 0 and "nothing to move" in r.stdout.lower()


# ---- by size -------------------------------------------------------------------------------------


def test_plan_by_size_moves_big_shards_and_respects_pins_and_min_improvement():
    from shardctl.ops.rebalance import plan_by_size

    topo = topology(20, ["0-9", "10-19"])  # pg1 holds 10 huge shards, pg2 10 empty ones: same count
    assert plan(topo) == []
    mb = 1 << 20
    sizes = {n: (100 * mb if n < 10 else 0) for n in range(20)}
    moves = plan_by_size(topo, sizes)
    assert [(m.source, m.target) for m in moves] == [("pg1", "pg2")]
    moved = moves[0].shards
    assert len(moved) == 5  # 500 MB each side afterwards
    kept = plan_by_size(topo, sizes, pinned=set(range(8)))
    assert set(kept[0].shards) == {8, 9}  # only the unpinned ones may go
    assert plan_by_size(topo, sizes, min_improvement=2.0) == []  # no move narrows the spread enough
    even = {n: 10 * mb for n in range(20)}
    assert plan_by_size(topo, even) == []


def test_rebalance_by_size_applies(make_fleet):
    path = make_fleet(hosts=2, shards=16, init=True)  # pg1 0-7, pg2 8-15
    topo = load(path)
    load_rows(topo, list(range(8)), 20000)
    text = path.read_text()
    path.write_text(text + 'placement:\n  pinned: "0-3"\n')
    offline = json.loads(run_cli("rebalance", "--json", config=path).stdout)
    assert offline["moves"] == []  # by count it is balanced
    planned = json.loads(run_cli("rebalance", "--by", "size", "--json", config=path).stdout)
    assert planned["moves"] and all(m["source"] == "pg1" for m in planned["moves"])
    moving = [
        n
        for m in planned["moves"]
        for n in range(16)
        if str(n) in m["shards"].replace("-", ",").split(",")
    ]
    assert not set(moving) & {0, 1, 2, 3}
    before = ids_on(topo, "pg1", list(range(8)))
    r = run_cli("rebalance", "--by", "size", "--apply", "--json", config=path)
    assert r.exit_code == 0, r
    after = load(path)
    assert all(after.host_of(n).name == "pg1" for n in range(4))
    assert any(after.host_of(n).name == "pg2" for n in range(4, 8))
    on = {
        h: ids_on(after, h, [n for n in range(8) if after.host_of(n).name == h])
        for h in ("pg1", "pg2")
    }
    assert sorted(on["pg1"] + on["pg2"]) == sorted(before)
    assert replication_leftovers(topo) == {}
