"""shardctl.sqlalchemy's asyncio sessions (issue #25 item 5) over an AsyncRouter, directly and through
PgBouncer in transaction mode: every row checked in its key's shard, a get by ID from the ID alone, one
connection per host for a session touching all 64 shards, routing and refusals, a retry after a move.

Each test drives its coroutines with ``asyncio.run`` (no pytest plugin), as test_router_async.py does.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("greenlet")
from sqlalchemy import func, select, text, update
from support.fleet import load, run_cli, stale_copy
from support.history import History, now
from support.orm import (
    add_filter_migration,
    example,
    migrated_under_traffic,
    moved_under_traffic,
    rows_in,
    user_ids,
)
from support.web import SUPPORT, WebTraffic, served

from shardctl import AsyncRouter
from shardctl.ops.move import move_shards
from shardctl.sqlalchemy import UnroutableStatement
from shardctl.sqlalchemy.asyncio import async_sessionmaker

MODES = ["direct", "transaction"]
FASTAPI_APP = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def routers(topo, **kwargs) -> tuple[AsyncRouter, object]:
    router = AsyncRouter(topo, **kwargs)
    return router, async_sessionmaker(router, expire_on_commit=False)


def test_async_sessions_place_get_and_route(pooled_fleet, mode):
    """Users, photos and likes added through async sessions land in the shard of their key (read back
    directly in the shard schemas); ``await session.get`` finds each from its ID alone; == and IN on the
    key or the ID route queries; fan-out only with ``all_shards``; unroutable statements raise."""
    models, _ = example()
    User, Photo, Like = models.User, models.Photo, models.Like
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)

    async def main():
        router, Session = routers(topo)
        async with Session() as session:
            users = [User(username=f"user{i}") for i in range(30)]
            session.add_all(users)
            await session.commit()
            photos = [Photo(user_id=u.id, caption=f"by {u.username}") for u in users]
            session.add_all(photos)
            await session.commit()
            likes = [Like(photo_id=p.id, user_id=users[0].id) for p in photos[:10]]
            session.add_all(likes)
            await session.commit()
        async with Session() as session:
            for obj in users + photos + likes:
                got = await session.get(type(obj), obj.id)
                assert got is not None and got.id == obj.id, obj
            assert await session.get(Photo, users[0].id) is None  # a user's ID names no photo
            ids = [p.id for p in photos[:6]]
            got = (await session.scalars(select(Photo).where(Photo.id.in_(ids)))).all()
            assert sorted(p.id for p in got) == sorted(ids)
            got = (
                await session.scalars(
                    select(Photo).where(Photo.user_id.in_([users[1].id, users[2].id]))
                )
            ).all()
            assert sorted(p.user_id for p in got) == sorted([users[1].id, users[2].id])
            count = select(func.count()).select_from(Like).where(Like.photo_id == photos[0].id)
            assert await session.scalar(count) == 1
            counts = await session.execute(
                select(func.count()).select_from(User).execution_options(all_shards=True)
            )
            assert sum(n for (n,) in counts) == len(users)
            result = await session.execute(
                update(Photo).where(Photo.user_id == users[3].id).values(caption="edited")
            )
            assert result.rowcount == 1
            shard = router.shard_of_id(photos[3].id)
            conn = await session.connection(bind_arguments={"shard": shard})
            assert (await conn.exec_driver_sql("SELECT current_schema()")).scalar() == (
                topo.schema_name(shard)
            )
            assert (
                await session.scalar(
                    text("SELECT caption FROM photos WHERE id = :id").execution_options(
                        shard=shard
                    ),
                    {"id": photos[3].id},
                )
                == "edited"
            )
            for bad in (select(Photo), select(Photo).where(Photo.caption == "x"), text("SELECT 1")):
                with pytest.raises(UnroutableStatement, match="no shard"):
                    await session.execute(bad)
            await session.rollback()
            with pytest.raises(UnroutableStatement, match="set its shard key"):
                session.add(User())
                await session.flush()
        await router.close()
        return users, photos, likes

    users, photos, likes = asyncio.run(main())
    assert_in_their_shards(
        topo,
        [(u.id, u.username) for u in users],
        [(p.id, p.user_id) for p in photos],
        [(lk.id, lk.photo_id) for lk in likes],
    )


def assert_in_their_shards(topo, users, photos, likes) -> None:
    """Every row (id, its key) read back directly in the shard schemas: each in its key's shard (a user
    by its username, a photo with its owner: the shard inside user_id, a like with its photo), and each
    ID naming that shard."""
    router = AsyncRouter(topo)
    for table, rows, shard_of_key in (
        ("users", users, router.shard_for),
        ("photos", photos, router.shard_of_id),
        ("likes", likes, router.shard_of_id),
    ):
        found = rows_in(topo, table)
        assert len(found) == len(rows), table
        for ident, key in rows:
            host, schema, row = found[ident]
            assert row[1] == key, (table, row)
            assert schema == topo.schema_name(shard_of_key(key)), (table, row, schema)
            assert schema == topo.schema_name(router.shard_of_id(ident)), (table, row, schema)
            assert host == router._locate(router.shard_of_id(ident)).name, (table, row, host)


@pytest.mark.parametrize(
    "mode", ["direct", pytest.param("transaction", marks=pytest.mark.slow)], indirect=True
)
def test_fastapi_example_app(pooled_fleet, mode):
    """examples/fastapi_app served by uvicorn, as a user runs it (``SHARDCTL_CONFIG``): sign-ups, photos
    and likes land in their key's shard (a photo on its owner's, a like with its photo), each user and
    photo is got by its ID alone, a user's photos by the key, the user count over every shard."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)
    with served(path) as url, httpx.Client(base_url=url, timeout=60) as client:

        def call(method, url, **kwargs):
            response = client.request(method, url, **kwargs)
            assert response.status_code == 200, (url, response.text)
            return response.json()

        users = [call("POST", "/users", json={"username": f"user{i}"}) for i in range(20)]
        photos = [
            call("POST", f"/users/{u['id']}/photos", json={"caption": f"{n} by {u['id']}"})
            for u in users
            for n in range(2)
        ]
        likes = [
            call("POST", f"/photos/{p['id']}/likes", json={"user_id": users[0]["id"]})
            for p in photos[:10]
        ]
        assert [lk["likes"] for lk in likes] == [1] * 10
        for u in users:
            assert call("GET", f"/users/{u['id']}") == u
        for p in photos:
            assert call("GET", f"/photos/{p['id']}") == p
        assert client.get(f"/photos/{users[0]['id']}").status_code == 404
        mine = call("GET", f"/users/{users[3]['id']}/photos")
        assert mine == sorted(photos[6:8], key=lambda p: p["id"], reverse=True)
        assert call("GET", "/stats") == {"users": 20}
    assert_in_their_shards(
        topo,
        [(u["id"], u["username"]) for u in users],
        [(p["id"], p["user_id"]) for p in photos],
        [(lk["id"], p["id"]) for lk, p in zip(likes, photos)],
    )


@pytest.mark.parametrize(
    "mode", [pytest.param("direct", marks=pytest.mark.slow), "transaction"], indirect=True
)
def test_fastapi_apps_during_move(pooled_fleet, mode, request):
    """Two uvicorn processes of the FastAPI example, one on the topology file and one on a stale copy that
    is never updated, serve writers and readers while 4 shards move pg1 → pg2, directly and through
    PgBouncer in transaction mode (the apps on PgBouncer's DSNs, the move on the direct ones). The
    history checker finds no lost, doubled or misplaced photo, no read answered by another shard or
    missing an acknowledged photo, and no error (no HTTP 500: every request begins its transaction,
    whose first statement follows the move); afterwards both apps find every photo by its ID."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    path = pooled_fleet(hosts=2, shards=16)  # pg1 0-7, pg2 8-15
    moved = [4, 5, 6, 7]
    history = History(path, key_is_id=True)
    keys = user_ids(load(path), moved + [0, 9], 3)
    probe = ("fastapi_probe:app", SUPPORT)
    pooler = request.getfixturevalue("pgbouncer") if mode != "direct" else None
    with served(path, *probe) as live, served(stale_copy(path), *probe) as stale:
        apps = {"live": live, "stale": stale}
        before = pooler.transactions(path) if pooler else 0
        with WebTraffic(history, apps, keys, writers=2, readers=1):
            report = move_shards(load(path), moved, "pg2")
        if pooler:  # the apps' transactions went through PgBouncer: at least one per write
            served_count = pooler.transactions(path) - before
            assert served_count >= len(history.writes), (served_count, len(history.writes))
        for url in apps.values():
            with httpx.Client(base_url=url, timeout=60) as client:
                for w in history.writes:
                    got = client.get(f"/photos/{w.id}")
                    assert got.status_code == 200, (url, w, got.text)
                    assert got.json()["user_id"] == w.key, (url, w, got.json())
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    checked = history.check()
    print(checked)
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked
    assert {w.key for w in history.writes} == set(keys), "every key was written"
    topo = load(path)
    moved_rows = [r for r in rows_in(topo, "photos").values() if r[1] in {"insta4", "insta7"}]
    assert moved_rows and {host for host, _, _ in moved_rows} == {"pg2"}, moved_rows


def test_an_async_session_on_all_64_shards_holds_one_connection_per_host(pooled_fleet, mode):
    """One async session transaction writes to and reads from all 64 shards of 2 hosts: the AsyncRouter
    lends it one connection per host (stats(), and directly pg_stat_activity), all given back at its end,
    and later sessions reuse them without reconnecting."""
    models, _ = example()
    Photo = models.Photo
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)
    uid = user_ids(topo, list(range(64)))

    async def main():
        router, Session = routers(topo, max_size=8)
        seen = []
        async with Session() as session:
            photos = [Photo(user_id=uid[n], caption=f"shard {n}") for n in range(64)]
            session.add_all(photos)
            await session.flush()
            for p in photos:
                caption = select(Photo.caption).where(Photo.user_id == p.user_id)
                assert (await session.scalars(caption)).all() == [p.caption]
            everything = select(Photo).execution_options(all_shards=True)
            assert len((await session.scalars(everything)).all()) == 64
            seen += [(name, s["in_use"], s["size"]) for name, s in router.stats().items()]
            if mode == "direct":
                for host in topo.hosts:
                    with psycopg.connect(**host.connect_kwargs(purpose="admin")) as conn:
                        n = conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND application_name LIKE 'shardctl%router'"
                        ).fetchone()[0]
                        seen.append((host.name, n))
            await session.commit()
        assert [s for s in seen if len(s) == 3] == [("pg1", 1, 1), ("pg2", 1, 1)], seen
        assert all(n <= 1 for _, n in (s for s in seen if len(s) == 2)), seen
        stats = router.stats()
        assert all(s["in_use"] == 0 for s in stats.values()), stats
        connects = {name: s["connects"] for name, s in stats.items()}
        for n in range(16):
            async with Session() as session:
                assert (await session.get(Photo, photos[n].id)).caption == f"shard {n}"
                session.add(Photo(user_id=uid[n], caption="again"))
                await session.commit()
        stats = router.stats()
        assert {name: s["connects"] for name, s in stats.items()} == connects, stats
        assert all(s["errors_total"] == 0 and s["in_use"] == 0 for s in stats.values()), stats
        await router.close()
        return [p.id for p in photos]

    ids = asyncio.run(main())
    found = rows_in(topo, "photos")
    assert sorted(topo.shard_of_schema(found[i][1]) for i in ids) == list(range(64))
    assert len(found) == 64 + 16


def test_async_session_run_follows_a_move(make_fleet):
    """A shard moves pg1 → pg2 behind an AsyncRouter that still places it on pg1: ``Session.run``'s
    first attempt meets the moved shard after its transaction sent a statement (to shard 0, which
    stays), so the session raises ShardMoved after the AsyncRouter followed the move, and ``run``'s
    second attempt reads and writes on pg2."""
    models, _ = example()
    Photo = models.Photo
    path = make_fleet(hosts=2, shards=8)  # pg1 0-3, pg2 4-7
    assert run_cli("init", config=path).exit_code == 0
    owner = user_ids(load(path), [3])[0]  # the photos' owner, on shard 3

    async def before():
        router, Session = routers(load(path))
        async with Session() as session:
            photo = Photo(user_id=owner, caption="before the move")
            session.add(photo)
            await session.commit()
        return router, Session, photo.id

    async def after(router, Session, photo_id):
        calls = []

        async def work(session):
            calls.append(router._locate(3).name)
            await session.execute(text("SELECT 1").execution_options(shard=0))
            photo = await session.get(Photo, photo_id)
            session.add(Photo(user_id=owner, caption="after the move"))
            return photo.caption

        assert await Session.run(work) == "before the move"
        assert calls == ["pg1", "pg2"] and router._locate(3).name == "pg2"
        await router.close()

    loop = asyncio.new_event_loop()
    try:
        router, Session, photo_id = loop.run_until_complete(before())
        report = move_shards(load(path), [3], "pg2")
        assert report["phase"] == "cut_over", report
        loop.run_until_complete(after(router, Session, photo_id))
    finally:
        loop.close()
    found = rows_in(load(path), "photos")
    assert sorted((v[0], v[1], v[2][2]) for v in found.values()) == [
        ("pg2", "insta3", "after the move"),
        ("pg2", "insta3", "before the move"),
    ]


def test_a_forgotten_async_session_gives_its_connections_back(make_fleet):
    """A session dropped without close (its connection left to the garbage collector, outside SQLAlchemy's
    greenlet): the loan still ends on the event loop, so the AsyncRouter's pool gets its slot back."""
    import gc
    import warnings

    models, _ = example()
    Photo = models.Photo
    path = make_fleet(hosts=2, shards=8)
    assert run_cli("init", config=path).exit_code == 0

    async def main():
        router, Session = routers(load(path), max_size=1)

        async def forget():
            session = Session()
            await session.scalars(select(Photo).where(Photo.user_id == 1))
            assert router.stats()["pg1"]["in_use"] == 1

        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # SQLAlchemy warns about the connection the GC cleans up
            await forget()
            gc.collect()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if router.stats()["pg1"]["in_use"] == 0:
                break
        assert router.stats()["pg1"]["in_use"] == 0, router.stats()
        async with Session() as session:  # the one slot of pg1 is free again
            session.add(Photo(user_id=1, caption="after"))
            await session.commit()
        await router.close()

    asyncio.run(main())


class AsyncOrmTraffic:
    """Async ORM writers (``await Session.run``: add a Photo, flush, its id and schema) and readers (the
    key's photo ids and the schema that answered), tasks on an event loop of their own thread, recording
    into a History until the block ends."""

    def __init__(
        self,
        history: History,
        path,
        Photo,
        keys: list[int],
        writers: int,
        readers: int,
        name: str = "a",
    ):
        self.history, self.path, self.Photo, self.keys = history, path, Photo, keys
        self.writers, self.readers, self.name = writers, readers, name
        self.clients = {client for client, _ in self._ops()}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.crashed: BaseException | None = None

    def __enter__(self):
        self._thread.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:  # the block ran: let the traffic outlast it
            self.history.settle(self.clients)
        self._halt.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the async ORM clients did not stop within 60 s"
        if self.crashed is not None:
            raise self.crashed

    async def _main(self) -> None:
        try:
            router, Session = routers(load(self.path), move_wait=15)
            follow = Session.shards.follow_move

            async def followed(exc):  # Session.run's retry: recorded as the history's retries
                moved = await follow(exc)
                if moved:
                    self.history.retried(self.name, "run", None, exc.orig)
                return moved

            Session.shards.follow_move = followed
            await asyncio.gather(*[self._loop(Session, client, op) for client, op in self._ops()])
            await router.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread by __exit__
            self.crashed = exc

    def _ops(self) -> list[tuple[str, object]]:
        """(client name, operation) of each writer and reader task."""
        ops = [(f"{self.name}w{i}", self._write) for i in range(self.writers)]
        return ops + [(f"{self.name}r{i}", self._read) for i in range(self.readers)]

    async def _loop(self, Session, client: str, op) -> None:
        rng = random.Random(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            start = now()
            try:
                await op(Session, client, key, start)
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                self.history.failed(client, op.__name__, key, exc, start, now())
            await asyncio.sleep(0.01)  # hundreds of statements a second (support.clients)

    async def _write(self, Session, client: str, key: int, start: float) -> None:
        async def work(session):
            photo = self.Photo(user_id=key, caption=self.history.caption(client))
            session.add(photo)
            await session.flush()
            return photo.id

        self.history.acked(client, key, await Session.run(work), start, now())

    async def _read(self, Session, client: str, key: int, start: float) -> None:
        Photo = self.Photo

        async def work(session):
            query = select(func.current_schema(), func.array_agg(Photo.id)).where(
                Photo.user_id == key
            )
            return (await session.execute(query)).one()

        schema, ids = await Session.run(work)
        self.history.read(client, key, schema, ids, start, now())


@pytest.mark.parametrize(
    "mode", [pytest.param("direct", marks=pytest.mark.slow), "transaction"], indirect=True
)
def test_async_orm_clients_during_move(pooled_fleet, mode, caplog):
    """Async ORM writers and readers of two app servers while 4 shards move pg1 → pg2, one reading the
    live topology file and one a copy that is never updated: every acknowledged write is in its shard
    exactly once, no read is answered by another shard or misses an acknowledged row, and both app
    servers' sessions met the move and ran their work again (the stale one through the redirect)."""
    models, _ = example()
    path = pooled_fleet(hosts=2, shards=16)  # pg1 0-7, pg2 8-15
    moved = [4, 5, 6, 7]
    topo = load(path)
    history = History(path, key_is_id=True)
    keys = user_ids(topo, moved + [0, 9], 4)
    stale = stale_copy(path)
    with (
        AsyncOrmTraffic(history, path, models.Photo, keys, writers=4, readers=2, name="live"),
        AsyncOrmTraffic(history, stale, models.Photo, keys, writers=2, readers=1, name="stale"),
    ):
        report = move_shards(load(path), moved, "pg2")
    moved_under_traffic(report, history, caplog.text)


def test_an_async_transaction_opens_in_the_round_trip_of_its_first_statement(make_fleet):
    """As in the sync sessions: the BEGIN and the shard's settings ride in the first statement's text.
    ``%`` in parameters and literals survives it, a first statement that fails leaves nothing behind, and
    a transaction over several shards of a host (text() with a shard named) sees each shard's tables."""
    models, _ = example()
    Photo = models.Photo
    path = make_fleet(hosts=1, shards=8, init=True)

    async def scenario():
        router, Session = routers(load(path), max_size=1)
        async with Session() as session:
            photo = Photo(user_id=user_ids(load(path), [5])[0], caption="100% async")
            session.add(photo)
            await session.commit()
        async with Session() as session:
            percent = text("SELECT :v || '%', current_schema()").execution_options(shard=6)
            assert (await session.execute(percent, {"v": "a%%b%s"})).one() == ("a%%b%s%", "insta6")
            with pytest.raises(Exception, match="division by zero"):
                await session.execute(text("SELECT 1 / 0").execution_options(shard=2))
            await session.rollback()
            count = text("SELECT count(*) FROM photos")
            assert (await session.execute(count.execution_options(shard=5))).scalar() == 1
            assert (await session.execute(count.execution_options(shard=6))).scalar() == 0
            assert (await session.get(Photo, photo.id)).caption == "100% async"
        await router.close()

    asyncio.run(scenario())
    found = rows_in(load(path), "photos")
    assert [(v[1], v[2][2]) for v in found.values()] == [("insta5", "100% async")]


def test_async_orm_clients_during_migrate(pooled_fleet, mode):
    """4 async ORM writers and 2 readers on every shard while ``shardctl migrate`` adds a column with a
    default, backfills it and indexes it: nothing lost, doubled or misplaced, no stale or wrong-shard read,
    no application-visible error; the migration reached all 16 shards."""
    models, _ = example()
    path = pooled_fleet(hosts=2, shards=16)
    add_filter_migration(path, "0003", "photos", "aw")
    history = History(path, key_is_id=True)
    keys = user_ids(load(path), list(range(16)), 2)
    with AsyncOrmTraffic(history, path, models.Photo, keys, writers=4, readers=2):
        result = run_cli("migrate", config=path)
    migrated_under_traffic(path, result, history)
