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

import psycopg
import pytest
from psycopg import sql
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


def load_shards(topo, dsn: str, doc) -> None:
    """Every sharded table's rows into their key's shard: the test's own loader (adopt_copy's stand-in)."""
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
    assert got["source_rows"] == got["fleet_rows"] == total, got
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

    r, got = verify(path, dsn, plan_file, "--dark-reads", "0", "--chunk-rows", "60")
    assert r.exit_code == 1 and not got["ok"], r
    named = sorted((p["table"], p["shard"], p["rows"][0]) for p in got["problems"])
    assert named == sorted(
        [
            ("users", 1, f"id {user}: differs"),
            ("projects", 2, f"id {project}: only on the source (missing on the shard)"),
            ("memberships", 3, "user_id 3: only on the shard"),
            ("task_labels", 0, f"user_id {label[2]}: only on the source (missing on the shard)"),
            ("task_labels", 1, f"user_id {label[2]}: belongs on shard 0, not 1"),
            ("tasks", task_shard, f"id {task}: differs"),
        ]
    ), named
    assert all(len(p["rows"]) == 1 for p in got["problems"]), got["problems"]
    users = next(p for p in got["problems"] if p["table"] == "users")
    assert "users shard 1 (pg1)" in users["message"] and "checksums differ" in users["message"]
    assert users["source_rows"] == users["shard_rows"]
    projects = next(p for p in got["problems"] if p["table"] == "projects")
    assert projects["source_rows"] == projects["shard_rows"] + 1
    assert "6 difference(s) between the source and the fleet" in r.stderr, r
    assert got["problems"][0]["message"] in r.stderr, r
