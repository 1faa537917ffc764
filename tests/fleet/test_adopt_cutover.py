"""``adopt cutover``, ``--abort`` and ``--cleanup`` on a small old database and a 2-host fleet.

The forward copy is made here the way ADOPT.md fixes it (``adopt copy`` builds the same objects): per
fleet host a publication ``shardctl_adopt_<host>`` with row filters on ``key % N``, its slot, the
partitioned parents in ``public`` whose partitions are the host's shard tables, the subscription; the
run's record in ``shardctl_adopt.run`` with a passed verification. Judged against the old database's
rows and the acknowledged writes (tests/support/history.py), never by the cutover's own report."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from support import crash_at
from support.adopt_cutover import (
    SHARDS,
    cli_json,
    finish_second_attempt,
    fleet_name,
    fleet_tasks,
    leftovers,
    real_adoption,
    sql,
)
from support.fleet import load, run_cli, stale_copy
from support.history import History

from shardctl.errors import FreezeTimeout
from shardctl.model.adoption import IdMap
from shardctl.model.topology_file import flip_adoption, write_adoption
from shardctl.ops.adopt.id_map import drop_id_map, ensure_id_map, wait_id_map
from shardctl.ops.adopt.state import slot_name
from shardctl.ops.move.run import HOOKS
from shardctl.router import AsyncRouter, Router
from shardctl.sql.catalog import adopt_copy, adopt_verify

TABLES = {"users": "id", "photos": "user_id", "likes": "user_id"}  # table -> key
ID_FLOOR = 1 << 40
SOURCE_DDL = """
CREATE TABLE users (id bigserial PRIMARY KEY, username text NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE photos (id bigserial PRIMARY KEY, user_id bigint NOT NULL, caption text,
                     created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE likes (id bigserial PRIMARY KEY, photo_id bigint NOT NULL, user_id bigint NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (photo_id, user_id));
CREATE TABLE plans (id serial PRIMARY KEY, name text NOT NULL);
ALTER TABLE photos REPLICA IDENTITY FULL;
ALTER TABLE likes REPLICA IDENTITY FULL;
CREATE SCHEMA shardctl_adopt;
CREATE TABLE shardctl_adopt.run (
    one boolean PRIMARY KEY DEFAULT true CHECK (one), phase text NOT NULL, plan_hash text NOT NULL,
    topology text, started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), detail jsonb NOT NULL DEFAULT '{}');
"""


def adoption_text(dsn: str) -> str:
    tables = ", ".join(f"{t}: {{id: id, key: {k}}}" for t, k in TABLES.items())
    return (
        f'adoption:\n  source: {{dsn: "{dsn}"}}\n  schema: public\n  authoritative: source\n'
        f"  id_floor: {ID_FLOOR}\n  tables: {{{tables}}}\n  globals: [plans]\n"
    )


def load_source(src: psycopg.Connection, users: int) -> None:
    """``users`` users, 4 photos and 2 likes each, 3 plans (the old app's rows)."""
    sql(src, "INSERT INTO users (username) SELECT 'u' || g FROM generate_series(1, %s) g", users)
    sql(
        src,
        "INSERT INTO photos (user_id, caption) SELECT u.id, 'old' FROM users u, generate_series(1, 4)",
    )
    sql(
        src,
        "INSERT INTO likes (photo_id, user_id) SELECT p.id, p.user_id FROM photos p WHERE p.id %% 2 = 0",
    )
    sql(src, "INSERT INTO plans (name) VALUES ('free'), ('pro'), ('team')")


def forward(path: Path, src_dsn: str) -> None:
    """What ``adopt copy`` leaves: publications, slots, parents, subscriptions (rows stream after).
    The row filters and the parents' partition key are ``adopt copy``'s own (``adopt_copy``)."""
    topo = load(path)
    shards = {t: adopt_copy.key_shard(k, SHARDS, topo.layout, ID_FLOOR) for t, k in TABLES.items()}
    with psycopg.connect(src_dsn, autocommit=True) as src:
        for host in topo.hosts:
            plain = ["plans"] if host.name == topo.hosts[0].name else []
            name = slot_name(host.name)  # no tag: the run below is recorded without one
            ranges = [(n, n) for n in host.shards]
            adopt_copy.create_filtered_publication(
                src, name, "public", list(shards.items()), ranges, plain
            )
            sql(src, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    for i, host in enumerate(topo.hosts):
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            for t in TABLES:
                first = topo.schema_name(host.shards[0])
                adopt_copy.create_parent(conn, "public", t, (first, t), shards[t])
                for n in host.shards:
                    adopt_copy.attach_shard(conn, ("public", t), (topo.schema_name(n), t), n)
            if i == 0:
                sql(conn, "CREATE TABLE public.plans (id serial PRIMARY KEY, name text NOT NULL)")
            name = slot_name(host.name)
            sql(
                conn,
                f"CREATE SUBSCRIPTION {name} CONNECTION '{src_dsn}' PUBLICATION {name} "
                f"WITH (create_slot = false, slot_name = '{name}', copy_data = false)",
            )


def wait_applied(src_dsn: str, timeout: float = 30) -> None:
    """Until every forward slot has confirmed the old database's WAL up to now."""
    with psycopg.connect(src_dsn, autocommit=True) as src:
        lsn = sql(src, "SELECT pg_current_wal_lsn()")[0][0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            behind = sql(
                src,
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'shardctl\\_adopt\\_%%' "
                "AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < %s)",
                lsn,
            )[0][0]
            if not behind:
                return
            time.sleep(0.05)
    raise AssertionError("the forward subscriptions did not catch up")


def passed_verify(src: psycopg.Connection) -> None:
    """What a passed ``adopt verify`` records (its own run table)."""
    sql(src, adopt_verify.STATE)
    sql(
        src,
        "INSERT INTO shardctl_adopt.verify_runs (fingerprint, finished_at, summary) "
        'VALUES (\'x\', now(), \'{"chunks": 3, "problems": 0, "busy": 0}\')',
    )


def adopting(make_fleet, users: int = 200, verified: bool = True) -> tuple[Path, str]:
    """A 2-host fleet of 4 shards whose topology adopts a loaded old database, copy streaming."""
    src_dsn = make_fleet.new_database(0)
    path = make_fleet(hosts=2, shards=SHARDS, init=True, extra=adoption_text(src_dsn))
    with psycopg.connect(src_dsn, autocommit=True) as src:
        sql(src, SOURCE_DDL)
        detail = {"replica_identity": {"photos": ["d", None], "likes": ["d", None]}}
        if verified:
            passed_verify(src)
        sql(
            src,
            "INSERT INTO shardctl_adopt.run (phase, plan_hash, detail) VALUES ('synced', 'x', %s)",
            json.dumps(detail),
        )
    forward(path, src_dsn)
    with psycopg.connect(src_dsn, autocommit=True) as src:
        load_source(src, users)
    wait_applied(src_dsn)
    return path, src_dsn


def fleet_rows(path: Path, table: str, aborted: bool = False) -> dict[int, tuple[str, str]]:
    """id -> (host, schema) of every row of ``table`` in a shard schema of the fleet (after an
    abort: ``aborted``, under the name it gave the shard tables)."""
    topo = load(path)
    out: dict[int, tuple[str, str]] = {}
    name = fleet_name(table, aborted)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            for n in host.shards:
                s = topo.schema_name(n)
                for (i,) in sql(conn, f"SELECT id FROM {s}.{name}"):
                    assert i not in out, f"{table} row {i} twice"
                    out[i] = (host.name, s)
    return out


def came_back(src_dsn: str, table: str, id_: int, timeout: float = 30) -> None:
    """Until the old database's ``table`` holds row ``id_`` (the way back applied it)."""
    with psycopg.connect(src_dsn, autocommit=True) as src:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sql(src, f"SELECT 1 FROM {table} WHERE id = %s", id_):
                return
            time.sleep(0.05)
    raise AssertionError(f"row {id_} never came back to the old database's {table}")


READ_SQL = "SELECT current_schema(), coalesce(array_agg(id), '{}') FROM photos WHERE user_id = %s"


@contextmanager
def writing(
    routers: dict[str, Router],
    history: History,
    plans: list[int],
    readers: dict[str, Router] | None = None,
    until: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """One writer thread per Router inserting photos of users 1-200 (and every fifth time a plan, a
    global table) until the block ends; each acknowledged photo (and any error) recorded in
    ``history``, each acknowledged plan's ID in ``plans``. One thread per Router of ``readers``
    that only reads users' photos, each read (the schema that answered, the IDs) recorded. After
    the block, the threads go on for a second, and then (at most 20 s) until ``until()`` holds:
    on a loaded machine a second may hold too few reads to judge by."""
    stop = threading.Event()

    def reader(client: str, router: Router) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            key = 1 + (k * 7) % 200
            t0 = time.time()
            try:
                schema, ids = router.execute(key, READ_SQL, (key,))[0]
            except psycopg.Error as exc:
                history.failed(client, "read", key, exc, t0, time.time())
                return
            history.read(client, key, schema, ids, t0, time.time())
            time.sleep(0.01)  # a few hundred reads: the freeze's wait for lag 0 shares 2 cores

    def writer(client: str, router: Router) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            key = 1 + (k * 7 + len(client)) % 200
            t0 = time.time()
            try:
                rows = router.execute(
                    key,
                    "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id",
                    (key, history.caption(client)),
                )
                if k % 5 == 0:  # a global table, on the old database then on the global host
                    plans.append(
                        router.execute(
                            None,
                            "INSERT INTO plans (name) VALUES (%s) RETURNING id",
                            (client,),
                            global_=True,
                        )[0][0]
                    )
            except psycopg.Error as exc:
                history.failed(client, "insert", key, exc, t0, time.time())
                return
            history.acked(client, key, rows[0][0], t0, time.time())
            time.sleep(0.003)

    threads = [threading.Thread(target=writer, args=i, daemon=True) for i in routers.items()]
    threads += [
        threading.Thread(target=reader, args=i, daemon=True) for i in (readers or {}).items()
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        yield
        time.sleep(1.0)  # every Router keeps writing after the switch
        deadline = time.time() + 20
        while until is not None and not until() and time.time() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def photo_model():
    """The SQLAlchemy model of the app's ``photos`` (its shard key a user's ID)."""
    from sqlalchemy import BigInteger, Column, Text
    from sqlalchemy.orm import declarative_base

    class Photo(declarative_base()):
        __tablename__ = "photos"
        __shard_key__, __shard_key_is_id__ = "user_id", True
        id = Column(BigInteger, primary_key=True)
        user_id = Column(BigInteger)
        caption = Column(Text)

    return Photo


def test_cutover_follows_writers_abort_brings_back_later_writes(make_fleet):
    """Writers through two Routers (one on a topology copy never updated) write across the cutover
    and follow to the fleet; a third Router on a stale copy only reads, and after the cutover its
    reads see the writes acknowledged on the fleet; the freeze fits --max-freeze; every acknowledged
    write is once in its key's shard; a direct client of the old table gets one line naming the new
    home, on a read as on a write. Then across --abort: the writes made on the fleet come back to
    the old database, the writers follow there."""
    path, src_dsn = adopting(make_fleet)
    stale_path = stale_copy(path)
    history, plans = History(path), []
    routers = {
        "fresh": Router(load(path), move_wait=15),
        "stale": Router(load(stale_path), move_wait=15),
    }
    readers = {"stale-reader": Router(load(stale_path), move_wait=15)}
    assert routers["stale"]._locate(0).name == "source"  # both write to the old database first
    try:
        switched = float("inf")

        def a_read_saw_a_fleet_write() -> bool:
            fleet_ids = {w.id for w in list(history.writes) if w.start > switched}
            return any(r.ids & fleet_ids for r in list(history.reads) if r.start > switched)

        with writing(routers, history, plans, readers, until=a_read_saw_a_fleet_write):
            before = time.time()
            result = cli_json(path, "--max-freeze", "0.5")
            switched = time.time()
        readers.pop("stale-reader").close()
        print(
            f"\nadopt cutover: freeze {result['freeze_seconds']:.3f}s (locked at "
            f"{result['freeze_lock_seconds']}, lag 0 at {result['freeze_caught_up_seconds']}), "
            f"{len(history.writes)} writes"
        )
        assert result["phase"] == "cut_over" and result["authoritative"] == "fleet"
        assert 0 < result["freeze_seconds"] <= 0.5
        assert load(path).adoption.authoritative == "fleet"
        assert load(stale_path).adoption.authoritative == "source"  # its file never changed
        late = {w.client for w in history.writes if w.start > switched}
        assert late == {"fresh", "stale"}, "a Router did not write after the cutover"
        # The reader's reads that began after the cutover, judged by the acknowledged writes: the
        # old database's answers before it are the old app's (schema public), not the fleet's.
        history.reads = [r for r in history.reads if r.start > switched]
        fleet_ids = {w.id for w in history.writes if w.start > switched}
        assert any(r.ids & fleet_ids for r in history.reads), "no read saw a fleet's write"
        report = history.check()
        assert report.ok, report
        topo = load(path)
        with psycopg.connect(src_dsn, autocommit=True) as src:
            old = dict(
                sql(
                    src,
                    "SELECT id, user_id FROM shardctl_adopted.photos WHERE id < %s",
                    ID_FLOOR,
                )
            )
            errors = []
            for statement in (
                "INSERT INTO photos (user_id, caption) VALUES (1, 'direct')",
                "SELECT count(*) FROM photos",
                "SELECT id FROM public.likes WHERE false",
            ):
                with pytest.raises(psycopg.Error) as err:
                    sql(src, statement)
                errors.append(err.value)
        for error in errors:
            assert error.sqlstate == "SCM01"
            message = str(error).splitlines()[0]
            assert "adopted into the shardctl fleet" in message and "pg1" in message, message
        # an upsert naming its conflict target, from a Router on the stale copy, follows too (a
        # stub has no unique index to infer: 42P10 before any trigger)
        with Router(load(stale_path), move_wait=15) as upserter:
            upsert = (
                "INSERT INTO likes (photo_id, user_id) VALUES (%s, %s) "
                "ON CONFLICT (photo_id, user_id) DO UPDATE SET created_at = now() RETURNING id"
            )
            liked = upserter.execute(7, upsert, (424242, 7))[0][0]
        assert fleet_rows(path, "likes")[liked] == (topo.host_of(3).name, topo.schema_name(3))
        # every row the old database had at the cutover is on the fleet once, in its key's shard
        on_fleet = fleet_rows(path, "photos")
        for i, user in old.items():
            n = user % SHARDS
            assert on_fleet.get(i) == (topo.host_of(n).name, topo.schema_name(n))
        assert {w.id for w in history.writes if w.end < before} <= set(old)
        with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as conn:
            on_global_host = {i for (i,) in sql(conn, "SELECT id FROM public.plans")}
        assert set(plans) <= on_global_host and len(plans) > 3

        # --abort under the same writers: the fleet's writes come back, the writers follow
        back_history = History(path)
        with writing(routers, back_history, plans):
            aborted = cli_json(path, "--abort")
        assert aborted["phase"] == "aborted" and load(path).adoption.authoritative == "source"
        assert {w.client for w in back_history.failures} == set(), back_history.failures[:3]
        with psycopg.connect(src_dsn, autocommit=True) as src:
            rows = dict(sql(src, "SELECT id, user_id FROM photos"))
            assert set(plans) <= {i for (i,) in sql(src, "SELECT id FROM plans")}
            sql(src, "INSERT INTO photos (user_id, caption) VALUES (1, 'writable again')")
        acked = history.writes + back_history.writes
        fleet_made = [w for w in acked if w.id >= ID_FLOOR]  # next_id(): made on the fleet
        assert fleet_made and {w.client for w in back_history.writes if w.id < ID_FLOOR} == {
            "fresh",
            "stale",
        }, "a Router did not write to the old database after the abort"
        assert all(rows.get(w.id) == w.key for w in acked), "an acknowledged write is missing"
        assert set(on_fleet) <= set(rows)
    finally:
        for r in [*routers.values(), *readers.values()]:
            r.close()
    with (
        psycopg.connect(**topo.host("pg2").connect_kwargs(), autocommit=True) as conn,
        pytest.raises(psycopg.Error) as err,
    ):
        sql(conn, "INSERT INTO insta3.photos (user_id) VALUES (3)")
    assert err.value.sqlstate == "42P01"  # the abort took the fleet's tables out of their names
    assert not any(
        "slot" in x or "subscription" in x for v in leftovers(path, src_dsn).values() for x in v
    )


def test_a_stale_router_reading_a_shard_after_the_abort_reads_the_old_database(make_fleet):
    """Routers on a copy of the topology file taken after the cutover (it says ``fleet``), that
    only read: a plain Router, a ``shardctl.sqlalchemy`` session and a ``shardctl.django`` process,
    each on shard 3 of the fleet before the abort, and one reading the global tables. After
    --abort, rows written (and deleted) on the old database directly are in what they read: the
    fleet's tables are out of their names, each read meets undefined_table and follows the fleet
    host's redirect to the old database (the app's schema there), never the fleet's stale rows. A
    direct client of the fleet gets an error, by the shard's name and through the parents' old
    names alike."""
    from sqlalchemy import select

    from shardctl.sqlalchemy import sessionmaker

    Photo = photo_model()

    path, src_dsn = adopting(make_fleet, users=20)
    assert cli_json(path)["phase"] == "cut_over"
    stale_path = stale_copy(path)
    assert load(stale_path).adoption.authoritative == "fleet"
    topo, user = load(path), 3
    fleet_host, schema = topo.host_of(user % SHARDS), topo.schema_name(user % SHARDS)
    read = "SELECT id, caption FROM photos WHERE user_id = %s"
    plans = "SELECT id, name FROM plans"
    routers = [Router(load(stale_path), move_wait=5) for _ in range(3)]
    plain, orm, glob = routers
    session_factory = sessionmaker(orm)
    django = DjangoReader(stale_path, user)

    def orm_read() -> set[tuple]:
        with session_factory() as session:
            return set(
                session.execute(select(Photo.id, Photo.caption).where(Photo.user_id == user))
            )

    try:
        before = set(plain.execute(user, read, (user,)))
        assert before and orm_read() == before == django.read()  # on the fleet
        plans_before = set(glob.execute(None, plans, global_=True))
        assert plans_before
        assert {r._locate(user % SHARDS).name for r in routers[:2]} == {fleet_host.name}
        assert cli_json(path, "--abort")["phase"] == "aborted"
        with psycopg.connect(src_dsn, autocommit=True) as src:
            new = sql(
                src,
                "INSERT INTO photos (user_id, caption) VALUES (%s, 'after the abort') RETURNING id",
                user,
            )[0][0]
            sql(src, "DELETE FROM photos WHERE id = %s", min(i for i, _ in before))
            plan = sql(src, "INSERT INTO plans (name) VALUES ('after the abort') RETURNING id")[0][
                0
            ]
        want = {r for r in before if r[0] != min(i for i, _ in before)} | {(new, "after the abort")}
        assert set(plain.execute(user, read, (user,))) == want
        assert orm_read() == want
        assert django.read() == want
        assert set(glob.execute(None, plans, global_=True)) == plans_before | {
            (plan, "after the abort")
        }
        assert {r._locate(user % SHARDS).name for r in routers[:2]} == {"source"}
    finally:
        django.close()
        for r in routers:
            r.close()
    with psycopg.connect(**fleet_host.connect_kwargs(), autocommit=True) as conn:
        for path_, statement in (
            (None, f"SELECT count(*) FROM {schema}.photos"),
            (f"{schema}, public", "SELECT count(*) FROM photos"),  # the Router's search_path
            (None, "SELECT count(*) FROM public.photos"),
        ):
            if path_:
                sql(conn, f"SET search_path = {path_}")
            with pytest.raises(psycopg.errors.UndefinedTable):
                sql(conn, statement)
    with (
        psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.UndefinedTable),
    ):
        sql(conn, "SELECT count(*) FROM public.plans")  # the global tables' host


def global_rows(conn: psycopg.Connection, table: str = "plans") -> dict:
    """ID -> name of every row of global ``table``."""
    return dict(sql(conn, f"SELECT id, name FROM {table}"))


COUNTRIES = "SELECT code, name, count(*) FROM {} GROUP BY 1, 2 ORDER BY 1, 2"


def pause_way_back(src_dsn: str, pause: bool) -> None:
    """Stop (or start again) every subscription on the old database: the way back."""
    with psycopg.connect(src_dsn, autocommit=True) as src:
        for (name,) in sql(src, "SELECT subname FROM pg_subscription"):
            sql(src, f"ALTER SUBSCRIPTION {name} {'DISABLE' if pause else 'ENABLE'}")


def test_a_stale_router_reading_a_global_table_follows_and_abort_brings_it_back(make_fleet):
    """A Router on a topology copy taken before the cutover that only reads a global table: after
    the cutover and a change of that table on the fleet by another client, it reads the change (its
    old name on the old database is a stub: SCM01, then the redirect to the global host), and a
    direct client gets the one line. The fleet's inserts, updates and deletes of it (a TRUNCATE of
    another global table too, one without a primary key, with equal rows and NULLs) all come back
    with --abort, judged by the global host's rows; the table has its name again."""
    path, src_dsn = adopting(make_fleet, users=40)
    with psycopg.connect(src_dsn, autocommit=True) as src:
        sql(src, "CREATE TABLE countries (code text, name text)")
        sql(src, "ALTER TABLE countries REPLICA IDENTITY FULL")
        sql(src, "INSERT INTO countries VALUES ('fr', 'France'), ('de', 'Germany')")
    topo = load(path)
    with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as glob:
        sql(glob, "CREATE TABLE countries (code text, name text)")
        sql(glob, "INSERT INTO countries VALUES ('fr', 'France'), ('de', 'Germany')")
    path.write_text(path.read_text().replace("globals: [plans]", "globals: [plans, countries]"))
    stale = Router(load(stale_copy(path)), move_wait=15)
    read = "SELECT name FROM plans WHERE id = 2"
    try:
        assert stale.execute(None, read, global_=True) == [("pro",)]  # on the old database
        cli_json(path)
        # the way back lags (here: stopped) and the read does not depend on it
        pause_way_back(src_dsn, True)
        with Router(load(path)) as fresh:
            fresh.execute(None, "UPDATE plans SET name = 'pro+' WHERE id = 2", global_=True)
            fresh.execute(None, "DELETE FROM plans WHERE id = 1", global_=True)
            fresh.execute(None, "INSERT INTO plans (name) VALUES ('enterprise')", global_=True)
            for statement in (
                "TRUNCATE countries",
                (
                    "INSERT INTO countries VALUES ('it', 'Italy'), ('it', 'Italy'), ('es', 'Spain'), "
                    "('es', 'Spain'), ('xx', NULL)"
                ),
                "UPDATE countries SET name = 'unknown' WHERE code = 'xx'",  # its old row: a NULL
                (
                    "DELETE FROM countries WHERE ctid = (SELECT min(ctid) FROM countries "
                    "WHERE code = 'it')"
                ),  # one of two equal rows
                "UPDATE countries SET name = 'España' WHERE code = 'es'",  # both equal rows
            ):
                fresh.execute(None, statement, global_=True)
        assert stale.execute(None, read, global_=True) == [("pro+",)]
        assert stale.execute(
            None, "SELECT DISTINCT code FROM countries ORDER BY 1", global_=True
        ) == [
            ("es",),
            ("it",),
            ("xx",),
        ]
    finally:
        stale.close()
    with psycopg.connect(src_dsn, autocommit=True) as src:
        with pytest.raises(psycopg.Error) as err:
            sql(src, "SELECT name FROM plans")
        message = str(err.value).splitlines()[0]
        assert err.value.sqlstate == "SCM01" and "adopted into the shardctl fleet" in message
        assert "pg1" in message, message
    with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as glob:
        on_fleet = (global_rows(glob), sql(glob, COUNTRIES.format("countries")))
    assert on_fleet[1] == [("es", "España", 2), ("it", "Italy", 1), ("xx", "unknown", 1)]
    assert on_fleet[0][2] == "pro+" and 1 not in on_fleet[0] and len(on_fleet[0]) == 3
    pause_way_back(src_dsn, False)
    with psycopg.connect(src_dsn, autocommit=True) as src:  # the moved table, once it caught up
        deadline = time.monotonic() + 30
        while global_rows(src, "shardctl_adopted.plans") != on_fleet[0]:
            assert time.monotonic() < deadline, "the way back never caught up"
            time.sleep(0.1)
    assert cli_json(path, "--abort")["phase"] == "aborted"
    with psycopg.connect(src_dsn, autocommit=True) as src:
        assert (global_rows(src), sql(src, COUNTRIES.format("countries"))) == on_fleet
        # its name again, no guard, and its sequence past the IDs the fleet gave
        again = sql(src, "INSERT INTO plans (name) VALUES ('writable again') RETURNING id")
        assert again[0][0] > max(on_fleet[0])


def test_cleanup_leaves_nothing_and_refuses_without_verify(make_fleet):
    path, src_dsn = adopting(make_fleet, users=40, verified=False)
    r = run_cli("adopt", "cutover", config=path)
    assert r.exit_code == 2 and "adopt verify never ran" in r.stderr, r
    assert load(path).adoption.authoritative == "source"
    with psycopg.connect(src_dsn, autocommit=True) as src:
        passed_verify(src)
        ids = dict(sql(src, "SELECT id, user_id FROM likes"))
    stale = Router(load(stale_copy(path)), move_wait=15)  # it only reads a global table
    cli_json(path)
    r = run_cli("adopt", "cutover", "--cleanup", "--json", config=path)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    topo = load(path)
    with Router(topo) as fresh:  # nothing carries it back now: the old table is frozen
        fresh.execute(None, "UPDATE plans SET name = 'gold' WHERE id = 3", global_=True)
    with stale:
        assert stale.execute(None, "SELECT name FROM plans WHERE id = 3", global_=True) == [
            ("gold",)
        ]
    assert topo.adoption.source is None and topo.adoption.id_floor == ID_FLOOR
    assert leftovers(path, src_dsn) == {}
    assert {
        i: (topo.host_of(u % SHARDS).name, topo.schema_name(u % SHARDS)) for i, u in ids.items()
    } == fleet_rows(path, "likes")
    with psycopg.connect(src_dsn, autocommit=True) as src:
        assert sql(src, "SELECT phase FROM shardctl_adopt.run") == [("cleaned",)]
        assert dict(
            sql(
                src,
                "SELECT relname, relreplident::text FROM pg_class "
                "WHERE relname IN ('photos', 'likes') AND relkind = 'r'",
            )
        ) == {"photos": "d", "likes": "d"}
        # the stubs stay under the old names: a direct client is still told where the rows went
        with pytest.raises(psycopg.Error) as err:
            sql(src, "SELECT count(*) FROM likes")
        assert err.value.sqlstate == "SCM01" and "pg2" in str(err.value).splitlines()[0]
        with pytest.raises(psycopg.Error) as err:
            sql(src, "SELECT name FROM plans")  # a global table's too
        assert err.value.sqlstate == "SCM01"
        assert sql(src, "SELECT count(*) FROM shardctl_adopted.likes") == [(len(ids),)]
        schemas = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'shardctl\\_adopt%%'"
        assert sorted(sql(src, schemas)) == [("shardctl_adopt",), ("shardctl_adopted",)]
    for host in ("pg1", "pg2"):  # pg1: the global tables' host, its mirrors gone too
        with psycopg.connect(**topo.host(host).connect_kwargs(), autocommit=True) as conn:
            assert sql(conn, schemas) == []
            assert sql(conn, "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'shardctl%%'") == []
            shard_tables = sql(
                conn, "SELECT DISTINCT relreplident::text FROM pg_class WHERE relname = 'likes'"
            )
    assert shard_tables == [("d",)]  # FULL for the way back, DEFAULT again
    assert cli_json(path, "--cleanup")["notes"]  # again: nothing left to do


def test_cleanup_detaches_under_an_app_transaction_without_a_deadlock(make_fleet):
    """--cleanup detaches pg1's shard tables from their parents while an app's transaction there
    reads one of them (photos: the detaches wait for it) and then the others (likes and users, one
    of which is detached before photos). Holding every detached table until the end made a deadlock
    (one side aborted: the cleanup, in CI). Each detach now commits alone and waits briefly: the
    app's reads and commit go through, then the cleanup."""
    path, src_dsn = adopting(make_fleet, users=40)
    cli_json(path)
    topo = load(path)
    shard = topo.schema_name(min(topo.host("pg1").shards))
    app = psycopg.connect(**topo.host("pg1").connect_kwargs())
    sql(app, f"SELECT count(*) FROM {shard}.photos")  # the app's transaction holds its read lock
    outcome: dict[str, object] = {}

    def app_reads_on() -> None:
        try:
            with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as watch:
                deadline = time.monotonic() + 20
                while not sql(
                    watch,
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                    f"{shard}.photos",
                )[0][0]:  # the cleanup waits for the app's table
                    assert time.monotonic() < deadline, "the cleanup never waited for photos"
                    time.sleep(0.005)
            outcome["likes"] = sql(app, f"SELECT count(*) FROM {shard}.likes")[0][0]
            outcome["users"] = sql(app, f"SELECT count(*) FROM {shard}.users")[0][0]
            app.commit()
        except (psycopg.Error, AssertionError) as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=app_reads_on, daemon=True)
    thread.start()
    try:
        r = run_cli("adopt", "cutover", "--cleanup", "--json", config=path)
    finally:
        thread.join(30)
        app.close()
    assert "error" not in outcome, outcome["error"]
    assert outcome["users"] > 0, outcome
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert leftovers(path, src_dsn) == {}


@pytest.mark.parametrize(
    "point",
    [
        "adopt-after-freeze",
        pytest.param("adopt-after-flip", marks=pytest.mark.slow),
        pytest.param("adopt-in-freeze", marks=pytest.mark.slow),
        pytest.param("adopt-after-forward-dropped", marks=pytest.mark.slow),
        pytest.param("adopt-fleet-moved", marks=pytest.mark.slow),
    ],
)
def test_sigkill_at_each_boundary_then_rerun_finishes(make_fleet, point):
    path, src_dsn = adopting(make_fleet, users=40)
    r = crash_at.run(point, "--config", str(path), "adopt", "cutover", "--json")
    assert r.returncode == -9, r.stderr[-2000:]
    cli_json(path)
    assert load(path).adoption.authoritative == "fleet"
    with psycopg.connect(src_dsn, autocommit=True) as src:
        old = dict(sql(src, "SELECT id, user_id FROM shardctl_adopted.photos"))
        assert sql(src, "SELECT phase, detail->>'switched' FROM shardctl_adopt.run") == [
            ("cut_over", "true")
        ]
    assert set(fleet_rows(path, "photos")) == set(old)
    # the way back carries a write made on the fleet into the moved table
    with Router(load(path)) as router:
        new = router.execute(6, "INSERT INTO photos (user_id) VALUES (6) RETURNING id")[0][0]
    came_back(src_dsn, "shardctl_adopted.photos", new)
    assert all(
        k.split(" ")[0] == "parent" or k.split(" ")[1].startswith("shardctl_adopt_back_")
        for v in leftovers(path, src_dsn).values()
        for k in v
    )


def freeze_under_writes(make_fleet, users: int) -> tuple[dict, float]:
    """One cutover of an old database of ``users`` users (4 photos, 2 likes each) while a client
    writes to it directly: the cutover's report, and the longest the client's writes waited (its
    last one waits for the freeze's commit, then meets the guard)."""
    path, src_dsn = adopting(make_fleet, users=users)
    stop, waits = threading.Event(), []

    def writer() -> None:
        with psycopg.connect(src_dsn, autocommit=True) as conn:
            k = 0
            while not stop.is_set():
                k += 1
                t0 = time.monotonic()
                try:
                    sql(
                        conn,
                        "INSERT INTO photos (user_id, caption) VALUES (%s, 'w')",
                        k % users + 1,
                    )
                except psycopg.Error:
                    return  # the guard: the old database took its last write
                finally:
                    waits.append(time.monotonic() - t0)
                time.sleep(0.002)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        result = cli_json(path, "--max-freeze", "0.5")
    finally:
        stop.set()
        thread.join(10)
    cli_json(path, "--cleanup")  # slot names are the server's: the next adoption may reuse them
    return result, max(waits)


def check_freeze(small: tuple[dict, float], big: tuple[dict, float]) -> None:
    print(
        f"\nadopt freeze: {small[0]['freeze_seconds']:.3f}s at 1x, {big[0]['freeze_seconds']:.3f}s "
        f"at 4x; the writer's longest wait {small[1]:.3f}s at 1x, {big[1]:.3f}s at 4x "
        f"(attempts {small[0]['attempts']}, {big[0]['attempts']})"
    )
    for report, wait in (small, big):
        assert 0 < report["freeze_seconds"] <= 0.5
        assert wait <= 0.5 + 0.25  # scheduling slack on a loaded machine (as the move's test)


@pytest.mark.slow
def test_freeze_does_not_grow_with_the_data(make_fleet):
    """The freeze holds no copy and no comparison: at 1x and at 4x the rows, a writer of the old
    database never waits longer than --max-freeze (a failed attempt rolls back in time too)."""
    check_freeze(freeze_under_writes(make_fleet, 150), freeze_under_writes(make_fleet, 600))


@pytest.mark.slow
def test_freeze_does_not_grow_with_the_data_large(make_fleet):
    small, big = freeze_under_writes(make_fleet, 5_000), freeze_under_writes(make_fleet, 20_000)
    check_freeze(small, big)
    assert big[0]["freeze_seconds"] <= 1.5 * small[0]["freeze_seconds"] + 0.3


@pytest.mark.parametrize(
    "point",
    [
        "adopt-abort-fleet-committed",
        pytest.param("adopt-abort-source-open", marks=pytest.mark.slow),
        pytest.param("adopt-cleanup-recorded", marks=pytest.mark.slow),
        pytest.param("adopt-abort-fleet-locked", marks=pytest.mark.slow),
        pytest.param("adopt-abort-flipped", marks=pytest.mark.slow),
        pytest.param("adopt-cleanup-back-dropped", marks=pytest.mark.slow),
    ],
)
def test_sigkill_in_abort_or_cleanup_then_rerun_finishes(make_fleet, point):
    path, src_dsn = adopting(make_fleet, users=40)
    cli_json(path)
    with Router(load(path)) as router:
        new = router.execute(5, "INSERT INTO photos (user_id) VALUES (5) RETURNING id")[0][0]
    action = "--abort" if "abort" in point else "--cleanup"
    r = crash_at.run(point, "--config", str(path), "adopt", "cutover", action, "--json")
    assert r.returncode == -9, r.stderr[-2000:]
    cli_json(path, action)
    table = "photos" if action == "--abort" else "shardctl_adopted.photos"
    with psycopg.connect(src_dsn, autocommit=True) as src:
        phase = sql(src, "SELECT phase FROM shardctl_adopt.run")[0][0]
        on_source = {i for (i,) in sql(src, f"SELECT id FROM {table}")}
    if action == "--abort":
        assert phase == "aborted" and load(path).adoption.authoritative == "source"
        assert new in on_source  # the write made on the fleet came back
        assert not leftovers(path, src_dsn).get("source")
        # the fleet's shard tables out of their names once, whichever run renamed them
        assert new in fleet_rows(path, "photos", aborted=True)
        with pytest.raises(psycopg.errors.UndefinedTable):
            fleet_rows(path, "photos")
    else:
        assert phase == "cleaned" and load(path).adoption.source is None
        assert leftovers(path, src_dsn) == {}
        assert new in fleet_rows(path, "photos")


def same_rows_as_the_old_database(path: Path, dsn: str) -> None:
    """Each old row (posts, votes) once on the fleet, in its key's shard, and no other row."""
    topo = load(path)
    with psycopg.connect(dsn, autocommit=True) as src:
        for table, key in (("forum_post", "author_id"), ("forum_vote", "user_id")):
            want = {
                i: (topo.host_of(k % SHARDS).name, topo.schema_name(k % SHARDS))
                for i, k in sql(src, f"SELECT id, {key} FROM {table}")
            }
            assert fleet_rows(path, table) == want, table


def test_real_copy_verify_cutover_then_abort_carries_back_updates_and_deletes(make_fleet, tmp_path):
    """The whole path on the Django forum's schema with ``adopt copy`` and ``adopt verify``: after the
    cutover, an edit and a delete made on the fleet (a post, whose replica identity on the old
    database is FULL, and a vote) reach the old database through --abort. Then adopt copy starts
    again."""
    path, dsn, plan_file = real_adoption(make_fleet, tmp_path)
    topo = load(path)
    with psycopg.connect(dsn, autocommit=True) as src:  # the old rows, moved at the cutover
        post, author = sql(
            src, "SELECT id, author_id FROM shardctl_adopted.forum_post ORDER BY id LIMIT 1"
        )[0]
        vote, voter = sql(
            src, "SELECT id, user_id FROM shardctl_adopted.forum_vote ORDER BY id LIMIT 1"
        )[0]
        count = sql(src, "SELECT count(*) FROM shardctl_adopted.forum_post")[0][0]
    on_fleet = 0
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            for n in host.shards:
                s = topo.schema_name(n)
                on_fleet += sql(conn, f"SELECT count(*) FROM {s}.forum_post")[0][0]
                if n == author % SHARDS:
                    sql(
                        conn,
                        f"UPDATE {s}.forum_post SET body = 'edited on the fleet' WHERE id = %s",
                        post,
                    )
                if n == voter % SHARDS:
                    sql(conn, f"DELETE FROM {s}.forum_vote WHERE id = %s", vote)
    assert on_fleet == count
    # the delete made on the fleet reaches the id map too (the way back, then the id map's
    # subscription, both by the moved tables' names); its readers keep their query
    id_map = topo.host(topo.adoption.id_map.host if topo.adoption.id_map else "pg1")
    ids_db = topo.adoption.id_map.dbname if topo.adoption.id_map else "shardctl_adopt_ids"
    with psycopg.connect(**id_map.connect_kwargs(dbname=ids_db), autocommit=True) as ids:
        deadline = time.monotonic() + 30
        while sql(ids, "SELECT count(*) FROM public.forum_vote WHERE id = %s", vote) != [(0,)]:
            assert time.monotonic() < deadline, "the fleet's delete never reached the id map"
            time.sleep(0.05)
    assert cli_json(path, "--abort")["phase"] == "aborted"
    with psycopg.connect(dsn, autocommit=True) as src:
        assert sql(src, "SELECT body FROM forum_post WHERE id = %s", post) == [
            ("edited on the fleet",)
        ]
        assert sql(src, "SELECT count(*) FROM forum_vote WHERE id = %s", vote) == [(0,)]
        # the old database as before: the identities adopt copy changed are back
        identities = dict(
            sql(
                src,
                "SELECT relname, relreplident::text FROM pg_class "
                "WHERE relname IN ('forum_post', 'forum_vote')",
            )
        )
    assert identities == {"forum_post": "d", "forum_vote": "d"}
    # no replication object of the adoption is left (the copy's, the way back's, the id map's)
    assert all(x.startswith("parent") for v in leftovers(path, dsn).values() for x in v)

    # A second attempt: adopt copy starts a fresh run; the fleet then holds the old database's
    # rows as they are now (a vote deleted there since the abort is gone), each once in its shard.
    with psycopg.connect(dsn, autocommit=True) as src:
        sql(src, "DELETE FROM forum_vote WHERE id = (SELECT max(id) FROM forum_vote)")
    r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, "--json", config=path)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["phase"] == "synced"
    same_rows_as_the_old_database(path, dsn)
    with psycopg.connect(dsn, autocommit=True) as src:
        assert sql(src, "SELECT phase FROM shardctl_adopt.run") == [("synced",)]
    assert load(path).adoption.id_floor == topo.adoption.id_floor  # the IDs minted meanwhile
    r = run_cli("adopt", "cutover", config=path)
    assert r.exit_code == 2 and "adopt verify never ran" in r.stderr, r  # the old one is stale
    finish_second_attempt(path, dsn, plan_file)


def test_abort_brings_back_the_fleets_writes_to_a_table_routed_by_trigger(make_fleet, tmp_path):
    """The task tracker's tasks (an enum column whose type is each shard's own: adopt copy routes it
    by trigger, it has no parent) copied, verified and cut over; on the fleet a task is inserted, one
    updated (its enum value changed) and one deleted, and a writer inserts tasks there during the
    abort. --abort then gives the old database exactly the fleet's tasks (every insert acknowledged
    before the abort's guard stopped the writer), the app's table takes writes again and no mirror
    trigger is left on the fleet."""
    path, dsn, _ = real_adoption(make_fleet, tmp_path, "tasks_prisma")
    topo = load(path)
    with psycopg.connect(dsn, autocommit=True) as src:
        assert sql(src, "SELECT detail -> 'routed' FROM shardctl_adopt.run") == [(["tasks"],)]
        (edit, edit_user, status), (gone, gone_user) = (
            sql(
                src,
                "SELECT id, user_id, status::text FROM shardctl_adopted.tasks ORDER BY id LIMIT 1",
            )[0],
            sql(src, "SELECT id, user_id FROM shardctl_adopted.tasks ORDER BY id DESC LIMIT 1")[0],
        )
    new_status = "DONE" if status != "DONE" else "TODO"
    home = {n: (topo.host_of(n), topo.schema_name(n)) for n in range(SHARDS)}
    host, s = home[edit_user % SHARDS]
    with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
        sql(
            conn,
            f"UPDATE {s}.tasks SET status = %s, title = 'edited on the fleet' WHERE id = %s",
            new_status,
            edit,
        )
        made = sql(
            conn,
            f"INSERT INTO {s}.tasks (project_id, user_id, title, status) SELECT project_id, "
            f"user_id, 'made on the fleet', 'DOING' FROM {s}.tasks WHERE id = %s RETURNING id",
            edit,
        )[0][0]
    host, s = home[gone_user % SHARDS]
    with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
        assert sql(conn, f"DELETE FROM {s}.tasks WHERE id = %s RETURNING id", gone) == [(gone,)]

    # and a writer on the fleet during the abort: what it was told is written comes back too
    acked: list[int] = []
    stopped: list[psycopg.Error] = []

    def write() -> None:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            while True:
                try:
                    acked.extend(
                        sql(
                            conn,
                            f"INSERT INTO {s}.tasks (project_id, user_id, title, status) SELECT "
                            f"project_id, user_id, 'during the abort', 'TODO' FROM {s}.tasks "
                            f"WHERE id = %s RETURNING id",
                            made,
                        )[0]
                    )
                except psycopg.Error as exc:
                    stopped.append(exc)
                    return
                time.sleep(0.002)

    host, s = home[edit_user % SHARDS]
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(0.3)
    assert cli_json(path, "--abort")["phase"] == "aborted"
    writer.join(30)
    # the abort took its table out of its name: undefined_table (a Router follows the redirect)
    assert stopped and stopped[0].sqlstate == "42P01", stopped
    want = fleet_tasks(path, aborted=True)
    assert want[edit]["status"] == new_status and made in want and gone not in want
    assert len(acked) > 10 and set(acked) <= set(want), len(acked)
    with psycopg.connect(dsn, autocommit=True) as src:
        got = dict(sql(src, "SELECT id, to_jsonb(t) FROM public.tasks t"))
        assert got == want
        # the app's table takes writes again, its enum values included
        sql(src, "UPDATE tasks SET status = 'TODO' WHERE id = %s", made)
        sql(
            src,
            "INSERT INTO tasks (project_id, user_id, title, status) "
            "SELECT project_id, user_id, 'after the abort', 'DONE' FROM tasks WHERE id = %s",
            made,
        )
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            assert sql(conn, "SELECT tgname FROM pg_trigger WHERE tgname LIKE '%%mirror%%'") == []
    assert all(x.startswith("parent") for v in leftovers(path, dsn).values() for x in v)


async def open_async_router(path: Path) -> AsyncRouter:
    """An AsyncRouter on topology ``path`` (made in the loop that will run it)."""
    return AsyncRouter(load(path), move_wait=5)


def pause_copy(path: Path, pause: bool) -> None:
    """Stop (or start again) the copy's subscriptions on every fleet host."""
    for host in load(path).hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            for (name,) in sql(
                conn,
                "SELECT subname FROM pg_subscription "
                "WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            ):
                sql(conn, f"ALTER SUBSCRIPTION {name} {'DISABLE' if pause else 'ENABLE'}")


def test_stale_routers_use_the_old_database_while_the_next_copy_refills_the_fleet(
    make_fleet, tmp_path, monkeypatch
):
    """Across an --abort and the next ``adopt copy``: Routers on a copy of the file taken after the
    cutover (it says ``fleet``) that last used the shard before the abort, a plain Router, an
    AsyncRouter, a ``shardctl.sqlalchemy`` session and a ``shardctl.django`` process; and a Router on
    a copy older than the cutover (``source``), which the old database's redirect sent to the fleet.
    The new copy refills the
    fleet's tables under their names; with its subscriptions paused, the old database's rows
    differ from the fleet's. Each of them reads the old database's rows and writes there, as the
    old database itself shows, and the fleet's tables do not change. After the next cutover their
    writes are on the fleet. A cutover attempt that fails after the fleet's side of its freeze
    committed leaves the fleet's redirects as they were."""
    from sqlalchemy import BigInteger, Column, Integer, Text, select, update
    from sqlalchemy.orm import declarative_base

    from shardctl.sqlalchemy import sessionmaker

    class Post(declarative_base()):
        __tablename__ = "forum_post"
        __shard_key__, __shard_key_is_id__ = "author_id", True
        id = Column(BigInteger, primary_key=True)
        author_id = Column(Integer)
        body = Column(Text)

    path, dsn, plan_file = real_adoption(make_fleet, tmp_path)
    stale_path, topo = stale_copy(path), load(path)
    older_path = stale_copy(path, "older.yaml")
    flip_adoption(older_path, "source")  # as the file was before the cutover
    with psycopg.connect(dsn, autocommit=True) as src:
        (author,) = sql(
            src,
            "SELECT author_id FROM shardctl_adopted.forum_post GROUP BY 1 HAVING count(*) >= 3 "
            "ORDER BY 1 LIMIT 1",
        )[0]
    shard_table = f"{topo.schema_name(author % SHARDS)}.forum_post"
    read = "SELECT id, body FROM forum_post WHERE author_id = %s"

    def on_fleet() -> set[tuple]:
        with psycopg.connect(**topo.host_of(author % SHARDS).connect_kwargs()) as conn:
            return set(
                sql(conn, f"SELECT id, body FROM {shard_table} WHERE author_id = %s", author)
            )

    def on_old_database() -> set[tuple]:
        with psycopg.connect(dsn) as conn:
            return set(
                sql(conn, "SELECT id, body FROM public.forum_post WHERE author_id = %s", author)
            )

    router, orm = Router(load(stale_path), move_wait=5), Router(load(stale_path), move_wait=5)
    older = Router(load(older_path), move_wait=5)
    session_factory = sessionmaker(orm)
    django = DjangoReader(stale_path, author, "--posts")

    def orm_read() -> set[tuple]:
        with session_factory() as session:
            return set(session.execute(select(Post.id, Post.body).where(Post.author_id == author)))

    loop = asyncio.new_event_loop()
    async_router = loop.run_until_complete(open_async_router(stale_path))

    def async_read() -> set[tuple]:
        return set(loop.run_until_complete(async_router.execute(author, read, (author,))))

    try:
        before = set(router.execute(author, read, (author,)))
        assert len(before) >= 3 and orm_read() == before == django.read() == on_fleet()
        assert async_read() == before
        assert set(older.execute(author, read, (author,))) == before  # the redirect to the fleet
        assert older._locate(author % SHARDS).name == topo.host_of(author % SHARDS).name
        assert cli_json(path, "--abort")["phase"] == "aborted"
        r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, config=path)
        assert r.exit_code == 0, r
        pause_copy(path, True)
        first, second, third = sorted(i for i, _ in before)[:3]
        with psycopg.connect(dsn, autocommit=True) as src:
            sql(src, "UPDATE forum_post SET body = 'old database' WHERE id = %s", first)
        refilled = on_fleet()
        assert refilled == before, "the new copy did not refill the shard's table"
        want = {(i, "old database" if i == first else b) for i, b in before}
        assert set(router.execute(author, read, (author,))) == want
        assert orm_read() == want
        assert django.read() == want
        assert async_read() == want
        assert set(older.execute(author, read, (author,))) == want
        router.execute(author, "UPDATE forum_post SET body = 'router' WHERE id = %s", (second,))
        with session_factory() as session:
            session.execute(
                update(Post)
                .where(Post.author_id == author, Post.id == third)
                .values(body="sqlalchemy")
            )
            session.commit()
        written = {first: "old database", second: "router", third: "sqlalchemy"}
        want = {(i, written.get(i, b)) for i, b in before}
        assert on_old_database() == want
        assert django.edit(first, "django") == {(i, "django" if i == first else b) for i, b in want}
        want = {(i, "django" if i == first else b) for i, b in want}
        assert on_old_database() == want
        assert on_fleet() == refilled, "a stale Router wrote to the refilling fleet"
        pause_copy(path, False)
        r = run_cli(
            "adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0", config=path
        )
        assert r.exit_code == 0, r

        def fail() -> None:
            raise FreezeTimeout("the test's failure once the fleet's side committed")

        def fleet_redirect() -> list[tuple]:
            with psycopg.connect(**topo.host_of(author % SHARDS).connect_kwargs()) as conn:
                return sql(
                    conn, "SELECT host FROM shardctl.redirects WHERE shard_id = %s", author % SHARDS
                )

        monkeypatch.setitem(HOOKS, "adopt-fleet-moved", fail)
        r = run_cli("adopt", "cutover", "--attempts", "1", config=path)
        monkeypatch.delitem(HOOKS, "adopt-fleet-moved")
        assert r.exit_code == 1 and "the test's failure" in r.stderr, r
        assert fleet_redirect() == [("source",)]
        assert set(older.execute(author, read, (author,))) == want
        # killed once the freeze's fleet side committed: the next run's preparation puts the
        # redirects back before it freezes (this one fails in its freeze, before the fleet side)
        r = crash_at.run("adopt-fleet-moved", "--config", str(path), "adopt", "cutover")
        assert r.returncode == -9, r.stderr[-2000:]
        assert fleet_redirect() == []
        monkeypatch.setitem(HOOKS, "adopt-in-freeze", fail)
        r = run_cli("adopt", "cutover", "--attempts", "1", config=path)
        monkeypatch.delitem(HOOKS, "adopt-in-freeze")
        assert r.exit_code == 1 and "the test's failure" in r.stderr, r
        assert fleet_redirect() == [("source",)]
        assert set(older.execute(author, read, (author,))) == want
        r = run_cli("adopt", "cutover", config=path)
        assert r.exit_code == 0, r
        assert on_fleet() == want
        assert set(router.execute(author, read, (author,))) == want == orm_read()
        assert django.read() == want == async_read()
        assert set(older.execute(author, read, (author,))) == want
    finally:
        django.close()
        router.close()
        orm.close()
        older.close()
        loop.run_until_complete(async_router.close())
        loop.close()
    r = run_cli("adopt", "cutover", "--cleanup", config=path)
    assert r.exit_code == 0, r
    assert leftovers(path, dsn) == {}


@pytest.mark.slow
def test_sigkill_in_the_copy_after_an_abort_then_rerun_starts_again(make_fleet, tmp_path):
    """adopt copy after an abort, killed once the fleet was emptied: run again, it starts the new run
    and the fleet holds the old database's rows (written to meanwhile)."""
    path, dsn, plan_file = real_adoption(make_fleet, tmp_path)
    assert cli_json(path, "--abort")["phase"] == "aborted"
    copy = ("adopt", "copy", "--from", dsn, "--plan", str(plan_file), "--json")
    r = crash_at.run("adopt-restart-cleared", "--config", str(path), *copy)
    assert r.returncode == -9, r.stderr[-2000:]
    with psycopg.connect(dsn, autocommit=True) as src:
        assert sql(src, "SELECT phase FROM shardctl_adopt.run") == [("aborted",)]
        sql(src, "DELETE FROM forum_vote WHERE id = (SELECT min(id) FROM forum_vote)")
    r = run_cli(*copy, config=path)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    same_rows_as_the_old_database(path, dsn)
    finish_second_attempt(path, dsn, plan_file)


def test_sqlalchemy_session_follows_the_cutover_into_the_shard_schema(make_fleet):
    """A ``shardctl.sqlalchemy`` session on a topology copy that still says ``authoritative: source``:
    its first statement after the cutover meets the old database's guard, follows the redirect to
    the fleet host and runs again there in the shard's schema, not in the old database's ``public``
    (where the copy's parent stays until the cleanup)."""
    from shardctl.sqlalchemy import sessionmaker

    Photo = photo_model()

    path, _ = adopting(make_fleet, users=20)
    router = Router(load(stale_copy(path)))
    try:
        session_factory = sessionmaker(router)
        with session_factory() as session:  # on the old database
            assert session.get(Photo, 1) is not None
        assert cli_json(path)["phase"] == "cut_over"
        with session_factory() as session:
            photo = Photo(user_id=3, caption="after the cutover")
            session.add(photo)
            session.commit()
            new_id = photo.id
    finally:
        router.close()
    topo = load(path)
    assert new_id >= ID_FLOOR
    assert fleet_rows(path, "photos")[new_id] == (topo.host_of(3).name, topo.schema_name(3))


def django_photo(path: Path, user_id: int) -> int:
    """The ID of a photo of ``user_id`` created by shardctl.django (tests/support/django_photo.py)."""
    pytest.importorskip("django")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["SHARDCTL_CONFIG"] = str(path)
    script = Path(__file__).resolve().parents[1] / "support" / "django_photo.py"
    result = subprocess.run(
        [sys.executable, str(script), str(user_id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])["id"]


class DjangoReader:
    """A Django process (tests/support/django_photo.py --reads) on topology ``path``: each
    :meth:`read` the (id, caption) of every photo of ``user``, by ``filter(user_id=)``; with
    ``mode`` ``--posts``, the (id, body) of every forum post of author ``user``, and :meth:`edit`."""

    def __init__(self, path: Path, user: int, mode: str = "--reads"):
        pytest.importorskip("django")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["SHARDCTL_CONFIG"] = str(path)
        script = Path(__file__).resolve().parents[1] / "support" / "django_photo.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode, str(user)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self, line: str = "read") -> set[tuple]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise AssertionError(self.proc.stderr.read()[-3000:])
        return {tuple(r) for r in json.loads(line)["rows"]}

    def edit(self, post: int, body: str) -> set[tuple]:
        """Set post ``post``'s body (``--posts``), then :meth:`read`."""
        return self.read(f"edit {post} {body}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()
        self.proc.stderr.close()


def test_django_creates_rows_keyed_by_an_old_user_id(make_fleet):
    """``Photo.objects.create(user_id=<an old user's ID>)`` with ``shard_key_is_id``: on the old
    database before the cutover, on that user's shard (``id % N``) after it."""
    path, src_dsn = adopting(make_fleet, users=20)
    before = django_photo(path, 3)
    with psycopg.connect(src_dsn, autocommit=True) as src:
        assert sql(src, "SELECT user_id FROM photos WHERE id = %s", before) == [(3,)]
    assert cli_json(path)["phase"] == "cut_over"
    after = django_photo(path, 3)
    topo = load(path)
    assert after >= ID_FLOOR
    assert fleet_rows(path, "photos")[after] == (topo.host_of(3).name, topo.schema_name(3))


def new_users_rows(path: Path) -> dict[str, dict[int, int]]:
    """After the cutover, a new user on every shard (its ID from that shard's next_id()) and rows
    keyed by each one's ID, written through the Router, shardctl.django and shardctl.sqlalchemy:
    table -> {row ID: the shard its key names (the user's ID's own)}."""
    from sqlalchemy import BigInteger, Column, Text
    from sqlalchemy.orm import declarative_base

    from shardctl.sqlalchemy import sessionmaker

    Base = declarative_base()

    class User(Base):
        __tablename__, __shard_key__ = "users", "username"
        id = Column(BigInteger, primary_key=True)
        username = Column(Text)

    class Photo(Base):
        __tablename__ = "photos"
        __shard_key__, __shard_key_is_id__ = "user_id", True
        id = Column(BigInteger, primary_key=True)
        user_id = Column(BigInteger)
        caption = Column(Text)

    topo = load(path)
    made: dict[str, dict[int, int]] = {"users": {}, "photos": {}, "likes": {}}
    with Router(topo) as router:
        for n in range(SHARDS):
            user = router.execute(
                query="INSERT INTO users (username) VALUES (%s) RETURNING id",
                params=(f"new{n}",),
                shard=n,
            )[0][0]
            assert user >= ID_FLOOR and topo.layout.shard_of(user) == n
            photo = router.execute(
                query="INSERT INTO photos (user_id, caption) VALUES (%s, 'new') RETURNING id",
                params=(user,),
                id=user,
            )[0][0]
            like = router.execute(
                query="INSERT INTO likes (photo_id, user_id) VALUES (%s, %s) RETURNING id",
                params=(photo, user),
                id=user,
            )[0][0]
            made["users"][user], made["photos"][photo], made["likes"][like] = n, n, n
        with sessionmaker(router)() as session:
            alice = User(username="alice")  # the shard of its name
            session.add(alice)
            session.commit()
            photo = Photo(user_id=alice.id, caption="by sqlalchemy")
            session.add(photo)
            session.commit()
            n = topo.layout.shard_of(alice.id)
            made["users"][alice.id], made["photos"][photo.id] = n, n
    for user, n in list(made["users"].items())[:2]:
        made["photos"][django_photo(path, user)] = n
    return made


def placed(path: Path, made: dict[str, dict[int, int]]) -> None:
    """Each row of ``made`` is once on the fleet, in its shard's schema on its host."""
    topo = load(path)
    for table, rows in made.items():
        on_fleet = fleet_rows(path, table)
        for i, n in rows.items():
            assert on_fleet.get(i) == (topo.host_of(n).name, topo.schema_name(n)), (table, i, n)


@pytest.mark.parametrize("end", ["--cleanup", pytest.param("--abort", marks=pytest.mark.slow)])
def test_a_new_users_rows_are_written_between_the_cutover_and_its_end(make_fleet, end):
    """Until --cleanup the shard tables are the partitions of the copy's parents: their bound is the
    Router's rule (an old key by its remainder, a next_id() ID by its shard bits), so a new user and
    its rows, placed by their IDs' bits, are taken (with ``key % N`` they were refused: "violates
    partition constraint"). After --cleanup they stay where they are; --abort brings them back to
    the old database, big next_id() IDs and all."""
    path, src_dsn = adopting(make_fleet, users=20)
    assert cli_json(path)["phase"] == "cut_over"
    made = new_users_rows(path)
    placed(path, made)
    cli_json(path, end)
    if end == "--cleanup":
        placed(path, made)
        return
    with psycopg.connect(src_dsn, autocommit=True) as src:
        for table, rows in made.items():
            there = {i for (i,) in sql(src, f"SELECT id FROM {table} WHERE id >= %s", ID_FLOOR)}
            assert set(rows) <= there, table


def test_a_get_by_an_old_id_routed_before_the_flip_finds_its_row_after_it(make_fleet):
    """The race at the cutover, made deterministic: a get by a like's old ID is routed while the old
    database is authoritative, and runs after the topology flipped to the fleet. The shard it was
    routed to must be the like's own (its user's), not ``id % N``, which on the fleet is another
    shard that does not have it."""
    path, src_dsn = adopting(make_fleet, users=20)
    with psycopg.connect(src_dsn, autocommit=True) as src:
        likes = sql(src, "SELECT id, user_id FROM likes WHERE id %% 4 <> user_id %% 4 LIMIT 3")
    assert likes
    get = "SELECT user_id FROM likes WHERE id = %s"
    with Router(load(path)) as router:
        routed = [router.resolve(id=i, table="likes") for i, _ in likes]  # on the old database
        assert cli_json(path)["phase"] == "cut_over"  # the flip
        for (i, user), shard in zip(likes, routed):
            assert router.execute(query=get, params=(i,), shard=shard) == [(user,)], (i, shard)
            assert router.placement.locate(shard).name != "source"  # it ran on the fleet


@contextmanager
def id_map(path: Path, src_dsn: str) -> Iterator[psycopg.Connection]:
    """The adopting fleet's id map (``ensure_id_map``, as ``adopt copy`` makes it), named in the
    topology and caught up; a connection to its database for the block; dropped after it."""
    topo = load(path)
    name = "ids_" + psycopg.conninfo.conninfo_to_dict(src_dsn)["dbname"]
    topo = write_adoption(path, dataclasses.replace(topo.adoption, id_map=IdMap("pg1", name)))
    try:
        ensure_id_map(topo, topo.adoption.source)
        wait_id_map(topo, topo.adoption.source)
        with psycopg.connect(**topo.host("pg1").connect_kwargs(), dbname=name) as conn:
            conn.autocommit = True
            yield conn
    finally:
        drop_id_map(topo, None, connect_timeout=3)


def test_the_freeze_waits_for_the_id_map(make_fleet):
    """A photo written just before the freeze is found by its old ID right after the cutover: the
    freeze's wait for lag 0 includes the id map's subscription. With it stopped, the cutover cannot
    start (it names the id map's subscription, freezes nothing, the old database stays
    authoritative); once it runs again the cutover does, and each such photo is found by ID with
    table=."""
    path, src_dsn = adopting(make_fleet, users=20)
    with id_map(path, src_dsn) as ids:
        sql(ids, "ALTER SUBSCRIPTION shardctl_adopt_ids DISABLE")
        with psycopg.connect(src_dsn, autocommit=True) as src:
            photos = [  # one of the two has id % 4 <> user_id % 4 (consecutive IDs)
                (sql(src, "INSERT INTO photos (user_id) VALUES (%s) RETURNING id", u)[0][0], u)
                for u in (1, 3)
            ]
        r = run_cli("adopt", "cutover", "--max-freeze", "0.3", "--attempts", "1", config=path)
        said = "shardctl_adopt_ids (no subscriber streaming); nothing was frozen"
        assert r.exit_code == 1 and said in r.stderr, r
        assert load(path).adoption.authoritative == "source"
        sql(ids, "ALTER SUBSCRIPTION shardctl_adopt_ids ENABLE")
        wait_id_map(load(path), load(path).adoption.source)
        assert cli_json(path)["phase"] == "cut_over"
        with Router(load(path)) as router:
            for i, user in photos:
                assert router.execute(
                    query="SELECT user_id FROM photos WHERE id = %s",
                    params=(i,),
                    id=i,
                    table="photos",
                ) == [(user,)], i


def test_failed_freezes_roll_back_and_the_old_database_stays_authoritative(make_fleet, monkeypatch):
    """pg1's subscription is disabled inside the freeze (its apply worker goes): lag 0 never comes,
    the attempt gives up within --max-freeze, and a writer of the old database never waits longer.
    Run again with the subscription still disabled, the cutover sees before any freeze that pg1's
    subscriber does not stream, and says so without freezing. After both, the old database takes
    writes, unguarded and without redirects, still authoritative."""
    path, src_dsn = adopting(make_fleet, users=40)
    topo = load(path)
    stop, waits, errors = threading.Event(), [], []

    def writer() -> None:
        with psycopg.connect(src_dsn, autocommit=True) as conn:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    sql(conn, "INSERT INTO photos (user_id, caption) VALUES (4, 'w')")
                except psycopg.Error as exc:
                    errors.append(exc)
                    return
                waits.append(time.monotonic() - t0)
                time.sleep(0.005)

    def disable_pg1() -> None:
        with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as conn:
            sql(conn, "ALTER SUBSCRIPTION shardctl_adopt_pg1 DISABLE")

    monkeypatch.setitem(HOOKS, "adopt-in-freeze", disable_pg1)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        r = run_cli("adopt", "cutover", "--max-freeze", "0.3", "--attempts", "1", config=path)
        monkeypatch.delitem(HOOKS, "adopt-in-freeze")
        frozen_waits, waits[:] = list(waits), []
        again = run_cli("adopt", "cutover", "--max-freeze", "0.3", config=path)
    finally:
        stop.set()
        thread.join(10)
    assert r.exit_code == 1 and "gave up after 1 attempts" in r.stderr, r
    assert "shardctl_adopt_pg1 (no subscriber streaming)" in r.stderr, r.stderr
    assert not errors, errors[:1]
    assert max(frozen_waits) <= 0.3 + 0.25, max(frozen_waits)
    assert again.exit_code != 0, again
    assert again.stderr.strip().splitlines()[-1] == (
        "error: cutover: the copy's subscriptions are not applying the old database's changes: "
        "shardctl_adopt_pg1 (no subscriber streaming); nothing was frozen (see `shardctl adopt "
        "status`)"
    ), again.stderr
    assert max(waits) <= 0.25, max(waits)  # nothing was frozen
    assert load(path).adoption.authoritative == "source"
    with psycopg.connect(src_dsn, autocommit=True) as src:
        sql(src, "INSERT INTO photos (user_id, caption) VALUES (4, 'after')")
        assert sql(src, "SELECT phase FROM shardctl_adopt.run") == [("synced",)]
        assert sql(src, "SELECT count(*) FROM shardctl.redirects") == [(0,)]


def test_an_app_queued_behind_the_freeze_is_never_its_deadlock_victim(make_fleet, monkeypatch):
    """An app transaction that read users (so holds its read lock) writes photos during the freeze
    and queues behind the freeze's lock; the freeze then waits for the read lock on users to move
    that table: a deadlock across two tables, which PostgreSQL finds only by its check after
    deadlock_timeout (1 s) of waiting, in whichever backend waited first: the app's. With
    --max-freeze above that, the app's transaction would be aborted. The freeze must give up first:
    the app's write commits, and the next attempt cuts over with that row on the fleet."""
    path, src_dsn = adopting(make_fleet, users=40)
    app = psycopg.connect(src_dsn)
    sql(app, "SELECT count(*) FROM users")  # the app's transaction holds the table's read lock
    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            app.execute("INSERT INTO photos (user_id, caption) VALUES (4, 'queued')")
            app.commit()
            outcome["committed"] = True
        except psycopg.Error as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=write, daemon=True)

    def queue_the_app() -> None:
        """In the first attempt, once the freeze holds its locks: the app's write queues."""
        if thread.ident is not None:
            return
        thread.start()
        with psycopg.connect(src_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 10
            while not sql(
                watch,
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                app.info.backend_pid,
            )[0][0]:
                assert time.monotonic() < deadline, "the app's write did not queue"
                time.sleep(0.005)

    monkeypatch.setitem(HOOKS, "adopt-in-freeze", queue_the_app)
    try:
        result = cli_json(path, "--max-freeze", "3", "--attempts", "3")
    finally:
        thread.join(10)
        app.close()
    assert "error" not in outcome, outcome["error"]
    assert outcome == {"committed": True}, outcome
    assert result["phase"] == "cut_over" and result["attempts"] == 2, result
    with psycopg.connect(src_dsn, autocommit=True) as src:
        queued = sql(src, "SELECT id FROM shardctl_adopted.photos WHERE caption = 'queued'")
    assert len(queued) == 1 and queued[0][0] in fleet_rows(path, "photos"), queued


@pytest.mark.slow
def test_a_long_read_of_the_old_tables_delays_the_cutover_and_nothing_breaks(make_fleet):
    """Moving the old tables under their stubs waits for their readers' locks: an attempt that meets
    a read longer than --max-freeze gives up in time and the next one, after the read, goes through."""
    path, src_dsn = adopting(make_fleet, users=40)
    with psycopg.connect(src_dsn) as reader:
        sql(reader, "SELECT count(*) FROM photos")  # its transaction holds the table's read lock
        release = threading.Timer(1.0, reader.rollback)
        release.start()
        try:
            result = cli_json(path, "--max-freeze", "0.3", "--attempts", "5")
        finally:
            release.join()
    assert result["phase"] == "cut_over" and result["attempts"] > 1, result
    assert any("attempt 1" in n for n in result["notes"]), result["notes"]
    with psycopg.connect(src_dsn, autocommit=True) as src:
        old = {i for (i,) in sql(src, "SELECT id FROM shardctl_adopted.photos")}
    assert set(fleet_rows(path, "photos")) == old


@pytest.mark.slow
def test_a_long_read_of_the_fleets_tables_delays_the_abort_and_nothing_breaks(make_fleet):
    """Renaming the fleet's shard tables at --abort waits for their readers' locks (as the cutover's
    move of the old tables does): an attempt that meets a read longer than --max-freeze gives up in
    time, writes resume on the fleet, and the next one, after the read, goes through. The read ends
    once an attempt was seen waiting for it and giving up (whatever the machine's load)."""
    path, src_dsn = adopting(make_fleet, users=40)
    assert cli_json(path)["phase"] == "cut_over"
    topo = load(path)
    host, table = topo.host_of(3), f"{topo.schema_name(3)}.photos"
    waiting = "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted"
    with psycopg.connect(**host.connect_kwargs()) as reader:
        sql(reader, f"SELECT count(*) FROM {table}")  # its transaction holds the read lock

        def release() -> None:
            with psycopg.connect(**host.connect_kwargs(), autocommit=True) as watch:
                deadline = time.monotonic() + 60
                for blocked in (False, True):  # until an attempt waits, then until it gave up
                    while (sql(watch, waiting, table)[0][0] > 0) == blocked:
                        assert time.monotonic() < deadline, "no attempt waited for the read"
                        time.sleep(0.01)
            reader.rollback()

        releaser = threading.Thread(target=release, daemon=True)
        releaser.start()
        try:
            result = cli_json(path, "--abort", "--max-freeze", "1", "--attempts", "5")
        finally:
            releaser.join(60)
    assert result["phase"] == "aborted", result
    assert any("abort, attempt 1" in n for n in result["notes"]), result["notes"]
    with psycopg.connect(src_dsn, autocommit=True) as src:
        old = {i for (i,) in sql(src, "SELECT id FROM photos")}
    assert set(fleet_rows(path, "photos", aborted=True)) == old
