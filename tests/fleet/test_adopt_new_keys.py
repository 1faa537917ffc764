"""Keys at or above an adoption's ID floor (#39): a user made on the fleet after the cutover has a
``next_id()`` ID, which names its shard in its bits; the rows keyed by it live there (the copy's
row filters, ``adopt verify`` and the way back place them so). ``locate`` and the Router's
``shard_for(key=)`` must name that shard, not ``key % N``; keys below the floor keep ``key % N``.

Judged by where the shard's own ``next_id()`` put the user (its schema, read directly) and where a
row written through the Router is found by a direct query on each shard."""

from __future__ import annotations

import json
import time

import psycopg
from support.fleet import load, run_cli

from shardctl.ids.old_ids import id_floor
from shardctl.model.topology_file import write_adoption
from shardctl.router import Router

SHARDS = 8


def new_user(topo) -> tuple[int, int]:
    """(a user's ID minted by its shard's ``next_id()``, that shard) whose ``id % N`` is another
    shard (the case ``key % N`` gets wrong)."""
    for n in range(SHARDS):
        host = topo.host_of(n)
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            uid = conn.execute(
                f"INSERT INTO insta{n}.users (username) VALUES ('made on the fleet') RETURNING id"
            ).fetchone()[0]
        if uid % SHARDS != n:
            return uid, n
    raise AssertionError("every minted ID happened to be its own shard mod N")


def photo_shards(topo, photo: int) -> list[int]:
    """The shards whose ``photos`` hold ``photo``, each read directly."""
    found = []
    for n in range(SHARDS):
        with psycopg.connect(**topo.host_of(n).connect_kwargs(), autocommit=True) as conn:
            if conn.execute(f"SELECT 1 FROM insta{n}.photos WHERE id = %s", (photo,)).fetchone():
                found.append(n)
    return found


def test_a_key_at_or_above_the_id_floor_routes_by_its_bits(make_fleet):
    path = make_fleet(hosts=2, shards=SHARDS, init=True)
    topo = load(path)
    floor = id_floor(topo.layout, int(time.time() * 1000) - 60_000)  # a copy begun a minute ago
    write_adoption(
        path,
        authoritative="fleet",
        id_floor=floor,
        tables={"users": {"id": "id", "key": "id"}, "photos": {"id": "id", "key": "user_id"}},
        globals=[],
    )
    topo = load(path)
    uid, shard = new_user(topo)
    assert uid >= floor
    old = 13  # a pre-adoption user: below the floor, key % N
    for key, want in ((uid, shard), (old, old % SHARDS)):
        r = run_cli("locate", str(key), "--json", config=path)
        assert r.exit_code == 0, r
        doc = json.loads(r.stdout)
        assert (doc["shard"], doc["schema"], doc["host"]) == (
            want,
            topo.schema_name(want),
            topo.host_of(want).name,
        ), doc
    assert "bits" in json.loads(run_cli("locate", str(uid), "--json", config=path).stdout)["rule"]
    with Router(topo) as router:
        assert router.shard_for(uid) == router.shard_for(str(uid)) == shard
        assert router.schema_for(uid) == topo.schema_name(shard)
        assert router.shard_for(old) == old % SHARDS
        photo = router.execute(
            uid, "INSERT INTO photos (user_id) VALUES (%s) RETURNING id", (uid,)
        )[0][0]
        old_photo = router.execute(
            old, "INSERT INTO photos (user_id) VALUES (%s) RETURNING id", (old,)
        )[0][0]
    assert photo_shards(topo, photo) == [shard]
    assert photo_shards(topo, old_photo) == [old % SHARDS]
    # an adopted fleet's integer keys are bigint IDs: one beyond 64 bits is refused, exit 2
    r = run_cli("locate", str(1 << 70), config=path)
    assert r.exit_code == 2 and "does not fit in 64 bits" in r.stderr, r
