"""shardctl.sqlalchemy's plain sessions (issue #41), sync and asyncio: each follows a move (the first
statement of a transaction runs again on the new owner, a later one raises ShardMoved and the next
session is routed right), savepoints (``begin_nested``) keep every write on the shard the code names,
and the Router's stats count the errors sessions meet. Rows are checked directly in the shard schemas."""

from __future__ import annotations

import asyncio

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import select, text
from support.fleet import load, stale_copy
from support.orm import example, rows_in, user_ids

from shardctl import AsyncRouter
from shardctl.errors import ShardMoved
from shardctl.ops.move import move_shards
from shardctl.router import Router
from shardctl.sqlalchemy import sessionmaker

MOVED = [1, 2, 3]  # pg1 → pg2 (pg1 0-3, pg2 4-7)
INSERT = text("INSERT INTO photos (user_id, caption) VALUES (:u, :c)")


def moved_fleet(make_fleet, router_class):
    """An 8-shard fleet with a photo on each of shards 0-3, and per scenario a Router on the topology
    file and one on a stale copy of it, all made before shards 1-3 move to pg2."""
    path = make_fleet(hosts=2, shards=8, init=True)
    topo = load(path)
    uid = dict(enumerate(user_ids(topo, range(8))))
    stale = stale_copy(path)
    routers = {
        (scenario, name): router_class(load(file), move_wait=5)
        for scenario in ("get", "flush", "later")
        for name, file in (("live", path), ("stale", stale))
    }
    with Router(topo) as setup, sessionmaker(setup, expire_on_commit=False)() as session:
        photos = [example()[0].Photo(user_id=uid[n], caption=f"before {n}") for n in range(4)]
        session.add_all(photos)
        session.commit()
    report = move_shards(load(path), MOVED, "pg2")
    assert report["phase"] == "cut_over", report
    return path, uid, [p.id for p in photos], routers


def assert_after_move(path, uid, routers) -> None:
    """Every Router routes the moved shard its sessions met to pg2 now, and counted the errors they met
    on pg1; every photo written after the move is on pg2, on its owner's shard."""
    met = {"get": 1, "flush": 2, "later": 3}
    for (scenario, _), router in routers.items():
        assert router._locate(met[scenario]).name == "pg2" and router._locate(0).name == "pg1"
        assert router.stats()["pg1"]["errors_total"] >= 1, router.stats()["pg1"]
    topo = load(path)
    found = rows_in(topo, "photos")
    after = sorted((host, schema, row[2]) for host, schema, row in found.values())
    assert [r for r in after if "after" in r[2]] == [
        ("pg2", "insta2", f"{name} after") for name in ("live", "stale")
    ]
    for host, schema, row in found.values():
        assert schema == topo.schema_name(topo.layout.shard_of(row[1])), row
        assert host == topo.host_of(topo.shard_of_schema(schema)).name, row


def test_plain_sessions_follow_a_move(make_fleet):
    """A plain session's first statement meets a moved shard (a get, a flush): it runs again on the new
    host, no error. A statement after another one in the transaction raises ShardMoved naming the new
    host, and the next session is routed right. For an app server whose topology file the move rewrote,
    and for one on a stale copy (the old host's redirect)."""
    Photo = example()[0].Photo
    path, uid, ids, routers = moved_fleet(make_fleet, Router)
    for name in ("live", "stale"):
        Session = sessionmaker(routers["get", name], expire_on_commit=False)
        with Session() as session:
            assert session.get(Photo, ids[1]).caption == "before 1"
        Session = sessionmaker(routers["flush", name], expire_on_commit=False)
        with Session() as session:
            session.add(Photo(user_id=uid[2], caption=f"{name} after"))
            session.commit()
        Session = sessionmaker(routers["later", name], expire_on_commit=False)
        with Session() as session:
            assert session.get(Photo, ids[0]).caption == "before 0"  # pg1: stays
            with pytest.raises(ShardMoved, match="shard 3 moved to host 'pg2'"):
                session.scalars(select(Photo).where(Photo.user_id == uid[3])).all()
            session.rollback()
        with Session() as session:
            got = session.scalars(select(Photo.caption).where(Photo.user_id == uid[3])).all()
            assert got == ["before 3"]
    assert_after_move(path, uid, routers)
    for router in routers.values():
        router.close()


def test_plain_async_sessions_follow_a_move(make_fleet):
    """test_plain_sessions_follow_a_move with AsyncSessions over AsyncRouters."""
    pytest.importorskip("greenlet")
    from shardctl.sqlalchemy.asyncio import async_sessionmaker

    Photo = example()[0].Photo
    path, uid, ids, routers = moved_fleet(make_fleet, AsyncRouter)

    async def scenarios():
        for name in ("live", "stale"):
            Session = async_sessionmaker(routers["get", name], expire_on_commit=False)
            async with Session() as session:
                assert (await session.get(Photo, ids[1])).caption == "before 1"
            Session = async_sessionmaker(routers["flush", name], expire_on_commit=False)
            async with Session() as session:
                session.add(Photo(user_id=uid[2], caption=f"{name} after"))
                await session.commit()
            Session = async_sessionmaker(routers["later", name], expire_on_commit=False)
            async with Session() as session:
                assert (await session.get(Photo, ids[0])).caption == "before 0"
                with pytest.raises(ShardMoved, match="shard 3 moved to host 'pg2'"):
                    await session.scalars(select(Photo).where(Photo.user_id == uid[3]))
                await session.rollback()
            async with Session() as session:
                query = select(Photo.caption).where(Photo.user_id == uid[3])
                assert (await session.scalars(query)).all() == ["before 3"]
        assert_after_move(path, uid, routers)
        for router in routers.values():
            await router.close()

    asyncio.run(scenarios())


def savepoints(session, Photo, a: int, b: int):
    """Savepoints over shards 2 and 5 of one host (``a``, ``b``: user IDs there), as a generator of the
    statements to run (sync: called; asyncio: awaited): what a savepoint's rollback undoes is gone,
    and each write lands on the shard it names, also after a rollback to a savepoint taken on another
    shard (the server's search_path goes back with it)."""
    session.add(Photo(user_id=a, caption="outer"))
    yield session.flush()
    nested = yield session.begin_nested()
    session.add(Photo(user_id=b, caption="kept"))
    yield session.flush()
    yield nested.commit()
    nested = yield session.begin_nested()
    session.add(Photo(user_id=a, caption="rolled back"))
    yield session.flush()
    yield nested.rollback()
    yield session.execute(INSERT.execution_options(shard=2), {"u": a, "c": "text on 2"})
    nested = yield session.begin_nested()
    yield session.execute(INSERT.execution_options(shard=5), {"u": b, "c": "text rolled back"})
    yield nested.rollback()
    yield session.execute(INSERT.execution_options(shard=5), {"u": b, "c": "text on 5"})
    yield session.commit()


SAVED = [("insta2", "outer"), ("insta2", "text on 2"), ("insta5", "kept"), ("insta5", "text on 5")]


def test_begin_nested_keeps_writes_on_their_shards(make_fleet):
    """session.begin_nested() (sync and asyncio): a savepoint is the host transaction's; what its
    rollback undoes is gone, and every write is on the shard it names (checked in the shard schemas)."""
    pytest.importorskip("greenlet")
    from shardctl.sqlalchemy.asyncio import async_sessionmaker

    Photo = example()[0].Photo
    path = make_fleet(hosts=1, shards=8, init=True)
    topo = load(path)
    a, b = user_ids(topo, [2, 5])
    with Router(topo) as router, sessionmaker(router)() as session:
        steps = savepoints(session, Photo, a, b)
        result = None
        while True:
            try:
                result = steps.send(result)
            except StopIteration:
                break
    found = sorted((schema, row[2]) for _, schema, row in rows_in(topo, "photos").values())
    assert found == SAVED

    async def in_asyncio():
        async with AsyncRouter(topo) as router, async_sessionmaker(router)() as session:
            steps = savepoints(session, Photo, a, b)
            result = None
            while True:
                try:
                    step = steps.send(result)
                except StopIteration:
                    break
                result = await step

    asyncio.run(in_asyncio())
    found = sorted((schema, row[2]) for _, schema, row in rows_in(topo, "photos").values())
    assert found == sorted(SAVED + SAVED)


def test_router_stats_count_the_errors_sessions_meet(make_fleet):
    """Router.stats() (and AsyncRouter's) counts each session transaction's error on the host it met it
    on, by kind: two failed statements on pg1, none on pg2."""
    pytest.importorskip("greenlet")
    from shardctl.sqlalchemy.asyncio import async_sessionmaker

    path = make_fleet(hosts=2, shards=8, init=True)
    boom, fine = text("SELECT 1 / 0"), text("SELECT 1")
    with Router(load(path)) as router:
        Session = sessionmaker(router)
        for n in (1, 2):
            with Session() as session, pytest.raises(sqlalchemy.exc.DataError):
                session.execute(boom.execution_options(shard=n))
        with Session() as session:
            session.execute(fine.execution_options(shard=6))
        stats = router.stats()

    async def in_asyncio():
        async with AsyncRouter(load(path)) as router:
            Session = async_sessionmaker(router)
            for n in (1, 2):
                async with Session() as session:
                    with pytest.raises(sqlalchemy.exc.DataError):
                        await session.execute(boom.execution_options(shard=n))
            async with Session() as session:
                await session.execute(fine.execution_options(shard=6))
            return router.stats()

    for got in (stats, asyncio.run(in_asyncio())):
        assert (got["pg1"]["errors"], got["pg1"]["errors_total"]) == ({"sql": 2}, 2), got
        assert got["pg2"]["errors_total"] == 0 and got["pg2"]["calls"] == 1, got
