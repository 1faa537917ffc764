"""``shardctl adopt plan`` on the two application schemas of tests/data/apps (a Django forum and a
Prisma task tracker, with generated data), on real servers: each table's key, path or global home;
every blocker with its one-line message; the app's statements classed from the server's own
pg_stat_statements; exit 1 with blockers and nothing changed; exit 0 once the plan's fixes ran."""

from __future__ import annotations

import json

import psycopg
import pytest
from support.apps import apply_fixes, load_app, snapshot
from support.fleet import run_cli

from shardctl.ops.adopt.blockers import server_blockers

ROUTING = "routing:\n  key: user_id\n"


@pytest.fixture(scope="module")
def sources(shardctl_fleet):
    """One database per app, loaded once for the module (tests that change one load their own)."""
    server = shardctl_fleet.servers[0]
    made = {}
    for app in ("forum_django", "tasks_prisma"):
        db = shardctl_fleet.create_database(server)
        made[app] = (server, db)
        load_app(server.dsn(db), app)
    yield {app: server.dsn(db) for app, (server, db) in made.items()}
    shardctl_fleet.drop(list(made.values()))


@pytest.fixture
def topology(make_fleet):
    return make_fleet(hosts=2, shards=4, extra=ROUTING)


def plan(topology, dsn, *extra):
    r = run_cli("adopt", "plan", "--from", dsn, "--json", *extra, config=topology)
    assert r.stdout, r
    return r, json.loads(r.stdout)


def kinds(doc) -> dict[str, tuple]:
    return {t["name"]: (t["kind"], t["key"], t["id_column"]) for t in doc["tables"]}


def found(doc) -> set[tuple[str, str]]:
    return {(b["kind"], b["table"]) for b in doc["blockers"]}


def message(doc, kind, table) -> str:
    return next(b["message"] for b in doc["blockers"] if (b["kind"], b["table"]) == (kind, table))


def test_forum_keys_paths_and_globals(topology, sources):
    r, doc = plan(topology, sources["forum_django"])
    assert r.exit_code == 1, r
    assert (doc["root"], doc["root_key"], doc["global_host"]) == ("auth_user", "id", "pg1")
    assert kinds(doc) == {
        "auth_user": ("root", "id", "id"),
        "accounts_profile": ("column", "user_id", "id"),
        "forum_thread": ("column", "author_id", "id"),
        "forum_post": ("column", "author_id", "id"),
        "forum_vote": ("column", "user_id", "id"),
        "forum_threadview": ("column", "user_id", None),  # by its name: no foreign key
        "forum_attachment": ("fk-path", None, "id"),
        "forum_board": ("global", None, "id"),
        "django_content_type": ("global", None, "id"),
        "django_migrations": ("history", None, None),
    }
    paths = {t["name"]: t["path"] for t in doc["tables"]}
    assert paths["forum_attachment"] == [
        "forum_attachment.post_id -> forum_post.id",
        "forum_post.author_id -> auth_user.id",
    ]
    # forum_post.thread_id -> forum_thread crosses shards (a post in another user's thread), so the
    # group of tables tied by constraints that hold on one shard leaves forum_thread's posts out of it
    assert doc["groups"][0] == [
        "accounts_profile",
        "auth_user",
        "forum_attachment",
        "forum_post",
        "forum_thread",
        "forum_vote",
    ]
    assert doc["history"] == [
        {
            "tool": "django",
            "table": "django_migrations",
            "applied": 7,
            "last": "forum.0003_vote_threadview",
        }
    ]
    assert found(doc) == {
        ("replica-identity", "forum_threadview"),
        ("unique-without-key", "auth_user"),
        ("integer-id", "auth_user"),
        ("integer-id", "accounts_profile"),
        ("integer-id", "forum_thread"),
        ("integer-id", "forum_post"),
        ("integer-id", "forum_vote"),
        ("integer-id", "forum_threadview"),
        ("no-key-column", "forum_attachment"),
        ("foreign-key", "forum_thread"),
        ("foreign-key", "forum_post"),
        ("foreign-key", "forum_vote"),
    }
    assert message(doc, "replica-identity", "forum_threadview") == (
        "forum_threadview has no primary key or replica identity: logical replication could not "
        "copy its updates and deletes; add a primary key, or set REPLICA IDENTITY FULL"
    )
    assert message(doc, "unique-without-key", "auth_user") == (
        "UNIQUE auth_user_username_key (username) on auth_user does not include the shard key id: "
        "each shard could only enforce it among its own rows; keep these values unique in a global "
        "table that maps them to id"
    )
    assert message(doc, "integer-id", "forum_threadview") == (
        "forum_threadview.user_id (the shard key) is integer: keys are auth_user IDs, new ones from "
        "next_id(), which needs bigint; change it to bigint"
    )


def test_tasks_keys_blockers_and_messages(topology, sources):
    r, doc = plan(topology, sources["tasks_prisma"])
    assert r.exit_code == 1, r
    assert kinds(doc) == {
        "users": ("root", "id", "id"),
        "projects": ("column", "user_id", "id"),
        "memberships": ("column", "user_id", None),  # composite key (user_id, project_id)
        "AuditLog": ("column", "userId", "id"),  # quoted name, identity ID, key by its foreign key
        "tasks": ("fk-path", None, "id"),
        "task_labels": ("fk-path", None, None),  # composite key (task_id, label), two hops
        "plans": ("global", None, "id"),
        "countries": ("global", None, None),
        "_prisma_migrations": ("history", None, None),
    }
    assert found(doc) == {
        ("no-key-column", "tasks"),
        ("no-key-column", "task_labels"),
        ("nullable-key", "AuditLog"),
        ("integer-id", "AuditLog"),
        ("foreign-key", "memberships"),
        ("foreign-key", "users"),
        ("unique-without-key", "users"),
    }
    assert message(doc, "no-key-column", "tasks") == (
        "tasks has no key column: its key comes through tasks.project_id -> projects.id then "
        "projects.user_id -> users.id; add user_id, backfill it from projects, and have the app "
        "(or a trigger) set it on insert"
    )
    assert message(doc, "nullable-key", "AuditLog") == (
        "AuditLog.userId (the shard key) may be NULL, and a row without a key has no shard: fill "
        "any NULLs, then SET NOT NULL"
    )
    assert message(doc, "integer-id", "AuditLog") == (
        "AuditLog.id is integer: new rows' IDs come from next_id(), which needs bigint; change it "
        "(and the columns that reference it) to bigint"
    )
    assert message(doc, "foreign-key", "memberships") == (
        "FOREIGN KEY memberships_project_id_fkey (project_id) -> projects(id) does not include the "
        "shard key: a row and the row it references may be on different shards; no constraint "
        "reaches across them: drop it and check it in the app"
    )
    messages = [b["message"] for b in doc["blockers"] if b["table"] == "users"]
    assert (
        "FOREIGN KEY users_plan_id_fkey (plan_id) -> plans(id) ties a sharded table to a global one, "
        "which live on different hosts; no constraint reaches across them: drop it and check it in "
        "the app"
    ) in messages
    assert message(doc, "unique-without-key", "users").startswith(
        "unique index users_email_key (email) on users does not include the shard key id"
    )
    # the parent's fix first: task_labels' backfill reads the tasks.user_id that tasks' fix adds
    order = [b["table"] for b in doc["blockers"] if b["kind"] == "no-key-column"]
    assert order == ["tasks", "task_labels"]


def test_blockers_exit_1_and_change_nothing(topology, sources, tmp_path):
    """Both apps: exit 1, the plan file written for review, and the database exactly as before."""
    for dsn in sources.values():
        before = snapshot(dsn)
        r = run_cli(
            "adopt", "plan", "--from", dsn, "--out", tmp_path / "plan.yaml", config=topology
        )
        assert r.exit_code == 1, r
        assert "blocker(s)" in r.stderr and (tmp_path / "plan.yaml").exists()
        assert snapshot(dsn) == before


@pytest.mark.parametrize("app", ["tasks_prisma", "forum_django"])
def test_fixes_make_the_plan_green(topology, make_fleet, app):
    """Running every fix the plan gives (and what its messages say where it gives no SQL) leaves no
    blocker: exit 0. The backfills filled every new key with the parent row's."""
    dsn = make_fleet.new_database(0)
    load_app(dsn, app)
    r, doc = plan(topology, dsn)
    assert r.exit_code == 1
    apply_fixes(dsn, app, doc)
    r, doc = plan(topology, dsn)
    assert r.exit_code == 0, doc["blockers"]
    sharded = [t["name"] for t in doc["tables"] if t["kind"] in ("root", "column")]
    assert [t["name"] for t in doc["tables"] if t["kind"] == "fk-path"] == []
    assert sorted(n for g in doc["groups"] for n in g) == sorted(sharded)


def test_dirty_history_is_a_blocker(topology, make_fleet):
    dsn = make_fleet.new_database(0)
    load_app(dsn, "tasks_prisma")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO _prisma_migrations (id, checksum, migration_name) "
            "VALUES ('x', 'y', '20250501000000_half_done')"
        )
    r, doc = plan(topology, dsn)
    assert r.exit_code == 1
    assert message(doc, "history", "_prisma_migrations") == (
        "prisma's _prisma_migrations records a migration that did not finish (last: "
        "20250402120000_memberships_audit): finish or repair it with prisma before the baseline "
        "records the history as applied"
    )


def test_server_settings_blockers():
    """The version and settings rules, given the facts a server reports (the sandbox's servers all
    meet them: PostgreSQL 16-18, wal_level=logical, 20 slots and senders)."""
    facts = {
        "version_num": 140011,
        "wal_level": "replica",
        "max_replication_slots": 4,
        "slots_used": 3,
        "max_wal_senders": 10,
        "senders_used": 0,
    }
    assert [b.message for b in server_blockers(facts, hosts=2)] == [
        (
            "PostgreSQL 14.11: the copy needs 15 or later (publication row filters); upgrade the old "
            "database first"
        ),
        "wal_level=replica: the copy needs wal_level=logical (a restart)",
        (
            "max_replication_slots=4 with 3 in use: the copy needs 2 free (one per host); raise it (a "
            "restart)"
        ),
    ]
    ok = {**facts, "version_num": 160004, "wal_level": "logical", "slots_used": 0}
    assert server_blockers(ok, hosts=2) == []


# (statement the app runs, its parameters, times, the class the test expects)
WORKLOAD = [
    ("SELECT * FROM projects WHERE user_id = %s", (3,), 5, "single-shard"),
    ("SELECT * FROM tasks WHERE project_id = %s", (4,), 4, "single-shard"),  # the parent's ID
    ("UPDATE tasks SET status = 'DONE' WHERE id = %s", (5,), 2, "single-shard"),
    (
        "SELECT t.title FROM tasks t JOIN projects p ON p.id = t.project_id WHERE p.user_id = %s",
        (2,),
        3,
        "single-shard",
    ),
    ("INSERT INTO projects (user_id, name) VALUES (%s, %s)", (1, "p"), 2, "single-shard"),
    ("SELECT * FROM users WHERE id = ANY(%s)", ([1, 2, 3],), 3, "multi-shard"),
    ("SELECT count(*) FROM tasks WHERE status = 'DONE'", (), 2, "fan-out"),
    (
        "SELECT u.email, p.name FROM users u JOIN plans p ON p.id = u.plan_id WHERE u.id = %s",
        (1,),
        2,
        "unroutable",
    ),
    (
        "SELECT m.role FROM memberships m JOIN projects p ON p.id = m.project_id WHERE m.user_id = %s",
        (1,),
        2,
        "unroutable",
    ),
    ('INSERT INTO "AuditLog" (action) VALUES (%s)', ("x",), 1, "unroutable"),
    ("SELECT name FROM plans ORDER BY price_cents", (), 3, "global"),
]


def test_query_classes_from_pg_stat_statements(topology, make_fleet):
    dsn = make_fleet.new_database(0)
    load_app(dsn, "tasks_prisma")
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_stat_statements")
        except psycopg.Error as exc:
            pytest.skip(f"this build has no preloaded pg_stat_statements: {exc}")
        # only this database's statements (the loader's are not the app's workload)
        conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)"
        )
        for text, params, times, _ in WORKLOAD:
            for _ in range(times):
                conn.execute(text, params)
    _r, doc = plan(topology, dsn)
    queries = doc["queries"]
    assert queries["available"], doc["notes"]
    by_text = {s["query"]: s for s in queries["statements"]}
    got = {}
    for text, _, times, expected in WORKLOAD:
        words = text.split()[:4]
        match = [s for q, s in by_text.items() if q.split()[:4] == words]
        assert len(match) == 1, (text, list(by_text))
        got[text] = (match[0]["cls"], match[0]["calls"])
    assert got == {text: (cls, times) for text, _, times, cls in WORKLOAD}
    classes = queries["classes"]
    for cls in ("single-shard", "multi-shard", "fan-out", "unroutable", "global"):
        expected = [w for w in WORKLOAD if w[3] == cls]
        assert classes[cls]["statements"] == len(expected)
        assert classes[cls]["calls"] == sum(w[2] for w in expected)
    assert abs(sum(c["time_share"] for c in classes.values()) - 1) < 0.001


def test_global_host_bad_input_and_unreachable(make_fleet, sources):
    """placement.global_host names the global tables' host (validated like the rest of the file);
    a bad DSN is exit 2, a server that does not answer exit 3."""
    path = make_fleet(hosts=2, shards=4, extra=ROUTING + "placement:\n  global_host: pg2\n")
    _, doc = plan(path, sources["tasks_prisma"])
    assert doc["global_host"] == "pg2"
    assert not any("global_host" in n for n in doc["notes"])
    bad = make_fleet(hosts=2, shards=4, extra=ROUTING + "placement:\n  global_host: pg9\n")
    r = run_cli("adopt", "plan", "--from", sources["tasks_prisma"], config=bad)
    assert (
        r.exit_code == 2
        and "placement.global_host must name a host (pg1, pg2), got 'pg9'" in r.stderr
    )
    topology = make_fleet(hosts=2, shards=4, extra=ROUTING)
    r = run_cli("adopt", "plan", "--from", "host='unclosed", config=topology)
    assert r.exit_code == 2 and "--from: not a valid libpq connection string" in r.stderr, r
    r = run_cli("adopt", "plan", "--from", "postgresql://u:s3cret@127.0.0.1:1/x", config=topology)
    assert r.exit_code == 2 and "--from contains a literal password" in r.stderr, r
    assert "s3cret" not in r.stderr
    r = run_cli("adopt", "plan", "--from", "postgresql://u@127.0.0.1:1/x", config=topology)
    assert r.exit_code == 3 and "host source is unreachable" in r.stderr, r
    r = run_cli(
        "adopt", "plan", "--from", sources["tasks_prisma"], "--root", "nope", config=topology
    )
    assert r.exit_code == 2 and "--root nope: no such table in schema public" in r.stderr, r


APP = """
CREATE TABLE users (id bigserial PRIMARY KEY, email text NOT NULL);
CREATE TABLE posts (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users (id));
"""
HISTORIES = {
    "alembic golang-migrate flyway": """
CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY);
INSERT INTO alembic_version VALUES ('3f2a9c1e7b44');
CREATE TABLE schema_migrations (version bigint PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO schema_migrations VALUES (20250312, true);
CREATE TABLE flyway_schema_history (
    installed_rank int PRIMARY KEY, version varchar(50), description varchar(200) NOT NULL,
    success boolean NOT NULL);
INSERT INTO flyway_schema_history VALUES (1, '1', 'init', true), (2, '2', 'posts', true),
                                         (3, NULL, 'repeatable views', true);
""",
    "rails": """
CREATE TABLE schema_migrations (version varchar PRIMARY KEY);
CREATE TABLE ar_internal_metadata (key varchar PRIMARY KEY, value varchar);
INSERT INTO schema_migrations VALUES ('20240101000000'), ('20240615093000');
""",
}


def test_histories_of_other_tools(make_fleet, topology):
    """Alembic, golang-migrate (its dirty flag a blocker), Flyway and Rails tables are read for the
    history and left out of the adopted tables."""
    found = {}
    for name, sql in HISTORIES.items():
        dsn = make_fleet.new_database(0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(APP + sql)
        r, doc = plan(topology, dsn)
        found[name] = (r.exit_code, doc["history"], [b["message"] for b in doc["blockers"]])
        assert {t["name"] for t in doc["tables"] if t["kind"] != "history"} == {"users", "posts"}
    assert found["alembic golang-migrate flyway"] == (
        1,
        [
            {"tool": "alembic", "table": "alembic_version", "applied": 1, "last": "3f2a9c1e7b44"},
            {
                "tool": "flyway",
                "table": "flyway_schema_history",
                "applied": 3,
                "last": "repeatable views",
            },
            {
                "tool": "golang-migrate",
                "table": "schema_migrations",
                "applied": None,
                "last": "20250312",
            },
        ],
        [
            (
                "golang-migrate's schema_migrations records a migration that did not finish (last: "
                "20250312): finish or repair it with golang-migrate before the baseline records the "
                "history as applied"
            )
        ],
    )
    assert found["rails"] == (
        0,
        [{"tool": "rails", "table": "schema_migrations", "applied": 2, "last": "20240615093000"}],
        [],
    )


def test_server_settings_blockers_on_a_real_server(private_sandbox, topology):
    """A server with wal_level=replica and too few slots and WAL senders: three blockers, each one
    line with its ALTER SYSTEM fix, read from the server's own settings."""
    box = private_sandbox(hosts=1, shards=4)
    dsn = box.status()["hosts"][0]["dsn"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP)
        for setting, value in (("wal_level", "replica"), ("max_replication_slots", "1")):
            conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
        conn.execute("ALTER SYSTEM SET max_wal_senders = 1")
    box.stop_host("pg1")
    box.start_host("pg1")
    r, doc = plan(topology, dsn)
    assert r.exit_code == 1
    server = [b for b in doc["blockers"] if b["kind"] == "server"]
    assert [b["message"] for b in server] == [
        "wal_level=replica: the copy needs wal_level=logical (a restart)",
        "max_replication_slots=1 with 0 in use: the copy needs 2 free (one per host); raise it (a restart)",
        "max_wal_senders=1 with 0 in use: the copy needs 2 free (one per host); raise it (a restart)",
    ]
    assert [b["fix"] for b in server] == [
        ["ALTER SYSTEM SET wal_level = logical;"],
        ["ALTER SYSTEM SET max_replication_slots = 4;"],
        ["ALTER SYSTEM SET max_wal_senders = 4;"],
    ]
    assert found(doc) == {("server", None)}
