"""Old IDs after an adoption (#39 item 4): the Prisma task tracker of tests/data/apps on an old
database, adopted into a 2-host fleet of 4 shards.

The id map is filled by PostgreSQL's logical replication from the old database (``ensure_id_map``),
and judged against the old database's own rows, key changes included. The fleet's shards are filled
BY HAND here (a COPY per shard of the rows whose key is on it), standing in for ``adopt copy``
(helper ``copy``), which had not landed when this was written; the routing under test reads only
what the shards hold, so how they were filled does not matter to it.

Round trips are counted by the servers: ``pg_stat_statements`` counts each statement run in each
database, and a Router statement is one round trip (BEGIN, settings, the statement and COMMIT in one
text). A get by a pre-adoption ID runs the app's statement in exactly one database, and the id map's
lookup at most once: never a fan-out over the shards.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import select
from support.apps import apply_fixes, load_app
from support.fleet import load, run_cli, stale_copy
from support.statements import Statements

from shardctl.errors import BadInput
from shardctl.ids.old_ids import id_floor
from shardctl.model.adoption import Adoption, tables_from_plan
from shardctl.model.topology_file import flip_adoption, write_adoption
from shardctl.ops.adopt.id_map import drop_id_map, ensure_id_map, wait_id_map
from shardctl.ops.adopt.plan import source_host
from shardctl.ops.adopt.state import slot_name
from shardctl.router import AsyncRouter, Router
from shardctl.sqlalchemy import sessionmaker


def orm_models():
    """SQLAlchemy models of two of the app's tables (the columns these tests read)."""
    from sqlalchemy import BigInteger, Column, Text
    from sqlalchemy.orm import declarative_base

    Base = declarative_base()

    class User(Base):
        __tablename__ = "users"
        id = Column(BigInteger, primary_key=True)
        email = Column(Text)

    class Plan(Base):  # a global table
        __tablename__ = "plans"
        id = Column(BigInteger, primary_key=True)
        name = Column(Text)

    class Task(Base):
        __tablename__ = "tasks"
        __shard_key__ = "user_id"
        id = Column(BigInteger, primary_key=True)
        title = Column(Text)
        user_id = Column(BigInteger)

    return User, Task, Plan


def django_get(path, task_id: int) -> dict:
    """``Task.objects.get(pk=task_id)`` and its save, by shardctl.django (tests/support/django_adopt.py)."""
    pytest.importorskip("django")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["SHARDCTL_CONFIG"] = str(path)
    script = Path(__file__).resolve().parents[1] / "support" / "django_adopt.py"
    result = subprocess.run(
        [sys.executable, str(script), str(task_id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


ROUTING = "routing:\n  key: user_id\nplacement:\n  global_host: pg2\n"
MAPPED = ("AuditLog", "projects", "tasks")  # sharded, with an ID column, not the root (users)


def adopted_fleet(make_fleet, tmp_path):
    """(topology path, the old database's DSN, the plan): the app loaded and its plan's fixes run on
    the old database, its baseline init'ed on the fleet (shards empty)."""
    path = make_fleet(hosts=2, shards=4, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    src = make_fleet.new_database(0)
    load_app(src, "tasks_prisma", users=24)
    r = run_cli("adopt", "plan", "--from", src, "--json", config=path)
    apply_fixes(src, "tasks_prisma", json.loads(r.stdout))
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("adopt", "plan", "--from", src, "--out", plan_file, "--json", config=path)
    assert r.exit_code == 0, r
    plan = json.loads(r.stdout)
    assert (
        run_cli("adopt", "baseline", "--from", src, "--plan", plan_file, config=path).exit_code == 0
    )
    assert run_cli("init", config=path).exit_code == 0
    return path, src, plan


def filled(topo, src: str, plan: dict) -> None:
    """Every shard filled with its keys' rows as the old database has them now (checked), and the
    global table ``plans`` on the global host, in ``public``."""
    fill_shards(topo, src, plan)
    with (
        psycopg.connect(**topo.host(topo.global_host).connect_kwargs("admin")) as g,
        psycopg.connect(src) as s,
    ):
        g.execute(
            "CREATE TABLE public.plans (id integer PRIMARY KEY, name text, price_cents integer)"
        )
        with (
            s.cursor().copy("COPY plans TO STDOUT") as out,
            g.cursor().copy("COPY public.plans FROM STDIN") as into,
        ):
            for data in out:
                into.write(data)
    for name, t in tables_from_plan(plan)[0].items():
        on_shards = set()
        for n in range(topo.shard_count):
            on_shards |= pairs(
                topo.host_of(n).dsn_for("admin"), name, t.id or t.key, t.key, topo.schema_name(n)
            )
        assert on_shards == pairs(src, name, t.id or t.key, t.key), name


def fill_shards(topo, src: str, plan: dict) -> None:
    """Each sharded table's rows into the shard of their key (rows with a NULL key stay behind), in
    any table order: foreign keys are not checked, as a subscription's apply does not check them."""
    tables, _ = tables_from_plan(plan)
    targets = {h.name: psycopg.connect(**h.connect_kwargs("admin")) for h in topo.hosts}
    for conn in targets.values():
        conn.execute("SET session_replication_role = replica")
    with psycopg.connect(src) as s:
        for t in tables.values():
            for n in range(topo.shard_count):
                h = targets[topo.host_of(n).name]
                query = sql.SQL(
                    "COPY (SELECT * FROM public.{} WHERE {} %% %s = %s) TO STDOUT"
                ).format(sql.Identifier(t.name), sql.Identifier(t.key))
                with (
                    s.cursor().copy(query, (topo.shard_count, n)) as out,
                    h.cursor().copy(
                        sql.SQL("COPY {} FROM STDIN").format(
                            sql.Identifier(topo.schema_name(n), t.name)
                        )
                    ) as into,
                ):
                    for data in out:
                        into.write(data)
    for conn in targets.values():
        conn.commit()
        conn.close()


def pairs(dsn: str, table: str, id_col: str, key_col: str, schema: str = "public") -> set:
    with psycopg.connect(dsn) as conn:
        q = sql.SQL("SELECT {}, {} FROM {}").format(
            sql.Identifier(id_col), sql.Identifier(key_col), sql.Identifier(schema, table)
        )
        return set(conn.execute(q).fetchall())


def dbname(dsn_or_host) -> str:
    return psycopg.conninfo.conninfo_to_dict(
        dsn_or_host if isinstance(dsn_or_host, str) else dsn_or_host.dsn
    )["dbname"]


@pytest.mark.timeout(240)
def test_old_ids_are_found_by_id_in_two_round_trips_at_most(make_fleet, tmp_path):
    path, src, plan = adopted_fleet(make_fleet, tmp_path)
    topo = load(path)
    source = source_host(src)
    started_ms = int(time.time() * 1000)
    with psycopg.connect(src, autocommit=True) as conn:  # as adopt copy does first (row filters)
        for name in MAPPED:
            conn.execute(
                sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(name))
            )
    made = ensure_id_map(topo, source, plan)
    assert sorted(made.tables) == sorted(MAPPED)
    # FULL identities, which column lists cannot cover, became (id, key) indexes
    assert sorted(made.identity_indexes) == sorted(f"shardctl_ids_{t}" for t in MAPPED)
    tables, globals_ = tables_from_plan(plan)
    floor = id_floor(topo.layout, started_ms)
    topo = write_adoption(
        path,
        Adoption(
            source=source,
            schema="public",
            authoritative="source",
            id_floor=floor,
            tables=tables,
            globals=globals_,
            id_map=made.id_map,
        ),
    )
    assert ensure_id_map(topo, source, plan).tables == made.tables  # a re-run changes nothing
    ids_host = topo.host(made.id_map.host)
    ids_dsn = psycopg.conninfo.make_conninfo(ids_host.dsn_for("admin"), dbname=made.id_map.dbname)

    # The app keeps writing to the old database: its UPDATEs work (the column lists cover the replica
    # identity), and a key change reaches the id map by replication.
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("UPDATE \"AuditLog\" SET action = action || '!'")
        moved_project, old_user = conn.execute(
            "SELECT id, user_id FROM projects ORDER BY id LIMIT 1"
        ).fetchone()
        new_user = conn.execute(
            "SELECT id FROM users WHERE id %% 4 <> %s %% 4 ORDER BY id LIMIT 1", (old_user,)
        ).fetchone()[0]
        conn.execute("UPDATE projects SET user_id = %s WHERE id = %s", (new_user, moved_project))
        conn.execute("DELETE FROM tasks WHERE id = (SELECT max(id) FROM tasks)")
        max_old = max(
            conn.execute(
                sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(sql.Identifier(t))
            ).fetchone()[0]
            for t in ("users", *MAPPED)
        )
    wait_id_map(topo, source)
    filled(topo, src, plan)  # what adopt copy does, key changes included
    for name in ("projects", "tasks"):
        t = tables[name]
        assert pairs(ids_dsn, name, t.id, t.key) == pairs(src, name, t.id, t.key), name
    audit = tables["AuditLog"]
    assert pairs(ids_dsn, "AuditLog", audit.id, audit.key) == pairs(
        src, "AuditLog", audit.id, audit.key
    )
    assert (moved_project, new_user) in pairs(ids_dsn, "projects", "id", "user_id")

    # New IDs sort after every old one.
    first_new = min(
        psycopg.connect(**topo.host_of(n).connect_kwargs(), autocommit=True)
        .execute(sql.SQL("SELECT {}.next_id()").format(sql.Identifier(topo.schema_name(n))))
        .fetchone()[0]
        for n in range(topo.shard_count)
    )
    assert max_old < floor <= first_new

    fleet_dbs = {dbname(h) for h in topo.hosts}
    counter = Statements([make_fleet.new_database(0), make_fleet.new_database(1)])
    task_id, task_title = (
        psycopg.connect(src)
        .execute("SELECT id, title FROM tasks ORDER BY id DESC LIMIT 1")
        .fetchone()
    )
    get_task = "SELECT title FROM tasks WHERE id = %s"
    with Router(topo) as router:
        # While the old database is authoritative: everything there, in its own schema.
        rows, calls = counter.delta(
            "FROM tasks WHERE id",
            lambda: router.execute(None, get_task, (task_id,), id=task_id, table="tasks"),
            lookup='FROM "public"."tasks"',
        )
        # the key looked up there too (no replication lag: the truth while it is authoritative),
        # so that the shard is the row's own if the statement runs after the cutover's flip
        assert rows == [(task_title,)] and calls == {dbname(src): 1, "lookups": {dbname(src): 1}}
        plans = psycopg.connect(src).execute("SELECT count(*) FROM plans").fetchone()[0]
        assert router.execute(query="SELECT count(*) FROM plans", global_=True) == [(plans,)]
        with pytest.raises(BadInput, match=r"pre-adoption ID .* pass table="):
            router.execute(None, get_task, (task_id,), id=task_id)
        User, Task, Plan = orm_models()
        Session = sessionmaker(router)
        plan_names = sorted(n for (n,) in psycopg.connect(src).execute("SELECT name FROM plans"))
        with Session() as session:
            assert session.get(Task, task_id).title == task_title  # on the old database
            # a global table's model: its statements go where the global tables are
            assert sorted(p.name for p in session.scalars(select(Plan))) == plan_names
            first = psycopg.connect(src).execute("SELECT id, name FROM plans LIMIT 1").fetchone()
            assert session.get(Plan, first[0]).name == first[1]

        # The cutover flips the file (and the old tables refuse: here renamed away); the Router, not
        # restarted, sees the flip at its next call (it looks at the file while the old database is
        # authoritative) and goes to the fleet.
        wanted = (
            psycopg.connect(src)
            .execute("SELECT id, title, user_id FROM tasks ORDER BY id")
            .fetchall()
        )
        stale = Router(load(stale_copy(path)))  # another app server's, its copy never updated
        assert flip_adoption(path, "fleet")
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("ALTER TABLE tasks RENAME TO tasks_cut_over")
            try:
                tid, title, user = wanted[1]
                got = router.execute(None, get_task, (tid,), id=tid, table="tasks")
                # the old table gone from under a Router that still sees the old database as
                # authoritative: its lookup there fails, and the id map answers instead
                assert stale.topology.adoption.on_source
                assert stale.resolve(id=tid, table="tasks") == user % 4
            finally:
                conn.execute("ALTER TABLE tasks_cut_over RENAME TO tasks")
                stale.close()
        assert got == [(title,)] and not router.topology.adoption.on_source
        for tid, title, user in wanted[:: max(1, len(wanted) // 6)]:
            rows, calls = counter.delta(
                "FROM tasks WHERE id",
                lambda tid=tid: router.execute(None, get_task, (tid,), id=tid, table="tasks"),
                lookup='FROM "public"."tasks"',
            )
            assert rows == [(title,)], tid
            # two round trips: one lookup in the id map, the statement on one shard's database
            assert calls == {
                dbname(topo.host_of(user % 4)): 1,
                "lookups": {made.id_map.dbname: 1},
            }, calls
        # one lookup per get: the id map's calls grew by exactly one for the last get
        _, lookups = counter.delta(
            'FROM "public"."projects" WHERE',
            lambda: router.execute(
                None,
                "SELECT user_id FROM projects WHERE id = %s",
                (moved_project,),
                id=moved_project,
                table="projects",
            ),
        )
        assert lookups == {made.id_map.dbname: 1}
        assert router.execute(
            None,
            "SELECT user_id FROM projects WHERE id = %s",
            (moved_project,),
            id=moved_project,
            table="projects",
        ) == [(new_user,)]  # the key it has now, found on the shard of its new key
        # shardctl.sqlalchemy: session.get by an old ID, the same two round trips
        tid, title, user = wanted[-1]
        with Session() as session:
            got, calls = counter.delta(
                "tasks.title, ", lambda: session.get(Task, tid), 'FROM "public"."tasks"'
            )
            assert (got.title, got.user_id) == (title, user)
            assert calls == {
                dbname(topo.host_of(user % 4)): 1,
                "lookups": {made.id_map.dbname: 1},
            }, calls
            email = (
                psycopg.connect(src)
                .execute("SELECT email FROM users WHERE id = %s", (user,))
                .fetchone()[0]
            )
            assert session.get(User, user).email == email  # the root: no lookup

        # the AsyncRouter and an AsyncSession over it: the same lookup, awaited
        async def async_get():
            from shardctl.sqlalchemy.asyncio import async_sessionmaker

            async with AsyncRouter(topo) as arouter:
                rows = await arouter.execute(None, get_task, (tid,), id=tid, table="tasks")
                async with async_sessionmaker(arouter)() as session:
                    task = await session.get(Task, tid)
                    return rows, (task.title, task.user_id)

        assert asyncio.run(async_get()) == ([(title,)], (title, user))
        # shardctl.django: Model.objects.get(pk=old ID) and a save, in a process of its own
        got, calls = counter.delta(
            '"tasks"."id" =',
            lambda: django_get(path, tid),
            'FROM "public"."tasks"',
        )
        assert (got["title"], got["user_id"]) == (title, user)
        assert got["plans"] == plan_names  # the global table, on the global host
        assert calls["lookups"] == {made.id_map.dbname: 2}  # the get's and the save's
        assert {db: n for db, n in calls.items() if db != "lookups"} == {
            dbname(topo.host_of(user % 4)): 2
        }, calls
        # decode-id: a pre-adoption ID, and with --table the shard its key is on (from the id map)
        tid, _, user = wanted[0]
        r = run_cli("decode-id", str(tid), "--table", "tasks", "--json", config=path)
        doc = json.loads(r.stdout)["ids"][0]
        assert r.exit_code == 0 and doc["pre_adoption"] and doc["shard"] == user % 4, r
        assert doc["host"] == topo.host_of(user % 4).name
        # the root table: its old ID is its key, no lookup
        user = wanted[0][2]
        rows, calls = counter.delta(
            "FROM users WHERE id",
            lambda: router.execute(
                None, "SELECT id FROM users WHERE id = %s", (user,), id=user, table="users"
            ),
        )
        assert rows == [(user,)] and calls == {dbname(topo.host_of(user % 4)): 1}
        assert set(calls) <= fleet_dbs
        # globals: on placement.global_host's public schema once the fleet is authoritative
        # (pg_stat_statements counts statements of one shape together, whatever their text: a
        # statement no other part of this test sends on the global host)
        got, calls = counter.delta(
            "count(*) FROM plans",
            lambda: router.execute(query="SELECT count(*) FROM plans", global_=True),
        )
        assert got == [(len(plan_names),)] and calls == {dbname(topo.host(topo.global_host)): 1}
        with Session() as session:
            _, calls = counter.delta(
                "FROM public.plans", lambda: session.scalars(select(Plan)).all()
            )
            assert calls == {dbname(topo.host(topo.global_host)): 1}, calls
    # --cleanup: the old database's side goes, the id map and its rows stay (old IDs live forever)
    drop_id_map(topo, source, keep_data=True)
    assert pairs(ids_dsn, "projects", "id", "user_id") == pairs(src, "projects", "id", "user_id")
    with psycopg.connect(ids_dsn) as conn:
        assert not conn.execute("SELECT 1 FROM pg_subscription").fetchall()
    drop_id_map(topo, source)  # --abort's: the database too
    assert topo.global_host == made.id_map.host == "pg2"  # the second server's
    with psycopg.connect(make_fleet.new_database(1)) as conn:
        assert not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (made.id_map.dbname,)
        ).fetchall()
    with psycopg.connect(src) as conn:
        assert not conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname LIKE %s", (f"{slot_name('ids')}%",)
        ).fetchall()
        assert (
            conn.execute(
                "SELECT relreplident::text FROM pg_class WHERE oid = 'projects'::regclass"
            ).fetchone()[0]
            == "d"
        )


def test_decode_id_names_the_shard_while_the_old_database_is_authoritative(make_fleet):
    """Before the cutover (or after its --abort) the id map may lag the old database: decode-id
    looks a pre-adoption ID's key up where the Router does, on the old database itself, and names
    the shard: its key's remainder for an old key, the shard in its bits for a ``next_id()`` key (a
    user made on the fleet, copied back by an abort). No id map exists here at all."""
    path = make_fleet(hosts=2, shards=4, extra=ROUTING)
    src = make_fleet.new_database(0)
    load_app(src, "tasks_prisma", users=8)
    topo = load(path)
    now_ms = int(time.time() * 1000)
    floor = id_floor(topo.layout, now_ms - 60_000)
    new_user = next(
        u
        for seq in range(8)
        if (u := topo.layout.encode(unix_ms=now_ms, shard=3, sequence=seq)) % 4 != 3
    )
    with psycopg.connect(src, autocommit=True) as conn:
        old_project, old_user = conn.execute(  # a key change: its ID's remainder is not its shard
            "UPDATE projects SET user_id = 2 WHERE id = 1 RETURNING id, user_id"
        ).fetchone()
        conn.execute(
            "INSERT INTO users (id, email, plan_id) VALUES (%s, 'new@example.com', 1)", (new_user,)
        )
        new_project = conn.execute(  # an old-style ID (the old database's sequence) after --abort
            "INSERT INTO projects (user_id, name) VALUES (%s, 'new') RETURNING id", (new_user,)
        ).fetchone()[0]
    write_adoption(
        path,
        source={"dsn": src},
        schema="public",
        authoritative="source",
        id_floor=floor,
        tables={"users": {"id": "id", "key": "id"}, "projects": {"id": "id", "key": "user_id"}},
        globals=["plans", "countries"],
    )
    assert new_project < floor <= new_user
    for project, shard in ((old_project, old_user % 4), (new_project, 3)):
        r = run_cli("decode-id", str(project), "--table", "projects", "--json", config=path)
        assert r.exit_code == 0, r
        doc = json.loads(r.stdout)["ids"][0]
        assert doc["pre_adoption"] and doc["shard"] == shard, doc
        assert (doc["host"], doc["schema"]) == ("source", "public"), doc  # where it is read now
    r = run_cli("decode-id", "999999", "--table", "projects", "--json", config=path)
    doc = json.loads(r.stdout)["ids"][0]
    assert r.exit_code == 0 and doc["shard"] is None, r
    assert "no row of projects has it (the old database has none)" in doc["note"], doc


def test_sqlalchemy_statement_runs_where_its_schema_was_placed(make_fleet, tmp_path):
    """A statement's host and its schema come from one look at the placement: the cutover's flip (or
    its abort's flip back) landing between the routing and the connection must not send the fleet's
    ``insta2`` to the old database or the app's ``public`` to the fleet (seen under the apps of
    test_adopt_apps: ``relation "insta0.photos" does not exist``). The flip is made to land in that
    window: a listener of the session, run right after shardctl's routing, rewrites the file."""
    from sqlalchemy import event, func

    path, src, plan = adopted_fleet(make_fleet, tmp_path)
    topo = load(path)
    tables, globals_ = tables_from_plan(plan)
    filled(topo, src, plan)
    write_adoption(
        path,
        Adoption(
            source=source_host(src),
            schema="public",
            authoritative="source",
            id_floor=id_floor(topo.layout, int(time.time() * 1000)),
            tables=tables,
            globals=globals_,
        ),
    )
    user = psycopg.connect(src).execute("SELECT min(user_id) FROM tasks").fetchone()[0]
    want = sorted(
        t
        for (t,) in psycopg.connect(src).execute(
            "SELECT title FROM tasks WHERE user_id = %s", (user,)
        )
    )
    _, Task, _ = orm_models()
    query = select(func.current_schema(), func.array_agg(Task.title)).where(Task.user_id == user)
    with Router(load(path)) as router:
        Session = sessionmaker(router)
        for authoritative, flipped_to, schema in (
            ("source", "fleet", "public"),
            ("fleet", "source", load(path).schema_name(user % 4)),
        ):
            flip_adoption(path, authoritative)
            with Session() as session:
                flips = []

                def flip_after_routing(orm, to=flipped_to, flips=flips):
                    if not flips:
                        flips.append(flip_adoption(path, to))

                event.listen(session, "do_orm_execute", flip_after_routing)
                ran_in, titles = session.execute(query).one()
            assert flips == [True]
            assert (ran_in, sorted(titles)) == (schema, want), authoritative
