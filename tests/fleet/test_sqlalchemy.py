"""shardctl.sqlalchemy (issue #25): the example app's sessions over a Router, directly and through
PgBouncer in transaction mode, checked row by row in the shard schemas; routing, refusals, connections
per host, and ORM clients during move-shard checked by the history checker."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import func, select, text, update  # noqa: E402

from conftest import load, run_cli  # noqa: E402
from shardctl.router import Router  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "examples" / "sqlalchemy_app"
MODES = ["direct", "transaction"]


def example():
    """The example app's modules (models, app), imported from examples/sqlalchemy_app."""
    if str(APP) not in sys.path:
        sys.path.insert(0, str(APP))
    return importlib.import_module("models"), importlib.import_module("app")


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def pooled_fleet(make_fleet, mode, request):
    def make(**kwargs):
        path = make_fleet(**kwargs, pooler="none" if mode == "direct" else None)
        if mode != "direct":
            request.getfixturevalue("pgbouncer").front(path, mode)
        result = run_cli("init", config=path)
        assert result.exit_code == 0, result
        return path
    return make


def rows_in(topo, table: str) -> dict[int, tuple[str, str, tuple]]:
    """Every row of ``table`` in every shard schema of every host, by id: (host, schema, row)."""
    out: dict[int, tuple[str, str, tuple]] = {}
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
            for shard in host.shards:
                schema = topo.schema_name(shard)
                for row in conn.execute(f'SELECT * FROM "{schema}".{table}'):
                    assert row[0] not in out, f"id {row[0]} twice: {out[row[0]][:2]} and {(host.name, schema)}"
                    out[row[0]] = (host.name, schema, row)
    return out


def test_example_app_rows_land_in_their_shards(pooled_fleet):
    """Users, photos and likes through the example's functions: every row is in the shard its key names
    (read back directly in the shard schema), and a get by ID finds every row from the ID alone."""
    models, app = example()
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)
    Session = app.make_sessions(str(path))
    users = [app.sign_up(Session, f"user{i}") for i in range(40)]
    photos = [app.post_photo(Session, u.id, f"photo of {u.username}") for u in users for _ in range(2)]
    likes = [app.like(Session, p.id, users[i % len(users)].id) for i, p in enumerate(photos[:30])]
    router = Router(topo)
    found = rows_in(topo, "users")
    assert len(found) == len(users)
    for u in users:
        host, schema, row = found[u.id]
        assert schema == topo.schema_name(router.shard_for(u.username)) and row[1] == u.username
        assert host == topo.host_of(topo.layout.decode(u.id)["shard"]).name
    found = rows_in(topo, "photos")
    assert len(found) == len(photos)
    for p in photos:
        host, schema, row = found[p.id]
        assert schema == topo.schema_name(p.user_id % topo.modulus) and row[1] == p.user_id
        assert topo.schema_name(topo.layout.decode(p.id)["shard"]) == schema
    found = rows_in(topo, "likes")
    for lk in likes:
        assert found[lk.id][1] == topo.schema_name(topo.layout.decode(lk.photo_id)["shard"])
    for p in photos:
        got = app.photo_by_id(Session, p.id)
        assert (got.id, got.user_id, got.caption) == (p.id, p.user_id, p.caption)
    for u in users[:5]:
        assert app.photo_by_id(Session, u.id) is None or False  # a user's ID is not a photo's
        with Session() as session:
            assert session.get(models.User, u.id).username == u.username
    assert app.like_count(Session, photos[0].id) == 1
    assert [p.id for p in app.photos_of(Session, users[3].id)] == sorted((p.id for p in photos[6:8]), reverse=True)
    assert app.user_count(Session) == len(users)
    router.close()
    Session.shards.router.close()
