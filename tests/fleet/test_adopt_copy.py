"""``shardctl adopt copy``: a real old database (an app schema of tests/data/apps with generated data,
its plan's fixes applied) copied online into a 2-host fleet inited with its baseline, while a writer
inserts, updates (TOAST-sized values, and keys: rows that must move to a shard on the other host) and
deletes on it. Once the copy has caught up, EVERY shard's rows are compared with the source rows
whose ``key % N`` is that shard, read by this test's own SELECTs on the source, and no row is on a
wrong shard. SIGKILL at phase boundaries, then a re-run, loses nothing."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import psycopg
import pytest
from support import crash_at
from support.apps import apply_fixes, load_app
from support.fleet import admin_dsn, load, run_cli, sandbox_dir
from support.versions import need

from shardctl.dev.sandbox import Sandbox
from shardctl.ops.adopt.state import load_run, run_tag, slot_name

ROUTING = "routing:\n  key: user_id\n"
SHARDS = 4
APP = "forum_django"


def adopted_fleet(make_fleet, tmp_path, dsn: str, app: str = APP, users: int = 40):
    """A 2-host fleet of SHARDS shards inited with the baseline of ``app`` loaded at ``dsn``; returns
    (topology path, plan file, plan document)."""
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    load_app(dsn, app, users=users)
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, app, json.loads(r.stdout))
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, "--json", config=path)
    assert r.exit_code == 0, r
    r = run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path)
    assert r.exit_code == 0, r
    assert run_cli("init", config=path).exit_code == 0
    return path, plan_file, json.loads(r.stdout) if r.stdout.startswith("{") else None


def plan_doc(path, dsn):
    return json.loads(run_cli("adopt", "plan", "--from", dsn, "--json", config=path).stdout)


class Writer(threading.Thread):
    """The app, writing on the old database: new users and posts (some TOAST-sized), post edits,
    votes deleted, and votes given to another user (their key changes: most go to another shard,
    half of them on the other host)."""

    def __init__(self, dsn: str, app: str = APP):
        super().__init__(daemon=True)
        self.app = app
        self.dsn, self.stop, self.done, self.errors = dsn, threading.Event(), 0, []
        self.key_moves = 0

    def run(self) -> None:
        rnd = random.Random(7)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    self.step(conn, rnd)
                    self.done += 1
                    time.sleep(0.002)
        except psycopg.Error as exc:  # reported by the test
            self.errors.append(repr(exc))

    def step(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        big = "".join(f"{rnd.getrandbits(128):032x}" for _ in range(400))  # 12.8 kB: TOAST
        getattr(self, self.app)(conn, rnd, big if rnd.random() < 0.5 else "short")

    def forum_django(self, conn: psycopg.Connection, rnd: random.Random, body: str) -> None:
        users = [r[0] for r in conn.execute("SELECT id FROM auth_user").fetchall()]
        uid = conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) VALUES ('p', false, %s, '', '', '', false, "
            "true, now()) RETURNING id",
            (f"w{rnd.getrandbits(48)}",),
        ).fetchone()[0]
        thread = conn.execute(
            "INSERT INTO forum_thread (title, created, pinned, author_id, board_id) "
            "VALUES ('w', now(), false, %s, 1) RETURNING id",
            (uid,),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO forum_post (body, created, author_id, thread_id) VALUES (%s, now(), %s, %s)",
            (body, uid, thread),
        )
        conn.execute(
            "UPDATE forum_post SET body = %s WHERE id = (SELECT id FROM forum_post "
            "ORDER BY random() LIMIT 1)",
            (body,),
        )
        conn.execute(
            "DELETE FROM forum_vote WHERE id = (SELECT id FROM forum_vote ORDER BY random() LIMIT 1)"
        )
        moved = conn.execute(
            "UPDATE forum_vote SET user_id = %s WHERE id = (SELECT id FROM forum_vote "
            "ORDER BY random() LIMIT 1)",
            (rnd.choice(users),),
        )
        self.key_moves += moved.rowcount

    def tasks_prisma(self, conn: psycopg.Connection, rnd: random.Random, body: str) -> None:
        users = [r[0] for r in conn.execute("SELECT id FROM users").fetchall()]
        uid = conn.execute(
            "INSERT INTO users (email, name, plan_id) VALUES (%s, 'w', 1) RETURNING id",
            (f"w{rnd.getrandbits(48)}@x",),
        ).fetchone()[0]
        project = conn.execute(
            "INSERT INTO projects (user_id, name) VALUES (%s, 'w') RETURNING id", (uid,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO tasks (project_id, user_id, title, body, status) "
            "VALUES (%s, %s, 't', %s, 'DOING')",
            (project, uid, body),
        )
        conn.execute(  # an enum value and a TOAST-sized one change: the routed table's path
            "UPDATE tasks SET status = 'DONE', body = %s WHERE id = (SELECT id FROM tasks "
            "ORDER BY random() LIMIT 1)",
            (body,),
        )
        conn.execute(
            'DELETE FROM "AuditLog" WHERE id = (SELECT id FROM "AuditLog" ORDER BY random() LIMIT 1)'
        )
        moved = conn.execute(
            'UPDATE "AuditLog" SET "userId" = %s WHERE id = (SELECT id FROM "AuditLog" '
            "ORDER BY random() LIMIT 1)",
            (rnd.choice(users),),
        )
        self.key_moves += moved.rowcount


def source_rows(conn: psycopg.Connection, table: str, key: str | None, shard: int | None) -> list:
    """The source's rows of ``table`` (those of ``shard`` when given), sorted: this test's own read."""
    q = psycopg.sql.SQL("SELECT * FROM public.{}").format(psycopg.sql.Identifier(table))
    if key is not None:
        q = psycopg.sql.SQL("{} WHERE {} % {} = {}").format(
            q, psycopg.sql.Identifier(key), psycopg.sql.Literal(SHARDS), psycopg.sql.Literal(shard)
        )
    return sorted(conn.execute(q).fetchall(), key=repr)


def table_rows(conn: psycopg.Connection, schema: str, table: str) -> list:
    q = psycopg.sql.SQL("SELECT * FROM {}").format(psycopg.sql.Identifier(schema, table))
    return sorted(conn.execute(q).fetchall(), key=repr)


def wait_caught_up(dsn: str, timeout: float = 60) -> None:
    """Until every adopt slot on the source has confirmed the source's WAL as of now (this test's own
    look at pg_replication_slots)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.monotonic() + timeout
        while True:
            behind = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE database = current_database() "
                "AND slot_name LIKE 'shardctl_adopt_%%' AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < %s)",
                (lsn,),
            ).fetchone()[0]
            if not behind:
                return
            assert time.monotonic() < deadline, f"{behind} slot(s) behind {lsn}"
            time.sleep(0.1)


BIG = {"forum_django": ("forum_post", "body"), "tasks_prisma": ("tasks", "body")}


def assert_same_as_source(path, dsn: str, doc: dict, app: str = APP) -> int:
    """Every shard holds exactly the source's rows of its keys, TOAST-sized ones included, none of
    another shard's, and the global host the global tables; returns the rows compared."""
    topo = load(path)
    conns = {h.name: psycopg.connect(**h.connect_kwargs(), autocommit=True) for h in topo.hosts}
    src = psycopg.connect(dsn, autocommit=True)
    compared = toast = 0
    sharded = {t["name"]: t["key"] for t in doc["tables"] if t["kind"] in ("root", "column")}
    big_table, big_column = BIG[app]
    try:
        for shard in range(SHARDS):
            conn, schema = conns[topo.host_of(shard).name], topo.schema_name(shard)
            for table, key in sharded.items():
                want = source_rows(src, table, key, shard)
                got = table_rows(conn, schema, table)
                assert got == want, (table, shard, len(got), len(want))
                compared += len(got)
                q = psycopg.sql.SQL("SELECT count(*) FROM {} WHERE {} % {} <> {}").format(
                    psycopg.sql.Identifier(schema, table),
                    psycopg.sql.Identifier(key),
                    psycopg.sql.Literal(SHARDS),
                    psycopg.sql.Literal(shard),
                )
                assert conn.execute(q).fetchone()[0] == 0, (table, shard, "wrong-shard rows")
            toast += conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {} WHERE length({}) > 8000").format(
                    psycopg.sql.Identifier(schema, big_table), psycopg.sql.Identifier(big_column)
                )
            ).fetchone()[0]
        assert toast > 0
        conn = conns[topo.global_host or topo.hosts[0].name]
        for table in [t["name"] for t in doc["tables"] if t["kind"] == "global"]:
            assert table_rows(conn, "public", table) == source_rows(src, table, None, None), table
    finally:
        for c in [src, *conns.values()]:
            c.close()
    return compared


def copy_under_writes(path, plan_file, dsn, *extra: str, app: str = APP) -> tuple[dict, Writer]:
    writer = Writer(dsn, app)
    writer.start()
    try:
        time.sleep(0.3)
        r = run_cli(
            "adopt", "copy", "--from", dsn, "--plan", plan_file, "--json", *extra, config=path
        )
        assert r.exit_code == 0, r
        time.sleep(0.5)  # writes after the copy caught up: replication carries them
    finally:
        writer.stop.set()
        writer.join()
    assert not writer.errors, writer.errors
    return json.loads(r.stdout), writer


@pytest.mark.parametrize(
    "app, identity_full, nice",
    [
        ("forum_django", "forum_post", "0.2"),
        # the task tracker's enum path runs in the default suite on PostgreSQL 16 (below)
        pytest.param("tasks_prisma", "projects", "0", marks=pytest.mark.slow),
    ],
)
def test_copy_under_writes_then_every_shard_equals_the_source(
    make_fleet, tmp_path, app, identity_full, nice
):
    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, app)
    doc = plan_doc(path, dsn)
    result, writer = copy_under_writes(path, plan_file, dsn, "--nice", nice, app=app)
    assert result["phase"] == "synced", result
    assert writer.done > 5 and writer.key_moves > 0, (writer.done, writer.key_moves)
    # tables whose identity (their primary key) lacks the key: FULL, recorded
    root = doc["root"]
    assert result["routed"] == (["tasks"] if app == "tasks_prisma" else []), result  # its enum
    assert identity_full in result["replica_identity_full"], result
    assert root not in result["replica_identity_full"], result
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc, app) > 100
    adoption = load(path).adoption  # the topology now routes every shard to the old database
    assert adoption.on_source and adoption.source.dsn == dsn and identity_full in adoption.tables
    with psycopg.connect(dsn) as conn:  # every old ID is below the floor
        top = conn.execute(
            psycopg.sql.SQL("SELECT max(id) FROM {}").format(psycopg.sql.Identifier(identity_full))
        ).fetchone()[0]
    assert top < adoption.id_floor == result["id_floor"]
    assert adoption.id_map.dbname.endswith("_adopt_ids"), (
        adoption.id_map
    )  # its own, beside the fleet's

    # the topology's adoption.source names the old database: no --from needed
    status = json.loads(run_cli("adopt", "status", "--json", config=path).stdout)
    assert status["phase"] == "synced" and len(status["hosts"]) == 2, status
    for host in status["hosts"]:
        assert host["state"] == "streaming" and host["rows"] > 0, host
        assert host["retained_bytes"] is not None and host["lag_bytes"] is not None, host
    human = run_cli("adopt", "status", config=path)
    assert human.exit_code == 0 and "of WAL for the copy" in human.stdout, human
    # a re-run keeps everything (nothing copied again) and still loses nothing
    again = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, "--json", config=path)
    assert again.exit_code == 0 and json.loads(again.stdout)["copied_bytes"] == 0, again


@pytest.mark.parametrize(
    "points",
    [
        ("adopt-mid-copy", "adopt-after-subscription"),
        pytest.param(
            ("adopt-after-identity", "adopt-after-copy", "adopt-after-sync"),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sigkill_at_phase_boundaries_then_a_rerun_loses_nothing(make_fleet, tmp_path, points):
    """SIGKILL at each of ``points`` in turn (in the middle of a host's COPY; after a host's copy
    is recorded and its subscription made, not started; …): each re-run starts over what was cut
    short, keeps the rest, and the shards end equal to the source, under writes the whole time."""
    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn)
    doc = plan_doc(path, dsn)
    args = ("--config", str(path), "adopt", "copy", "--from", dsn, "--plan", str(plan_file))
    writer = Writer(dsn)
    writer.start()
    try:
        for point in points:
            killed = crash_at.run(point, *args, timeout=120)
            assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr)
            status = json.loads(
                run_cli("adopt", "status", "--from", dsn, "--json", config=path).stdout
            )
            assert status["phase"] == ("synced" if point == "adopt-after-sync" else "copying")
        if points[-1] == "adopt-after-subscription":
            states = [h["state"] for h in status["hosts"]]
            assert "copied" in states or "streaming" in states, status
        r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, "--json", config=path)
        assert r.exit_code == 0, r
        time.sleep(0.3)
    finally:
        writer.stop.set()
        writer.join()
    assert not writer.errors, writer.errors
    assert json.loads(r.stdout)["phase"] == "synced"
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc) > 100
    with psycopg.connect(dsn) as conn:  # one slot per fleet host, no other left behind
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
            "ORDER BY 1"
        ).fetchall()
        tag = run_tag(load_run(conn))
    assert tag  # a run of today's adopt copy names its objects after itself
    assert [s[0] for s in slots] == sorted(slot_name(h, tag) for h in ("ids", "pg1", "pg2")), slots


@pytest.fixture(params=["16", pytest.param("17", marks=pytest.mark.slow)])
def old_server(request):
    """A PostgreSQL ``request.param`` server of its own for the old database (the fleet's are 18)."""
    major = need(request.param)
    box = Sandbox(sandbox_dir(f"adopt{major}"))
    try:
        box.up(hosts=1, shards=1, pg=major)
        port = box.state.hosts[0].port
        with psycopg.connect(admin_dsn(port), autocommit=True) as conn:
            conn.execute("CREATE DATABASE olddb")
        yield admin_dsn(port, "olddb")
    finally:
        box.destroy()


def test_copy_from_an_older_major(make_fleet, tmp_path, old_server):
    dsn, app = old_server, "tasks_prisma"
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, app)
    doc = plan_doc(path, dsn)
    result, writer = copy_under_writes(path, plan_file, dsn, app=app)
    assert result["phase"] == "synced" and writer.key_moves > 0, result
    with psycopg.connect(dsn, autocommit=True) as conn:  # a TRUNCATE of the routed (enum) table
        conn.execute("TRUNCATE tasks CASCADE")
        rnd = random.Random(3)
        for n in range(4):  # new tasks after it, TOAST-sized ones too
            big = "".join(f"{rnd.getrandbits(128):032x}" for _ in range(400))
            writer.tasks_prisma(conn, rnd, big if n % 2 else "s")
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc, app) > 100
    assert_staged_by_shard(path, dsn, "tasks", "user_id")


def assert_staged_by_shard(path, dsn: str, table: str, key: str) -> None:
    """The routed table on each host holds each of its shards' rows (the source's ids of that
    shard, the initial copy's and the live changes') in a partition of that shard alone, so the
    initial copy reads each shard's rows once; its long values stored uncompressed (compressed once,
    by the shard's table)."""
    topo = load(path)
    with psycopg.connect(dsn, autocommit=True) as src:
        want = {
            shard: sorted(r[0] for r in source_rows(src, table, key, shard))  # r[0]: its id
            for shard in range(SHARDS)
        }
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            parts = conn.execute(
                "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
                (f"public.{table}",),
            ).fetchall()
            bounds = {name: int(bound.strip("FORVALUESIN ()'")) for name, bound in parts}
            assert sorted(bounds.values()) == sorted(host.shards), (host.name, parts)
            for name, shard in bounds.items():
                ids = [r[0] for r in conn.execute(f"SELECT id FROM {name}").fetchall()]
                assert sorted(ids) == want[shard], (name, len(ids), len(want[shard]))
            storage = conn.execute(
                "SELECT attstorage FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attname = 'body'",
                (parts[0][0],),
            ).fetchone()
            assert storage == ("e",), storage


def source_state(dsn: str) -> tuple:
    """What adopt copy would change on the source: its state schema, publications, slots, identities."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT to_regnamespace('shardctl_adopt') IS NULL, "
            "(SELECT count(*) FROM pg_publication), "
            "(SELECT count(*) FROM pg_replication_slots WHERE database = current_database()), "
            "(SELECT string_agg(relname || relreplident::text, ',' ORDER BY relname) FROM pg_class "
            " WHERE relnamespace = 'public'::regnamespace AND relkind = 'r')"
        ).fetchone()


def test_bad_input_one_line_exit_2_nothing_changed(make_fleet, tmp_path):
    """No plan file, a plan of another database, a fleet not inited, a fleet past the baseline: one
    line, exit 2, and neither the source nor the topology file changed."""
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    dsn = make_fleet.new_database(0)
    load_app(dsn, APP)
    apply_fixes(dsn, APP, plan_doc(path, dsn))
    plan_file = tmp_path / "plan.yaml"
    assert run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, config=path).exit_code == 0
    other = make_fleet.new_database(1)
    load_app(other, "tasks_prisma")
    before, text = source_state(dsn), path.read_text()
    cases = [
        (dsn, tmp_path / "none.yaml", "cannot read it"),
        (other, plan_file, "is not a plan of this database"),
        (dsn, plan_file, "run shardctl init"),  # the fleet has no shard yet
    ]
    for source, plan, words in cases:
        r = run_cli("adopt", "copy", "--from", source, "--plan", plan, config=path)
        assert r.exit_code == 2 and words in r.stderr, (words, r)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert source_state(dsn) == before and path.read_text() == text
    # a fleet migrated past the baseline: its shards have a column the old database has not
    assert (
        run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path).exit_code == 0
    )
    (path.parent / "migrations" / "V0002__more.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.forum_post ADD COLUMN score int;\n"
    )
    assert run_cli("init", config=path).exit_code == 0
    text = path.read_text()
    r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, config=path)
    assert r.exit_code == 2 and "forum_post has column score" in r.stderr, r
    assert source_state(dsn) == before and path.read_text() == text
    r = run_cli("adopt", "status", "--from", dsn, "--json", config=path)
    assert r.exit_code == 0 and json.loads(r.stdout)["phase"] == "none", r


@pytest.mark.slow
@pytest.mark.parametrize("app", ["forum_django", "tasks_prisma"])
def test_copy_at_size(make_fleet, tmp_path, app):
    """2,000 users (some 40 MB with TOAST) under writes, then every shard against the source."""
    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, app, users=2000)
    doc = plan_doc(path, dsn)
    seen, stop = [], threading.Event()

    def watch() -> None:  # adopt status while the copy runs: the COPYs' rows as they go
        from shardctl import Topology, adopt_status

        while not stop.is_set():
            seen.extend(h for h in adopt_status(Topology.load(path), dsn).hosts if h.rows)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result, writer = copy_under_writes(path, plan_file, dsn, "--nice", "0.5", app=app)
    finally:
        stop.set()
        watcher.join()
    assert result["phase"] == "synced" and writer.key_moves > 0, result
    assert result["rested_seconds"] > 0, result  # --nice paced the copy
    assert any(h.state == "copying" and h.bytes > 0 for h in seen), seen[:3]
    print(f"{app}: copied {result['copied_bytes']} bytes in {result['seconds']} s")
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc, app) > 10_000


@pytest.mark.slow
def test_ctrl_c_during_the_copy_stops_it_and_a_rerun_finishes(make_fleet, tmp_path):
    """A real SIGINT to a real ``shardctl adopt copy`` while it copies (paced, so it would copy for
    some 20 s more): it stops within seconds with exit 130, and a re-run copies again and loses
    nothing."""
    import subprocess
    import sys

    from shardctl import Topology, adopt_status

    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, users=2000)
    doc = plan_doc(path, dsn)
    args = ["--config", str(path), "adopt", "copy", "--from", dsn, "--plan", str(plan_file)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardctl", *args, "--nice", "100"],
        env=crash_at.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(h.state == "copying" for h in adopt_status(Topology.load(path), dsn).hosts):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert time.monotonic() - started < 4, time.monotonic() - started
    r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, "--json", config=path)
    assert r.exit_code == 0 and json.loads(r.stdout)["phase"] == "synced", r
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc) > 10_000


@pytest.mark.slow
def test_routed_table_through_cutover_and_cleanup_leaves_its_shards_rows(make_fleet, tmp_path):
    """The task tracker (an enum: routed by trigger) copied (staged by shard), verified, cut over and
    cleaned up: the routed table and its per-shard partitions are gone from every host, each shard keeps exactly
    the old database's rows of its keys (compared before the cutover)."""
    dsn, app = make_fleet.new_database(0), "tasks_prisma"
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, app)
    doc = plan_doc(path, dsn)
    result, _ = copy_under_writes(path, plan_file, dsn, app=app)
    assert result["routed"] == ["tasks"], result
    wait_caught_up(dsn)
    assert_same_as_source(path, dsn, doc, app)
    assert_staged_by_shard(path, dsn, "tasks", "user_id")
    topo = load(path)
    before = {}
    for shard in range(SHARDS):
        host = topo.host_of(shard)
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            before[shard] = table_rows(conn, topo.schema_name(shard), "tasks")
    for step in (
        ("adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0"),
        ("adopt", "cutover"),
        ("adopt", "cutover", "--cleanup"),
    ):
        r = run_cli(*step, config=path)
        assert r.exit_code == 0, (step, r.stdout, r.stderr)
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            left = conn.execute(
                "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relname LIKE 'tasks%%' "
                "AND n.nspname IN ('public', 'shardctl_adopt', 'shardctl_adopted')"
            ).fetchall()
            assert left == [], (host.name, left)
            mirrors = "SELECT tgname FROM pg_trigger WHERE tgname = 'shardctl_adopt_mirror'"
            assert conn.execute(mirrors).fetchall() == [], host.name  # the way back's, gone
            for shard in host.shards:
                got = table_rows(conn, topo.schema_name(shard), "tasks")
                assert got == before[shard], (shard, len(got), len(before[shard]))


def test_status_shows_the_runs_verification_killed_then_passed(make_fleet, tmp_path):
    """``adopt status`` reports the last ``adopt verify`` of the run: none yet; one SIGKILLed after
    its first chunk (not finished, with its chunks checked so far); then the finished run, whose
    row counts equal the old database's own count of the adopted tables' rows."""
    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn)
    doc = plan_doc(path, dsn)
    r = run_cli("adopt", "copy", "--from", dsn, "--plan", plan_file, config=path)
    assert r.exit_code == 0, r

    def status() -> tuple[dict, str]:
        got = run_cli("adopt", "status", "--json", config=path)
        human = run_cli("adopt", "status", config=path)
        assert got.exit_code == 0 and human.exit_code == 0, (got, human)
        line = [x for x in human.stdout.splitlines() if x.startswith("adopt verify:")]
        assert len(line) == 1, human.stdout
        return json.loads(got.stdout), line[0]

    got, line = status()
    assert got["verification"] is None and not got["verified"], got
    assert line.startswith("adopt verify: not run yet"), line

    args = ["--config", str(path), "adopt", "verify", "--from", dsn, "--plan", str(plan_file)]
    killed = crash_at.run("adopt-verify-chunk", *args, "--dark-reads", "0", "--chunk-rows", "60")
    assert killed.returncode == -9, killed
    got, line = status()
    run = got["verification"]
    assert run["finished_at"] is None and not got["verified"], got
    assert run["checked"] == 1 and run["chunks"] > 2, run
    assert f"not finished: 1 of {run['chunks']} chunks checked" in line, line

    r = run_cli(*args[2:], "--dark-reads", "0", "--chunk-rows", "60", config=path)
    assert r.exit_code == 0, r
    with psycopg.connect(dsn) as conn:
        rows = sum(
            conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM public.{}").format(
                    psycopg.sql.Identifier(t["name"])
                )
            ).fetchone()[0]
            for t in doc["tables"]
            if t["kind"] in ("root", "column", "global")
        )
    got, line = status()
    run = got["verification"]
    assert got["verified"] and run["finished_at"] and run["checked"] == run["chunks"], got
    assert run["summary"]["source_rows"] == run["summary"]["fleet_rows"] == rows, (run, rows)
    assert line.startswith("adopt verify: passed at ") and f"{rows:,} rows on the source" in line


def test_a_routed_table_copied_in_many_parts_equals_the_source(make_fleet, tmp_path, monkeypatch):
    """The task tracker's tasks (routed by trigger: an enum of each shard's own) copied in parts of
    one shard each, as a host of thousands of shards copies them in parts of 128 (each part one
    transaction, its locks bounded): every shard holds exactly the source's rows of its keys."""
    import shardctl.ops.adopt.copy as copy_module

    monkeypatch.setattr(copy_module, "ROUTED_SHARDS_PER_PART", 1)
    dsn = make_fleet.new_database(0)
    path, plan_file, _ = adopted_fleet(make_fleet, tmp_path, dsn, "tasks_prisma")
    doc = plan_doc(path, dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:  # TOAST-sized values, in several shards
        conn.execute("UPDATE tasks SET body = repeat(md5(id::text), 400) WHERE id % 7 = 0")
    # one COPY worker: the old code made one part of each host's shards, this makes one a shard
    r = run_cli(
        "adopt",
        "copy",
        "--from",
        dsn,
        "--plan",
        plan_file,
        "--copy-workers",
        "1",
        "--json",
        config=path,
    )
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["routed"] == ["tasks"], r.stdout
    wait_caught_up(dsn)
    assert assert_same_as_source(path, dsn, doc, "tasks_prisma") > 100
