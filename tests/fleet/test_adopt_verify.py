"""``shardctl adopt verify``: the task tracker of tests/data/apps (its plan's fixes run) is the source;
a 2-host, 4-shard fleet inited with its baseline holds its rows. The shards are filled by this test's
own loader (:func:`load_shards`: per table and shard, ``COPY (SELECT … WHERE key % 4 = shard)`` out of
the source into the shard table through psycopg), standing in for helper copy's ``adopt_copy``; the
check is judged against what the test planted, never by the command's own reading of the data.

Green when every shard holds exactly its keys' rows; exit 1 naming exactly each planted difference
(a changed row, a missing one, an extra one, one on the wrong shard, a TOAST-sized value); a run
SIGKILLed after its first chunk is finished by a re-run that redoes no recorded chunk; dark reads
of the app's own statements catch a row changed on the fleet."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from psycopg import sql
from support import crash_at
from support.apps import apply_fixes, load_app
from support.fleet import connect, load, run_cli

ROUTING = "routing:\n  key: user_id\n"
SHARDS = 4


@pytest.fixture(scope="module")
def adopted(shardctl_fleet, tmp_path_factory):
    """(source DSN, plan file, plan document, migrations folder with the baseline): made once."""
    base = tmp_path_factory.mktemp("adopt-verify")
    maker = shardctl_fleet.maker(base, hosts=2, shards=SHARDS, routing=False)
    try:
        path = maker(extra=ROUTING)
        migrations = path.parent / "migrations"
        for f in migrations.iterdir():
            f.unlink()
        dsn = maker.new_database(0)
        load_app(dsn, "tasks_prisma")
        r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
        apply_fixes(dsn, "tasks_prisma", json.loads(r.stdout))
        plan_file = base / "plan.yaml"
        r = run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, "--json", config=path)
        assert r.exit_code == 0, r
        doc = json.loads(r.stdout)
        r = run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path)
        assert r.exit_code == 0, r
        yield dsn, plan_file, doc, migrations
    finally:
        maker.cleanup()


def sharded(doc) -> dict[str, str]:
    return {t["name"]: t["key"] for t in doc["tables"] if t["kind"] in ("root", "column")}


# The app's global tables as they stand on the source (tests/data/apps/tasks_prisma.sql).
GLOBALS = [
    "CREATE TABLE public.countries (code char(2) PRIMARY KEY, name text NOT NULL)",
    "CREATE TABLE public.plans (id integer PRIMARY KEY, name text NOT NULL, price_cents integer NOT NULL)",
]


def copy_rows(src, dst, select, into) -> None:
    with src.cursor().copy(select) as cin, dst.cursor().copy(into) as cout:
        for block in cin:
            cout.write(block)


def load_shards(topo, dsn: str, doc) -> None:
    """Every sharded table's rows into their key's shard, the global tables' into ``public`` on the
    global host: the test's own loader (adopt_copy's stand-in)."""
    with psycopg.connect(dsn) as src, connect(topo, doc["global_host"], autocommit=True) as dst:
        for statement in GLOBALS:
            dst.execute(statement)
        for table in ("countries", "plans"):
            copy_rows(
                src,
                dst,
                sql.SQL("COPY public.{} TO STDOUT").format(sql.Identifier(table)),
                sql.SQL("COPY public.{} FROM STDIN").format(sql.Identifier(table)),
            )
    with psycopg.connect(dsn) as src:
        for shard in range(SHARDS):
            host = topo.host_of(shard).name
            with connect(topo, host, autocommit=True) as dst:
                dst.execute("SET session_replication_role = replica")  # FKs: any order
                for table, key in sharded(doc).items():
                    cols = [
                        r[0]
                        for r in src.execute(
                            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                            (f'public."{table}"',),
                        )
                    ]
                    names = sql.SQL(", ").join(map(sql.Identifier, cols))
                    out = sql.SQL("COPY (SELECT {} FROM public.{} WHERE {} % {} = {}) TO STDOUT")
                    into = sql.SQL("COPY {} ({}) FROM STDIN")
                    with (
                        src.cursor().copy(
                            out.format(
                                names,
                                sql.Identifier(table),
                                sql.Identifier(key),
                                sql.Literal(SHARDS),
                                sql.Literal(shard),
                            )
                        ) as cin,
                        dst.cursor().copy(
                            into.format(sql.Identifier(topo.schema_name(shard), table), names)
                        ) as cout,
                    ):
                        for block in cin:
                            cout.write(block)


@pytest.fixture
def fleet(make_fleet, adopted):
    dsn, _, doc, migrations = adopted
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING, migrations=migrations, init=True)
    topo = load(path)
    load_shards(topo, dsn, doc)
    return path, topo


def verify(path, dsn, plan_file, *extra):
    r = run_cli(
        "adopt", "verify", "--from", dsn, "--plan", plan_file, "--json", *extra, config=path
    )
    assert r.stdout, r
    return r, json.loads(r.stdout)


def on_shard(topo, shard: int, statement: str, params=()) -> list:
    with connect(topo, topo.host_of(shard).name, autocommit=True) as conn:
        conn.execute(f"SET search_path = {topo.schema_name(shard)}")
        conn.execute("SET session_replication_role = replica")  # plants may break foreign keys
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []


def on_source(dsn: str, statement: str, params=()) -> list:
    with psycopg.connect(dsn) as conn:
        return conn.execute(statement, params or None).fetchall()


def test_equal_shards_pass_and_each_planted_difference_is_named(fleet, adopted):
    path, topo = fleet
    dsn, plan_file, doc, _ = adopted
    r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
    assert r.exit_code == 0, r
    assert list(got)[:2] == ["command", "ok"] and got["command"] == "adopt verify" and got["ok"]
    total = sum(
        on_source(dsn, sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(t)))[0][0]
        for t in sharded(doc)
    )
    assert got["source_rows"] == got["fleet_rows"] == total + 6, got  # + 3 plans, 3 countries
    assert got["problems"] == [] and not got["replicating"] and got["chunks"] > len(sharded(doc))

    # the plants, each in a table and shard of its own
    user = 5  # users shard 1: a column changed
    on_shard(topo, 1, "UPDATE users SET name = 'changed' WHERE id = %s", (user,))
    project = on_source(dsn, "SELECT min(id) FROM projects WHERE user_id % 4 = 2")[0][0]
    on_shard(topo, 2, "DELETE FROM projects WHERE id = %s", (project,))  # missing
    on_shard(topo, 3, "INSERT INTO memberships VALUES (3, 999999, 'x')")  # extra (key: user_id)
    label = on_source(
        dsn, "SELECT task_id, label, user_id FROM task_labels WHERE user_id % 4 = 0 LIMIT 1"
    )[0]
    on_shard(topo, 0, "DELETE FROM task_labels WHERE task_id = %s AND label = %s", label[:2])
    on_shard(topo, 1, "INSERT INTO task_labels VALUES (%s, %s, %s)", label)  # on the wrong shard
    task, task_shard = on_source(
        dsn, "SELECT id, user_id % 4 FROM tasks WHERE length(body) > 4000 ORDER BY id LIMIT 1"
    )[0]
    on_shard(
        topo,
        task_shard,
        "UPDATE tasks SET body = overlay(body placing 'X' from 7000) WHERE id = %s",
        (task,),
    )

    with connect(topo, doc["global_host"], autocommit=True) as conn:  # a global table's row
        conn.execute("UPDATE public.plans SET price_cents = 901 WHERE id = 2")

    r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
    assert r.exit_code == 1 and not got["ok"], r
    named = sorted(((p["table"], p["shard"], p["rows"][0]) for p in got["problems"]), key=str)
    assert named == sorted(
        [
            ("users", 1, f"id {user}: differs"),
            ("projects", 2, f"id {project}: only on the source (missing on the shard)"),
            ("memberships", 3, "user_id 3: only on the shard"),
            ("task_labels", 0, f"user_id {label[2]}: only on the source (missing on the shard)"),
            ("task_labels", 1, f"user_id {label[2]}: belongs on shard 0, not 1"),
            ("tasks", task_shard, f"id {task}: differs"),
            ("plans", None, "id 2: differs"),
        ],
        key=str,
    ), named
    assert all(len(p["rows"]) == 1 for p in got["problems"]), got["problems"]
    users = next(p for p in got["problems"] if p["table"] == "users")
    assert "users shard 1 (pg1)" in users["message"] and "checksums differ" in users["message"]
    assert users["source_rows"] == users["shard_rows"]
    projects = next(p for p in got["problems"] if p["table"] == "projects")
    assert projects["source_rows"] == projects["shard_rows"] + 1
    plans = next(p for p in got["problems"] if p["table"] == "plans")
    assert plans["message"].startswith(
        "plans (global, on pg1), all rows: 3 row(s) on the source, 3 on the host, checksums differ"
    ), plans
    assert "7 difference(s) between the source and the fleet" in r.stderr, r
    assert got["problems"][0]["message"] in r.stderr, r


def recorded(dsn: str) -> list[tuple]:
    return on_source(
        dsn,
        "SELECT c.chunk, c.status, c.checked_at FROM shardctl_adopt.verify_chunks c "
        "WHERE c.run_id = (SELECT max(run_id) FROM shardctl_adopt.verify_runs) ORDER BY c.chunk",
    )


def test_a_run_killed_mid_way_is_finished_without_redoing_recorded_chunks(fleet, adopted):
    path, _ = fleet
    dsn, plan_file, _, _ = adopted
    args = ["--config", str(path), "adopt", "verify", "--from", dsn, "--plan", str(plan_file)]
    args += ["--dark-reads", "0", "--chunk-rows", "60", "--json"]
    killed = crash_at.run("adopt-verify-chunk", *args)
    assert killed.returncode == -9, killed
    before = recorded(dsn)
    done = [c for c in before if c[1] != "pending"]
    assert len(done) == 1 and done[0][1] == "ok" and len(before) > 8, before

    r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
    assert r.exit_code == 0, r
    assert got["resumed"] and got["recorded"] == 1 and got["checked"] == len(before) - 1, got
    after = recorded(dsn)
    assert [c[1] for c in after] == ["ok"] * len(before)
    assert after[done[0][0]][2] == done[0][2]  # the recorded chunk was not checked again
    summary = on_source(
        dsn, "SELECT summary FROM shardctl_adopt.verify_runs WHERE run_id = %s", (got["run"],)
    )[0][0]
    assert summary["ok"] and summary["chunks"] == len(before) and summary["problems"] == []

    r, again = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
    assert r.exit_code == 0 and not again["resumed"] and again["run"] > got["run"], again
    assert again["checked"] == again["chunks"] == len(before)

    r = run_cli(
        "adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0", config=path
    )
    assert r.exit_code == 0 and "Every shard holds exactly its keys' rows." in r.stdout, r
    r = run_cli(
        "adopt", "verify", "--from", dsn, "--plan", plan_file.parent / "none.yaml", config=path
    )
    assert r.exit_code == 2 and "cannot read it" in r.stderr, r
    r = run_cli(
        "adopt",
        "verify",
        "--from",
        "postgresql://u@127.0.0.1:1/x",
        "--plan",
        plan_file,
        config=path,
    )
    assert r.exit_code == 3 and "host source is unreachable" in r.stderr, r

    blocked = plan_file.parent / "blocked.yaml"  # a plan with a blocker left: refused, exit 2
    text = plan_file.read_text().replace(
        "blockers: []", "blockers:\n- {kind: x, table: t, message: m, fix: []}"
    )
    blocked.write_text(text)
    r = run_cli("adopt", "verify", "--from", dsn, "--plan", blocked, config=path)
    assert r.exit_code == 2 and "lists 1 blocker(s)" in r.stderr, r
    with psycopg.connect(dsn, autocommit=True) as other:  # one verify at a time per source
        other.execute("SELECT pg_advisory_lock(hashtext('shardctl_adopt.verify'))")
        r = run_cli("adopt", "verify", "--from", dsn, "--plan", plan_file, config=path)
        assert r.exit_code == 1 and "another adopt verify is running" in r.stderr, r


# The app's reads, as an ORM sends them: (statement, parameters from the data).
APP_READS = [
    (
        (
            'SELECT "public"."users"."id", "public"."users"."email", "public"."users"."name" '
            'FROM "public"."users" WHERE "public"."users"."id" = %s LIMIT %s OFFSET %s'
        ),
        "SELECT id, 1, 0 FROM users",
    ),
    (
        "SELECT id, title, status FROM tasks WHERE project_id = %s ORDER BY id",
        "SELECT id FROM projects",
    ),
    ("SELECT count(*) FROM task_labels WHERE user_id = %s", "SELECT id FROM users"),
    ("SELECT title FROM tasks WHERE status = %s", "SELECT 'DONE'"),  # fan-out: not tried
]


def test_dark_reads_run_the_apps_reads_on_both_and_catch_a_planted_difference(fleet, adopted):
    path, topo = fleet
    dsn, plan_file, _, _ = adopted
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_stat_statements")
        except psycopg.Error as exc:
            pytest.skip(f"this build has no preloaded pg_stat_statements: {exc}")
        conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database "
            "WHERE datname = current_database()), 0)"
        )
        for text, values in APP_READS:
            for params in conn.execute(values).fetchall()[:3]:
                conn.execute(text, params)
    r, got = verify(path, dsn, plan_file, "--dark-reads", "40")
    assert r.exit_code == 0, r

    def table_of(d):
        return d["query"].replace('"public".', "").replace('"', "").split(" FROM ")[1].split()[0]

    reads = {table_of(d): d for d in got["dark_reads"]}
    assert sorted(reads) == ["task_labels", "tasks", "users"], got["dark_reads"]  # no fan-out
    assert all(d["status"] == "ok" for d in got["dark_reads"]), got["dark_reads"]
    users = on_source(dsn, "SELECT count(*) FROM users")[0][0]
    assert reads["users"]["reads"] == users and reads["tasks"]["reads"] == 40, reads

    on_shard(topo, 2, "UPDATE users SET email = 'planted@example.com' WHERE id = 6")
    r, got = verify(path, dsn, plan_file, "--dark-reads", "40")
    assert r.exit_code == 1, r
    differs = [d for d in got["dark_reads"] if d["status"] == "differs"]
    assert len(differs) == 1 and '"users"' in differs[0]["query"], got["dark_reads"]
    assert "id 6" in differs[0]["detail"] and "u6@example.com" in differs[0]["detail"], differs
    assert all(d["status"] == "ok" for d in got["dark_reads"] if d not in differs)


def replicate_users(topo, dsn: str) -> list:
    """The copy's replication for ``users`` alone, as ADOPT.md lays it out (helper copy's stand-in):
    per host a publication ``shardctl_adopt_<host>`` filtered to its shards' keys, and there a
    subscription into a parent ``public.users`` partitioned by ``id % 4`` over its shard tables."""
    undo = []
    with psycopg.connect(dsn, autocommit=True) as src:
        database = src.info.dbname  # slot names are the server's: one of this test's own
        for host in topo.hosts:
            name = f"shardctl_adopt_{host.name}_{database}"
            keys = ", ".join(str(s) for s in host.shards)
            src.execute(f"CREATE PUBLICATION {name} FOR TABLE users WHERE (id % 4 IN ({keys}))")
            src.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
            with connect(topo, host.name, autocommit=True) as dst:
                first = topo.schema_name(host.shards[0])
                dst.execute(
                    f"CREATE TABLE public.users (LIKE {first}.users) PARTITION BY LIST ((id % 4))"
                )
                for s in host.shards:
                    dst.execute(
                        f"ALTER TABLE public.users ATTACH PARTITION {topo.schema_name(s)}.users FOR VALUES IN ({s})"
                    )
                dst.execute(
                    sql.SQL(
                        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} "
                        "WITH (copy_data = false, create_slot = false, slot_name = {})"
                    ).format(
                        sql.Identifier(name),
                        sql.Literal(dsn),
                        sql.Identifier(name),
                        sql.Literal(name),
                    )
                )
            undo.append((host.name, name))
    return undo


def unreplicate(topo, dsn: str, undo: list) -> None:
    for host, name in undo:
        with connect(topo, host, autocommit=True) as dst:
            dst.execute(f"DROP SUBSCRIPTION {name}")  # drops its slot on the source too
        with psycopg.connect(dsn, autocommit=True) as src:
            src.execute(f"DROP PUBLICATION {name}")


def test_while_the_app_writes_differences_are_rechecked_at_lag_zero(fleet, adopted):
    """With the copy's subscriptions replicating and the app writing the users of shard 0 the whole
    time, the check waits for lag 0: no false difference; a row planted on shard 1 (whose rows the
    source does not change) is still named, by the checksums and by the dark read of users."""
    path, topo = fleet
    dsn, plan_file, _, _ = adopted
    read = "SELECT id, email, name FROM users WHERE id = %s"
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for n in (1, 2):
                conn.execute(read, (n,))  # the app's read, in pg_stat_statements
        except psycopg.Error as exc:
            pytest.skip(f"this build has no preloaded pg_stat_statements: {exc}")
    undo = replicate_users(topo, dsn)
    stop = threading.Event()
    writes = []

    def app() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                n = len(writes)
                conn.execute(
                    "UPDATE users SET name = %s WHERE id = %s", (f"w{n}", 4 * (n % 10) + 4)
                )
                writes.append(n)
                time.sleep(0.005)

    writer = threading.Thread(target=app)
    writer.start()
    try:
        r, got = verify(path, dsn, plan_file, "--dark-reads", "40")
        assert r.exit_code == 0 and got["replicating"], r
        users = [d for d in got["dark_reads"] if d["query"] == read.replace("%s", "$1")]
        assert len(users) == 1 and users[0]["status"] == "ok" and users[0]["reads"] == 40, users
        on_shard(topo, 1, "UPDATE users SET name = 'planted' WHERE id = 5")
        r, got = verify(path, dsn, plan_file, "--dark-reads", "40")
        assert r.exit_code == 1, r
        assert [(p["table"], p["shard"], p["rows"]) for p in got["problems"]] == [
            ("users", 1, ["id 5: differs"])
        ], got["problems"]
        differs = [d for d in got["dark_reads"] if d["status"] != "ok"]  # the reads of users only
        assert users[0]["query"] in [d["query"] for d in differs], differs
        assert all(d["status"] == "differs" and d["detail"].startswith("id 5 (") for d in differs)
        assert all(
            "FROM users" in d["query"].replace('"public".', "").replace('"', "") for d in differs
        )
    finally:
        stop.set()
        writer.join()
        unreplicate(topo, dsn, undo)
    assert len(writes) > 20, len(writes)  # the app wrote throughout
    slots = "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
    assert on_source(dsn, slots) == []


def new_user_rows(dsn: str, topo, shard: int, user: int) -> None:
    """A user made by ``next_id()`` on ``shard`` and a project of theirs, written on the source as
    they are after a cutover and its ``--abort`` (the fleet's writes copied back); the same rows put
    on ``shard``, where the copy puts them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, name, plan_id) VALUES (%s, %s, 'new', 1)",
            (user, f"new{user}@example.com"),
        )
        project = conn.execute(
            "INSERT INTO projects (user_id, name) VALUES (%s, 'new') RETURNING id", (user,)
        ).fetchone()[0]
        conn.execute("INSERT INTO memberships VALUES (%s, %s, 'owner')", (user, project))
        with connect(topo, topo.host_of(shard).name, autocommit=True) as dst:
            dst.execute("SET session_replication_role = replica")
            for table, key in (
                ("users", "id"),
                ("projects", "user_id"),
                ("memberships", "user_id"),
            ):
                copy_rows(
                    conn,
                    dst,
                    sql.SQL("COPY (SELECT * FROM public.{} WHERE {} = {}) TO STDOUT").format(
                        sql.Identifier(table), sql.Identifier(key), sql.Literal(user)
                    ),
                    sql.SQL("COPY {} FROM STDIN").format(
                        sql.Identifier(topo.schema_name(shard), table)
                    ),
                )


def test_new_ids_as_keys_are_checked_on_the_shard_their_bits_name(fleet, adopted):
    """After a cutover and its --abort, users made on the fleet (``next_id()`` IDs, at or above the ID
    floor) live on in the old database; a fresh copy puts their rows on the shard their IDs name, as
    the Router reads them (not ``key % N``). Verify groups the source's rows by the same rule: green,
    and a row of theirs planted on the ``key % N`` shard is named as on the wrong shard."""
    from shardctl.ids.old_ids import id_floor
    from shardctl.model.adoption import Adoption, tables_from_plan
    from shardctl.model.topology_file import write_adoption
    from shardctl.ops.adopt.plan import source_host

    path, topo = fleet
    dsn, plan_file, doc, _ = adopted
    now_ms = int(time.time() * 1000)
    floor = id_floor(topo.layout, now_ms - 60_000)  # the first copy's, a minute ago
    tables, globals_ = tables_from_plan(doc)
    adoption = Adoption(source_host(dsn), "public", "source", floor, tables, globals_)
    topo = write_adoption(path, adoption)
    shard = 2  # the user's ID names shard 2; its remainder another
    user = next(
        u
        for seq in range(8)
        if (u := topo.layout.encode(unix_ms=now_ms, shard=shard, sequence=seq)) % SHARDS != shard
    )
    assert user >= floor
    try:
        new_user_rows(dsn, topo, shard, user)
        r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
        assert r.exit_code == 0 and got["problems"] == [], r
        assert got["source_rows"] == got["fleet_rows"], got

        wrong = user % SHARDS  # where key % N would put them
        on_shard(
            topo,
            wrong,
            "INSERT INTO projects (id, user_id, name) VALUES (999999, %s, 'x')",
            (user,),
        )
        r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
        assert r.exit_code == 1, r
        named = [(p["table"], p["shard"], p["rows"]) for p in got["problems"]]
        assert named == [
            (
                "projects",
                wrong,
                [f"id 999999: user_id {user} belongs on shard {shard}, not {wrong}"],
            )
        ], named
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM memberships WHERE user_id = %s", (user,))
            conn.execute("DELETE FROM projects WHERE user_id = %s", (user,))
            conn.execute("DELETE FROM users WHERE id = %s", (user,))


@pytest.mark.slow
def test_verify_at_size(make_fleet, tmp_path):
    """The task tracker with 5,000 users (some 100 MB, most of it TOAST) on 2 hosts of 4 shards:
    the check's time, and every row compared (the figure goes in the note)."""
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    dsn = make_fleet.new_database(0)
    load_app(dsn, "tasks_prisma", users=5_000)
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, "tasks_prisma", json.loads(r.stdout))
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, "--json", config=path)
    doc = json.loads(r.stdout)
    assert (
        run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path).exit_code == 0
    )
    assert run_cli("init", config=path).exit_code == 0
    topo = load(path)
    load_shards(topo, dsn, doc)
    r, got = verify(path, dsn, plan_file, "--dark-reads", "0")
    assert r.exit_code == 0, r
    size = on_source(dsn, "SELECT pg_database_size(current_database())")[0][0]
    print(
        f"adopt verify: {size / 2**20:.0f} MB, {got['source_rows']} rows, {got['chunks']} chunks, "
        f"{got['seconds']:.2f} s"
    )
    assert got["source_rows"] == got["fleet_rows"] > 5_000 * 10
