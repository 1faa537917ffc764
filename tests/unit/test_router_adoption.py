"""The Router's routing on an adopted topology, without a server: every shard on the old database
in its schema while it is authoritative, the shard's own host and schema after the flip (read from the
file again), pre-adoption IDs by their table, and the global tables."""

from __future__ import annotations

import pytest

from shardctl.errors import BadInput
from shardctl.model.layouts import parse_epoch
from shardctl.model.topology import Topology
from shardctl.model.topology_file import flip_adoption
from shardctl.router import AsyncRouter, Router
from shardctl.router.placement import GLOBAL, IdLookup

TOPOLOGY = """\
version: 1
id: {layout: custom, bits: {time: 41, shard: 13, sequence: 9}, epoch: "2026-01-01T00:00:00Z"}
shards: {count: 8}
hosts:
  - {name: pg1, dsn: "postgresql://app@127.0.0.1:1/app1", shards: "0-3"}
  - {name: pg2, dsn: "postgresql://app@127.0.0.1:1/app2", shards: "4-7"}
routing: {key: user_id}
placement: {global_host: pg2}
adoption:
  source: {dsn: "postgresql://app@127.0.0.1:1/old"}
  schema: app
  authoritative: source
  id_floor: 1000000000
  tables: {users: {id: id, key: id}, posts: {id: id, key: user_id}, likes: {key: user_id}}
  globals: [plans]
  id_map: {host: pg1, dbname: app_ids}
"""


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "shardctl.yaml"
    p.write_text(TOPOLOGY)
    return p


def where(router, shard: int) -> tuple[str, str]:
    host = router._locate(shard)
    return host.name, router._call("statement", shard).schema


def test_every_shard_is_the_old_database_until_the_flip(path):
    router = Router(Topology.load(path))
    assert list(router.stats()) == ["pg1", "pg2", "source"]
    assert [where(router, n) for n in (0, 5)] == [("source", "app")] * 2
    assert where(router, GLOBAL) == ("source", "app")
    new = router.topology.layout.encode(unix_ms=parse_epoch("2026-11-27T00:00:00Z"), shard=6)
    assert router.target(id=new) == 6 and where(router, 6) == ("source", "app")
    assert flip_adoption(path, "fleet")  # seen by the next call: no reload() here
    assert [where(router, n) for n in (0, 5)] == [("pg1", "insta0"), ("pg2", "insta5")]
    assert where(router, GLOBAL) == ("pg2", "public")
    assert flip_adoption(path, "source")  # the abort: seen by the next call too
    assert where(router, 5) == ("source", "app")
    flip_adoption(path, "fleet")
    assert router.target(global_=True) == GLOBAL
    assert router._pools == {}  # routing alone connects nowhere


def test_old_ids_route_by_their_table(path):
    router = Router(Topology.load(path))
    assert router.target(id=42, table="users") == 42 % 8  # the root: its ID is its key
    # Looked up while the old database is authoritative too (there: the truth, no replication lag):
    # the call may run after the cutover's flip, where only the row's own shard finds it.
    found = router.route(id=42, table="posts")
    assert isinstance(found, IdLookup) and found.table.key == "user_id"
    with pytest.raises(BadInput, match="its shard is looked up"):
        router.target(id=42, table="posts")
    assert router.lookup_host().name == "source"
    with pytest.raises(
        BadInput, match=r"42 is a pre-adoption ID .* pass table= \(one of likes, posts, users\)"
    ):
        router.target(id=42)
    with pytest.raises(BadInput, match="table='comments' is not an adopted sharded table"):
        router.target(id=42, table="comments")
    with pytest.raises(BadInput, match="table likes has no single ID column"):
        router.target(id=42, table="likes")
    flip_adoption(path, "fleet")
    router.reload()
    found = router.route(id=42, table="posts")
    assert isinstance(found, IdLookup) and found.table.key == "user_id"  # the id map's work
    with pytest.raises(BadInput, match="its shard is looked up in the id map"):
        router.target(id=42, table="posts")
    assert router.target(id=42, table="users") == 2
    ids = router.id_map_host()
    assert ids.name == "pg1/app_ids" and "dbname=app_ids" in ids.dsn
    assert router.lookup_host() == ids  # the id map, once the fleet is authoritative
    with pytest.raises(BadInput, match=r"exactly one of key=, id= or shard= \(got id, global_\)"):
        router.target(id=42, global_=True)


def test_the_async_router_routes_the_same(path):
    router = AsyncRouter(Topology.load(path))
    assert where(router, 3) == ("source", "app")
    assert router.target(id=7, table="users") == 7


def test_a_file_edited_badly_keeps_the_last_good_routing(path, caplog):
    router = Router(Topology.load(path))
    path.write_text(TOPOLOGY.replace("authoritative: source", "authoritative: sideways"))
    assert where(router, 1) == ("source", "app")
    assert "topology file not reloaded" in caplog.text
