"""Two adoptions from ONE old PostgreSQL server at the same time, into two fleets on the same
servers (hosts pg1 and pg2 in both). Replication slots are the server's, not a database's: each
run names its publications, slots and subscriptions with its own tag (``state.slot_name``), so the
second copy starts while the first replicates, each fleet receives exactly its own old database's
rows, and the first's cutover and cleanup leave the second replicating. Judged by this test's own
reads of both old databases and both fleets (``support.apps.source_rows``/``fleet_rows``), never by
``adopt verify``'s report."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psycopg
import pytest
from support.apps import caught_up, fleet_rows, source_rows
from support.fleet import connect, load, run_cli

from shardctl import adopt_copy
from shardctl.ops.adopt.state import load_run, run_tag, slot_name

SHARDS = 4
ROUTING = "routing:\n  key: user_id\n"
APP = """
CREATE TABLE users (id bigserial PRIMARY KEY, name text NOT NULL);
CREATE TABLE posts (id bigserial PRIMARY KEY,
                    user_id bigint NOT NULL REFERENCES users (id), body text NOT NULL);
INSERT INTO users (name) SELECT '{who}' || g FROM generate_series(1, 30) g;
INSERT INTO posts (user_id, body) SELECT u.id, '{who}old' FROM users u, generate_series(1, 3);
"""


def adopting(make_fleet, tmp_path: Path, who: str) -> tuple[Path, Path, str, dict]:
    """An old database on server 0 holding ``who``'s rows, and a 2-host fleet inited with its
    baseline; returns (topology, plan file, old database DSN, plan document)."""
    dsn = make_fleet.new_database(0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP.format(who=who).encode())  # several statements: no parameters
    path = make_fleet(hosts=2, shards=SHARDS, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()
    plan_file = tmp_path / f"plan-{who}.yaml"
    r = run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, "--json", config=path)
    assert r.exit_code == 0, r
    doc = json.loads(r.stdout)
    r = run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path)
    assert r.exit_code == 0, r
    assert run_cli("init", config=path).exit_code == 0
    return path, plan_file, dsn, doc


class Writer(threading.Thread):
    """The app on one old database: new users with posts, edits, deletes, and posts given to
    another user (their key changes), every row marked with ``who``."""

    def __init__(self, dsn: str, who: str):
        super().__init__(daemon=True)
        self.dsn, self.who = dsn, who
        self.stop, self.done, self.errors = threading.Event(), 0, []

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    self.step(conn)
                    self.done += 1
                    time.sleep(0.005)
        except psycopg.Error as exc:
            self.errors.append(repr(exc))

    def step(self, conn: psycopg.Connection) -> None:
        uid = conn.execute(
            "INSERT INTO users (name) VALUES (%s) RETURNING id", (f"{self.who}w",)
        ).fetchone()[0]
        conn.execute("INSERT INTO posts (user_id, body) VALUES (%s, %s)", (uid, f"{self.who}new"))
        conn.execute(
            "UPDATE posts SET body = body || '+' WHERE id = "
            "(SELECT id FROM posts ORDER BY random() LIMIT 1)"
        )
        conn.execute(
            "UPDATE posts SET user_id = (SELECT id FROM users ORDER BY random() LIMIT 1) "
            "WHERE id = (SELECT id FROM posts ORDER BY random() LIMIT 1)"
        )
        conn.execute(
            "DELETE FROM posts WHERE id = (SELECT id FROM posts ORDER BY random() LIMIT 1)"
        )


def copy(path: Path, plan_file: Path, dsn: str) -> str:
    """``adopt copy`` until synced; a copy that cannot catch up (its subscriptions on another
    adoption's slots) fails within a minute rather than the default hour."""
    return adopt_copy(load(path), dsn, plan_file, sync_timeout=60).phase


def tag_of(dsn: str) -> str:
    """The tag of the run recorded at ``dsn``."""
    with psycopg.connect(dsn) as conn:
        tag = run_tag(load_run(conn))
    assert tag, "a run of adopt copy records the tag of its names"
    return tag


def names_of(dsn: str, hosts: list[str]) -> list[str]:
    """The replication objects' names of the run recorded at ``dsn``."""
    return sorted(slot_name(h, tag_of(dsn)) for h in hosts)


def slots(db: str | psycopg.Connection) -> list[str]:
    """The logical slots of the database at DSN ``db`` (or of connection ``db``; the server's
    catalog, read here)."""
    with db if isinstance(db, psycopg.Connection) else psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
            "ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def same_rows(path: Path, dsn: str, doc: dict, who: str) -> int:
    """The fleet at ``path`` holds exactly the old database's rows, shard by shard, and none of the
    other adoption's (every post names its ``who``); returns the rows compared."""
    caught_up(dsn, timeout=60)
    want, got = source_rows(dsn, doc), fleet_rows(load(path), doc)
    assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want)}
    topo, foreign = load(path), 0
    for host in topo.hosts:  # and, read on the fleet: no row of the other adoption's
        with connect(topo, host.name) as conn:
            for n in host.shards:
                foreign += conn.execute(
                    psycopg.sql.SQL("SELECT count(*) FROM {} WHERE left(body, 1) <> %s").format(
                        psycopg.sql.Identifier(topo.schema_name(n), "posts")
                    ),
                    (who,),
                ).fetchone()[0]
    assert foreign == 0
    return sum(n for n, _ in want.values())


@pytest.mark.slow
def test_two_adoptions_from_one_server_at_once(make_fleet, tmp_path):
    path_a, plan_a, dsn_a, doc_a = adopting(make_fleet, tmp_path, "a")
    path_b, plan_b, dsn_b, doc_b = adopting(make_fleet, tmp_path, "b")
    writers = [Writer(dsn_a, "a"), Writer(dsn_b, "b")]
    for w in writers:
        w.start()
    try:
        assert copy(path_a, plan_a, dsn_a) == "synced"
        done_a = writers[0].done
        # the second adoption starts while the first replicates (its writer still writing)
        assert copy(path_b, plan_b, dsn_b) == "synced"
        assert writers[0].done > done_a
        time.sleep(0.3)
    finally:
        for w in writers:
            w.stop.set()
            w.join(10)
    assert not writers[0].errors and not writers[1].errors, writers[0].errors + writers[1].errors
    names_a, names_b = (
        names_of(dsn_a, ["ids", "pg1", "pg2"]),
        names_of(dsn_b, ["ids", "pg1", "pg2"]),
    )
    assert not set(names_a) & set(names_b)
    assert slots(dsn_a) == names_a and slots(dsn_b) == names_b
    assert same_rows(path_a, dsn_a, doc_a, "a") > 100
    assert same_rows(path_b, dsn_b, doc_b, "b") > 100

    # the first is cut over and cleaned up while the second replicates and takes writes
    writer = Writer(dsn_b, "b")
    writer.start()
    try:
        r = run_cli(
            "adopt", "verify", "--from", dsn_a, "--plan", plan_a, "--dark-reads", "0", config=path_a
        )
        assert r.exit_code == 0, r
        r = run_cli("adopt", "cutover", config=path_a)
        assert r.exit_code == 0, r
        assert load(path_a).adoption.authoritative == "fleet"
        for host in ("pg1", "pg2"):  # the way back's slots, on servers the other fleet shares
            back = [slot_name(f"back_{host}", tag_of(dsn_a))]
            assert slots(connect(load(path_a), host)) == back
        r = run_cli("adopt", "cutover", "--cleanup", config=path_a)
        assert r.exit_code == 0, r
        before = writer.done
        time.sleep(0.5)
        assert writer.done > before
    finally:
        writer.stop.set()
        writer.join(10)
    assert not writer.errors, writer.errors
    assert slots(dsn_a) == []  # the first's slots are gone, the second's all there
    assert slots(dsn_b) == names_b
    assert load(path_b).adoption.authoritative == "source"
    assert same_rows(path_b, dsn_b, doc_b, "b") > 100
    r = run_cli("adopt", "status", "--json", config=path_b)
    assert r.exit_code == 0 and json.loads(r.stdout)["phase"] == "synced", r
