"""shardctl.sqlalchemy (issue #25): the example app's sessions over a Router, directly and through
PgBouncer in transaction mode, checked row by row in the shard schemas; routing, refusals, connections
per host, and ORM clients during move-shard checked by the history checker."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import func, select, text, update
from support.fleet import load, run_cli, stale_copy
from support.history import History, now
from support.orm import (
    OrmAppProcess,
    add_filter_migration,
    example,
    migrated_under_traffic,
    moved_under_traffic,
    rows_in,
    user_ids,
)

from shardctl.errors import ShardMoved
from shardctl.ops.move import move_shards
from shardctl.router import Router
from shardctl.sqlalchemy import UnroutableStatement, criterion_shards, sessionmaker

MODES = ["direct", "transaction"]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def test_example_app_rows_land_in_their_shards(pooled_fleet, capsys):
    """Users, photos and likes through the example's functions: every row is in the shard its key names
    (read back directly in the shard schema), and a get by ID finds every row from the ID alone."""
    models, app = example()
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)
    Session = app.make_sessions(str(path))
    users = [app.sign_up(Session, f"user{i}") for i in range(40)]
    photos = [
        app.post_photo(Session, u.id, f"photo of {u.username}") for u in users for _ in range(2)
    ]
    likes = [app.like(Session, p.id, users[i % len(users)].id) for i, p in enumerate(photos[:30])]
    router = Router(topo)
    found = rows_in(topo, "users")
    assert len(found) == len(users)
    for u in users:
        host, schema, row = found[u.id]
        assert schema == topo.schema_name(router.shard_for(u.username)) and row[1] == u.username
        assert host == topo.host_of(topo.layout.decode(u.id)["shard"]).name
    found_users = found
    found = rows_in(topo, "photos")
    assert len(found) == len(photos)
    for p in photos:
        host, schema, row = found[p.id]
        assert row[1] == p.user_id
        # with its owner: the shard inside user_id, which is the user's
        assert (
            schema == topo.schema_name(topo.layout.shard_of(p.user_id)) == found_users[p.user_id][1]
        )
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
    assert [p.id for p in app.photos_of(Session, users[3].id)] == sorted(
        (p.id for p in photos[6:8]), reverse=True
    )
    assert app.user_count(Session) == len(users)
    app.main(str(path))  # what `python app.py shardctl.yaml` prints
    assert "1 like(s)" in capsys.readouterr().out
    router.close()
    Session.shards.router.close()


def test_a_session_on_all_64_shards_holds_one_connection_per_host(pooled_fleet, mode):
    """One session transaction writes to and reads from all 64 shards of 2 hosts: the Router lends it one
    connection per host (Router.stats(), and directly pg_stat_activity), all given back at its end."""
    models, _ = example()
    path = pooled_fleet(hosts=2, shards=64)
    topo = load(path)
    router = Router(topo, max_size=8)
    Session = sessionmaker(router)
    seen = []
    uid = user_ids(topo, list(range(64)))
    with Session() as session:
        photos = [models.Photo(user_id=uid[n], caption=f"shard {n}") for n in range(64)]
        session.add_all(photos)
        session.flush()  # 64 INSERTs, one shard after another
        for p in photos:
            assert session.scalars(
                select(models.Photo.caption).where(models.Photo.user_id == p.user_id)
            ).all() == [p.caption]
        assert (
            len(session.scalars(select(models.Photo).execution_options(all_shards=True)).all())
            == 64
        )
        for name, stat in router.stats().items():
            seen.append((name, stat["in_use"], stat["size"]))
        if mode == "direct":
            for host in topo.hosts:
                with psycopg.connect(
                    **host.connect_kwargs(purpose="admin"), autocommit=True
                ) as conn:
                    seen.append(
                        (
                            host.name,
                            conn.execute(
                                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND application_name LIKE 'shardctl%router'"
                            ).fetchone()[0],
                        )
                    )
        ids = [p.id for p in photos]
        session.commit()
    assert [s for s in seen if len(s) == 3] == [("pg1", 1, 1), ("pg2", 1, 1)], seen
    assert all(n <= 1 for _, n in (s for s in seen if len(s) == 2)), seen
    assert all(stat["in_use"] == 0 for stat in router.stats().values())
    found = rows_in(topo, "photos")
    assert sorted(topo.shard_of_schema(found[i][1]) for i in ids) == list(range(64))
    # The loans went back to the Router's pool open and clean (issue #25: a creator over connection()
    # committed, then raised "the connection is closed"): later sessions reuse them, without an error.
    connects = {name: stat["connects"] for name, stat in router.stats().items()}
    for n in range(20):
        with Session() as session:
            assert session.get(models.Photo, ids[n]).caption == f"shard {n}"
            session.add(models.Photo(user_id=uid[n], caption="again"))
            session.commit()
    stats = router.stats()
    assert {name: stat["connects"] for name, stat in stats.items()} == connects, stats
    assert all(stat["errors_total"] == 0 and stat["in_use"] == 0 for stat in stats.values()), stats
    router.close()


def test_routing_and_refusals(make_fleet):
    """== and IN on the shard key or the ID, OR of routable terms, updates, deletes, refresh after commit,
    text() with a named shard; a statement with no routable criterion raises instead of guessing."""
    models, _ = example()
    Photo, User = models.Photo, models.User
    path = make_fleet(hosts=2, shards=16, init=True)
    router = Router(load(path))
    Session = sessionmaker(router)
    layout = load(path).layout
    # user IDs k1, k17 on shard 1, k2 on shard 2, k30 on shard 14
    K = {k: layout.encode(shard=s, time=k) for k, s in ((1, 1), (2, 2), (17, 1), (30, 14))}
    with Session() as session:
        photos = [Photo(user_id=K[k], caption=f"k{k}") for k in (1, 2, 17, 30)]
        session.add_all(photos)
        session.commit()
        ids = [p.id for p in photos]  # expired at commit: each refresh routes by the ID
        assert [router.shard_of_id(i) for i in ids] == [1, 2, 1, 14]
    with Session() as session:
        got = session.scalars(select(Photo).where(Photo.id.in_(ids)).order_by(Photo.id)).all()
        assert sorted(p.id for p in got) == sorted(
            ids
        )  # shard after shard: ORDER BY holds within each
        got = session.scalars(
            select(Photo).where((Photo.user_id == K[2]) | (Photo.user_id == K[30]))
        ).all()
        assert sorted(p.user_id for p in got) == sorted([K[2], K[30]])
        got = session.scalars(
            select(Photo).where(Photo.user_id.in_([K[1], K[17]]), Photo.caption == "k17")
        ).all()
        assert [p.user_id for p in got] == [K[17]]
        assert (
            session.execute(
                update(Photo).where(Photo.id == ids[3]).values(caption="edited")
            ).rowcount
            == 1
        )
        assert (
            session.execute(
                update(Photo)
                .where(Photo.user_id.in_([K[2], K[30]]))
                .values(caption="k2/k30")
                .execution_options(synchronize_session=False)
            ).rowcount
            == 2
        )  # 2 shards
        assert session.scalars(select(Photo).where(Photo.user_id.in_([]))).all() == []
        p = session.get(Photo, ids[0])
        p.caption = "changed"
        session.delete(session.get(Photo, ids[1]))
        session.commit()
        assert session.scalar(text("SELECT count(*) FROM photos").execution_options(shard=1)) == 2
        conn = session.connection(bind_arguments={"shard": 14})
        assert conn.exec_driver_sql("SELECT current_schema(), count(*) FROM photos").one() == (
            "insta14",
            1,
        )
        assert conn.execute(text("SELECT count(*) FROM photos")).scalar() == 1
        for bad in (
            select(Photo),
            select(Photo).where(Photo.caption == "x"),
            select(Photo).where((Photo.user_id == K[1]) | (Photo.caption == "x")),
            text("SELECT 1"),
        ):
            with pytest.raises(UnroutableStatement, match="no shard"):
                session.execute(bad)
        session.rollback()
        with pytest.raises(UnroutableStatement, match="set its shard key"):
            session.add(User())
            session.flush()
    with Session() as session:
        assert (
            session.get(Photo, ids[0]).caption == "changed" and session.get(Photo, ids[1]) is None
        )
        assert (
            session.get(Photo, ids[3]).caption == "k2/k30"
            and session.get(Photo, ids[2]).caption == "k17"
        )
    assert criterion_shards(router, None, {}, {}) is None
    router.close()


class OrmTraffic:
    """ORM writers and readers recording into a History until :meth:`stop`: half the writers post a photo
    with the example app's ``post_photo`` (a plain session), the others with ``Session.run`` (add a
    Photo, flush, its id); readers read the key's photo ids and the schema that answered in a plain
    session. A ShardMoved is a documented retry (recorded under ``name``, tried again)."""

    def __init__(
        self,
        history: History,
        Session,
        Photo,
        keys: list[int],
        writers: int,
        readers: int,
        name: str = "orm",
    ):
        self.history, self.Session, self.Photo, self.keys = history, Session, Photo, keys
        self.name, self.app = name, example()[1]
        self._halt = threading.Event()
        ops = [(f"{name}-w{i}", self._write) for i in range(writers)]
        ops += [(f"{name}-r{i}", self._read) for i in range(readers)]
        self.clients = {client for client, _ in ops}
        self.threads = [
            threading.Thread(target=self._loop, args=(client, op), daemon=True)
            for client, op in ops
        ]

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:  # the block ran: let the traffic outlast it
            self.history.settle(self.clients)
        self._halt.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads)

    def _loop(self, client: str, op) -> None:
        import random

        rng = random.Random(client)
        while not self._halt.is_set():
            key = rng.choice(self.keys)
            start = now()
            try:
                op(client, key, start)
            except ShardMoved as exc:
                self.history.retried(self.name, op.__name__, key, exc)
            except Exception as exc:  # noqa: BLE001 - every error the application sees is recorded
                self.history.failed(client, op.__name__, key, exc, start, now())
            time.sleep(0.01)  # hundreds of statements a second, not thousands (support.clients)

    def _write(self, client: str, key: int, start: float) -> None:
        if int(client.rsplit("w", 1)[1]) % 2:
            photo = self.app.post_photo(self.Session, key, self.history.caption(client))
            self.history.acked(client, key, photo.id, start, now())
            return

        def work(session):
            photo = self.Photo(user_id=key, caption=self.history.caption(client))
            session.add(photo)
            session.flush()
            return photo.id

        self.history.acked(client, key, self.Session.run(work), start, now())

    def _read(self, client: str, key: int, start: float) -> None:
        Photo = self.Photo
        with self.Session() as session:
            schema, ids = session.execute(
                select(func.current_schema(), func.array_agg(Photo.id)).where(Photo.user_id == key)
            ).one()
        self.history.read(client, key, schema, ids, start, now())


def orm_app_server(path, history: History, name: str):
    """An app server: a Router on its own topology file ``path`` and a sessionmaker over it, whose
    ``Session.run`` retries after a move are recorded in ``history`` under ``name``."""
    router = Router(load(path), move_wait=15)
    Session = sessionmaker(router, expire_on_commit=False)  # as the example app's
    follow = Session.shards.follow_move

    def followed(exc):  # Session.run's retry: recorded as the history's documented retries
        moved = follow(exc)
        if moved:
            history.retried(name, "run", None, exc.orig)
        return moved

    Session.shards.follow_move = followed
    return router, Session


@pytest.mark.parametrize(
    "mode", ["direct", pytest.param("transaction", marks=pytest.mark.slow)], indirect=True
)
def test_orm_clients_during_move(pooled_fleet, mode, caplog):
    """ORM writers and readers of two app servers while 4 shards move pg1 → pg2, one in this process
    reading the live topology file and one, the example app in a process of its own, on a copy that is
    never updated: every acknowledged write is in its shard exactly once, no read is answered by another
    shard or misses an acknowledged row, no error, and both app servers' sessions met the move and
    followed it (the stale one through the redirect)."""
    models, _ = example()
    path = pooled_fleet(hosts=2, shards=16)  # pg1 0-7, pg2 8-15
    moved = [4, 5, 6, 7]
    topo = load(path)
    history = History(path, key_is_id=True)
    live_router, live = orm_app_server(path, history, "live")
    keys = user_ids(topo, moved + [0, 9], 4)
    with (
        OrmTraffic(history, live, models.Photo, keys, writers=4, readers=2, name="live"),
        OrmAppProcess(history, stale_copy(path), keys, "stale", writers=2, readers=1) as stale,
    ):
        report = move_shards(load(path), moved, "pg2")
    live_router.close()
    moved_under_traffic(report, history, caplog.text + stale.log.read_text())


def test_relationships_load_lazily_from_their_shards(make_fleet):
    """Relationships over the example's tables: likes appended to a photo are placed with the photo
    (the shard inside photo_id, set by the relationship at flush); in later sessions a photo's likes
    (one-to-many), a user's photos (by the key) and a like's photo (many-to-one, by the ID) load lazily,
    each from the shard its criterion names, and every like is directly in its photo's shard."""
    from sqlalchemy import BigInteger, FetchedValue, Text
    from sqlalchemy.orm import DeclarativeBase, mapped_column, relationship

    # (columns without Mapped[] annotations: this module's annotations are strings)

    class Base(DeclarativeBase):
        pass

    class User(Base):
        __tablename__ = "users"
        __shard_key__ = "username"
        id = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
        username = mapped_column(Text)
        photos = relationship(
            "Photo", primaryjoin="foreign(Photo.user_id) == User.id", order_by="Photo.id"
        )

    class Photo(Base):
        __tablename__ = "photos"
        __shard_key__ = "user_id"
        id = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
        user_id = mapped_column(BigInteger)
        caption = mapped_column(Text)
        likes = relationship(
            "Like",
            primaryjoin="foreign(Like.photo_id) == Photo.id",
            back_populates="photo",
            order_by="Like.id",
        )

    class Like(Base):
        __tablename__ = "likes"
        __shard_key__, __shard_key_is_id__ = "photo_id", True
        id = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
        photo_id = mapped_column(BigInteger)
        user_id = mapped_column(BigInteger)
        photo = relationship(
            Photo, primaryjoin="foreign(Like.photo_id) == Photo.id", back_populates="likes"
        )

    path = make_fleet(hosts=2, shards=16)
    assert run_cli("init", config=path).exit_code == 0
    topo = load(path)
    router = Router(topo)
    Session = sessionmaker(router)
    with Session() as session:
        users = [User(username=f"u{i}") for i in range(6)]
        session.add_all(users)
        session.flush()
        for n, user in enumerate(users):
            photo = Photo(user_id=user.id, caption=f"photo {n}")
            photo.likes = [Like(user_id=other.id) for other in users[: n + 1]]  # photo_id at flush
            session.add(photo)
        session.commit()
        expected = {u.id: [(p.id, [lk.user_id for lk in p.likes]) for p in u.photos] for u in users}
        assert all(len(v) == 1 for v in expected.values()), expected
    with Session() as session:
        for user_id, photos in expected.items():
            user = session.get(User, user_id)
            got = [(p.id, [lk.user_id for lk in p.likes]) for p in user.photos]  # two lazy loads
            assert got == photos, (user_id, got, photos)
            for p in user.photos:
                assert router.shard_of_id(p.id) == router.shard_for(user_id)
                assert all(router.shard_of_id(lk.id) == router.shard_of_id(p.id) for lk in p.likes)
    like_ids = [i for v in rows_in(topo, "likes").values() for i in [v[2][0]]]
    with Session() as session:
        for like_id in like_ids:  # many-to-one, from a like alone: the photo by the ID in photo_id
            like = session.get(Like, like_id)
            assert like.photo.id == like.photo_id and like in like.photo.likes
    found = rows_in(topo, "likes")
    assert len(found) == sum(range(1, 7))
    for _, schema, row in found.values():
        assert schema == topo.schema_name(router.shard_of_id(row[1]))  # with its photo
    router.close()


def test_a_transaction_opens_in_the_round_trip_of_its_first_statement(make_fleet, tmp_path):
    """The BEGIN and the shard's settings ride in the text of a session transaction's first statement
    (client-side binding: one round trip, where a driver's own BEGIN costs one of its own): an insert
    then a get by ID, each in its own session, is 4 round trips (plain SQLAlchemy on one database: 6).
    Parameters and literals holding ``%`` survive the joined text; a first statement that fails leaves
    nothing behind, and the next transaction opens on its own shard. libpq's trace counts what was sent."""
    models, _ = example()
    Photo = models.Photo
    path = make_fleet(hosts=1, shards=8, init=True)
    router = Router(load(path), max_size=1)
    Session = sessionmaker(router, expire_on_commit=False)
    with Session() as session:  # the one pooled connection, and SQLAlchemy's first-connect queries
        raw = session.connection(bind_arguments={"shard": 3}).connection.driver_connection
        session.execute(text("SELECT 1").execution_options(shard=3))
    trace = tmp_path / "trace.txt"
    with trace.open("w") as out:
        raw.pgconn.trace(out.fileno())
        with Session() as session:
            photo = Photo(user_id=user_ids(load(path), [5])[0], caption="100% real")
            session.add(photo)
            session.commit()
        with Session() as session:
            assert session.get(Photo, photo.id).caption == "100% real"
        raw.pgconn.untrace()
    sent = [
        (line.split("\t") + [""])[3:5]
        for line in trace.read_text().splitlines()
        if line.split("\t")[1:2] == ["F"]
    ]
    trips = [body for kind, body in sent if kind.strip() == "Query"]
    assert len(trips) == 4, trips
    begin = " \"BEGIN; SELECT set_config('search_path', 'insta5, public', true), set_config('statement_timeout'"
    assert trips[0].startswith(begin) and "INSERT INTO insta5.photos" in trips[0], trips
    assert "'100% real'" in trips[0] and trips[1].strip() == '"COMMIT"', trips
    assert trips[2].startswith(begin) and "SELECT insta5.photos.id" in trips[2], trips
    assert trips[3].strip() == '"ROLLBACK"', trips

    with Session() as session:
        percent = text("SELECT :v || '%', current_schema()").execution_options(shard=6)
        assert session.execute(percent, {"v": "a%%b%s"}).one() == ("a%%b%s%", "insta6")
        with pytest.raises(sqlalchemy.exc.DataError):
            session.execute(text("SELECT 1 / 0").execution_options(shard=2))
        session.rollback()
        assert session.execute(
            text("SELECT current_schema(), current_setting('statement_timeout')").execution_options(
                shard=7
            )
        ).one() == ("insta7", "30s")
    with psycopg.connect(**load(path).hosts[0].connect_kwargs()) as check:
        assert check.execute(
            "SELECT count(*) FROM insta5.photos WHERE caption = '100% real'"
        ).fetchone() == (1,)
    router.close()


def test_orm_clients_during_migrate(pooled_fleet, mode):
    """4 ORM writers and 2 readers on every shard while ``shardctl migrate`` adds a column with a default,
    backfills it and indexes it: no application-visible error, every acknowledged write in its shard
    exactly once, every read answered by its key's shard; the migration reached all 16 shards."""
    models, _ = example()
    path = pooled_fleet(hosts=2, shards=16)
    add_filter_migration(path, "0003", "photos", "orm-w")
    router = Router(load(path))
    history = History(path, key_is_id=True)
    keys = user_ids(load(path), list(range(16)), 2)
    Session = sessionmaker(router, expire_on_commit=False)  # as the example app's
    with OrmTraffic(history, Session, models.Photo, keys, writers=4, readers=2):
        result = run_cli("migrate", config=path)
    router.close()
    migrated_under_traffic(path, result, history)
