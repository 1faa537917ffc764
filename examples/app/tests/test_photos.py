"""The example app's tests: a real 2-host fleet from shardctl's pytest plugin, fresh per test."""

import photos
import psycopg
import pytest


def test_a_user_and_their_photos_live_on_one_shard(shardctl_router):
    alice = photos.create_user(shardctl_router, "alice")
    first = photos.add_photo(shardctl_router, alice, "sunset")
    second = photos.add_photo(shardctl_router, alice, "breakfast")
    shard = shardctl_router.shard_of_id(alice)
    assert shardctl_router.shard_of_id(first) == shardctl_router.shard_of_id(second) == shard
    assert photos.photos_of(shardctl_router, alice) == [(second, "breakfast"), (first, "sunset")]


def test_users_spread_over_every_host(shardctl_router, shardctl_topology):
    ids = [photos.create_user(shardctl_router, f"user{i}") for i in range(40)]
    counts = photos.users_per_shard(shardctl_router)
    assert sum(counts.values()) == 40
    hosts = {shardctl_topology.host_of(shardctl_router.shard_of_id(i)).name for i in ids}
    assert hosts == {h.name for h in shardctl_topology.hosts} and len(hosts) == 2
    # Each row really sits on the host its id names: ask that host's database directly.
    for user_id in ids[:5]:
        shard = shardctl_router.shard_of_id(user_id)
        host = shardctl_topology.host_of(shard)
        with psycopg.connect(**host.connect_kwargs()) as conn:
            schema = shardctl_topology.schema_name(shard)
            found = conn.execute(
                f'SELECT count(*) FROM "{schema}".users WHERE id = %s', (user_id,)
            ).fetchone()[0]
        assert found == 1


@pytest.mark.parametrize("attempt", [1, 2])
def test_every_test_starts_from_empty_shards(shardctl_router, attempt):
    # The same username twice would break the UNIQUE constraint if the databases were shared.
    assert photos.users_per_shard(shardctl_router) == {}
    photos.create_user(shardctl_router, "same-name")
    assert sum(photos.users_per_shard(shardctl_router).values()) == 1


def test_a_photo_of_an_unknown_user_is_refused(shardctl_router):
    bob = photos.create_user(shardctl_router, "bob")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        # An id minted on bob's shard that no user has.
        photos.add_photo(shardctl_router, bob + 1, "orphan")
