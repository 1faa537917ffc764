"""The way back (``adopt cutover --abort``) of a table ``adopt copy`` routes by trigger (#39): the task
tracker's ``tasks``, whose enum column has each shard's own type, so it has no parent whose
partitions are the shard tables; a mirror trigger on each shard table writes the fleet's changes
into the shard's staging partition, which the way back publishes.

Judged by the old database's rows, read by these tests' own queries, against the fleet's rows read
directly on each shard (what the fleet held when the abort closed it to writes) and the writes a
writer was told are done."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
from support import crash_at
from support.adopt_cutover import (
    SHARDS,
    cli_json,
    fleet_name,
    fleet_tasks,
    leftovers,
    real_adoption,
    shard_rows,
    sql,
)
from support.fleet import load


def fleet_table_rows(path: Path, table: str, cols: str, aborted: bool = False) -> set[tuple]:
    """(cols) of every row of ``table`` on the fleet's shards, each read directly (after an abort:
    ``aborted``, under the name it gave them)."""
    query = f"SELECT {cols} FROM {{}}.{fleet_name(table, aborted)}"
    return {row for _, _, row in shard_rows(path, query)}


def old_rows(dsn: str, table: str, cols: str) -> set[tuple]:
    with psycopg.connect(dsn, autocommit=True) as src:
        return set(sql(src, f"SELECT {cols} FROM public.{table}"))


def busiest_shard(path: Path, dsn: str) -> int:
    """The shard holding the most tasks (by the old database's moved rows: ``user_id % N``)."""
    with psycopg.connect(dsn, autocommit=True) as src:
        return sql(
            src,
            f"SELECT user_id %% {SHARDS} FROM shardctl_adopted.tasks GROUP BY 1 "
            "ORDER BY count(*) DESC LIMIT 1",
        )[0][0]


def no_mirror_left(path: Path) -> None:
    for host in load(path).hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            assert sql(conn, "SELECT tgname FROM pg_trigger WHERE tgname LIKE '%%mirror%%'") == []


def test_abort_carries_back_a_truncate_of_a_shard_table_routed_by_trigger(make_fleet, tmp_path):
    """After the cutover one shard's ``tasks`` (routed by trigger) and ``task_labels`` (a partition
    of its parent) are truncated on the fleet, and a task is inserted there again; another shard's
    tasks are untouched. --abort leaves the old database with exactly the fleet's tasks and labels:
    the truncated shard's old rows gone, its new one there, the other shards' rows kept."""
    path, dsn, _ = real_adoption(make_fleet, tmp_path, "tasks_prisma")
    topo = load(path)
    n = busiest_shard(path, dsn)
    host, s = topo.host_of(n), topo.schema_name(n)
    with psycopg.connect(dsn, autocommit=True) as src:
        before = sql(
            src, f"SELECT count(*) FROM shardctl_adopted.tasks WHERE user_id %% {SHARDS} = %s", n
        )[0][0]
        others = sql(
            src, f"SELECT count(*) FROM shardctl_adopted.tasks WHERE user_id %% {SHARDS} <> %s", n
        )[0][0]
    assert before > 0 and others > 0
    with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
        keep = sql(conn, f"SELECT project_id, user_id FROM {s}.tasks LIMIT 1")[0]
        sql(conn, f"TRUNCATE {s}.tasks, {s}.task_labels")
        made = sql(
            conn,
            f"INSERT INTO {s}.tasks (project_id, user_id, title, status) "
            "VALUES (%s, %s, 'after the truncate', 'DOING') RETURNING id",
            *keep,
        )[0][0]
    assert cli_json(path, "--abort")["phase"] == "aborted"
    want = fleet_tasks(path, aborted=True)
    assert made in want and len(want) == others + 1
    with psycopg.connect(dsn, autocommit=True) as src:
        got = dict(sql(src, "SELECT id, to_jsonb(t) FROM public.tasks t"))
    assert got == want
    cols = "task_id, label"
    assert old_rows(dsn, "task_labels", cols) == fleet_table_rows(
        path, "task_labels", cols, aborted=True
    )
    no_mirror_left(path)


class Writer:
    """Inserts tasks into one shard table on the fleet until a write is refused; ``acked``: the IDs
    it was told are written."""

    def __init__(self, host, schema: str, like: int):
        self.host, self.schema, self.like = host, schema, like
        self.acked: list[int] = []
        self.stopped: list[psycopg.Error] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        s = self.schema
        with psycopg.connect(**self.host.connect_kwargs(), autocommit=True) as conn:
            while True:
                try:
                    self.acked += sql(
                        conn,
                        f"INSERT INTO {s}.tasks (project_id, user_id, title, status) SELECT "
                        f"project_id, user_id, 'during the abort', 'DOING' FROM {s}.tasks "
                        "WHERE id = %s RETURNING id",
                        self.like,
                    )[0]
                except psycopg.Error as exc:
                    self.stopped.append(exc)
                    return
                time.sleep(0.005)


@pytest.mark.parametrize(
    "point",
    [
        pytest.param("adopt-abort-fleet-committed", marks=pytest.mark.slow),
        pytest.param("adopt-abort-fleet-locked", marks=pytest.mark.slow),
        pytest.param("adopt-abort-source-open", marks=pytest.mark.slow),
        pytest.param("adopt-abort-flipped", marks=pytest.mark.slow),
    ],
)
def test_sigkill_in_abort_with_a_table_routed_by_trigger_then_rerun(make_fleet, tmp_path, point):
    """--abort killed at ``point`` while a writer inserts tasks on the fleet, after an update (its
    enum value changed), a delete and a TRUNCATE made there: run again, the old database has exactly
    the fleet's tasks and labels (every insert the writer was told is done among them), the topology
    says source, the run is aborted, no replication object or mirror trigger is left, the old tables
    take writes and the fleet's refuse them."""
    path, dsn, _ = real_adoption(make_fleet, tmp_path, "tasks_prisma")
    topo = load(path)
    n = busiest_shard(path, dsn)
    other = next(k for k in range(SHARDS) if k != n and topo.host_of(k) != topo.host_of(n))
    host, s = topo.host_of(n), topo.schema_name(n)
    with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
        edit, gone = (r[0] for r in sql(conn, f"SELECT id FROM {s}.tasks ORDER BY id LIMIT 2"))
        sql(conn, f"UPDATE {s}.tasks SET status = 'DONE', title = 'edited' WHERE id = %s", edit)
        sql(conn, f"DELETE FROM {s}.tasks WHERE id = %s", gone)
    o_host, o = topo.host_of(other), topo.schema_name(other)
    with psycopg.connect(**o_host.connect_kwargs(), autocommit=True) as conn:
        sql(conn, f"TRUNCATE {o}.tasks, {o}.task_labels")
    writer = Writer(host, s, edit)
    time.sleep(0.3)
    # the freeze's bound is not under test here: a wide one keeps a loaded machine from failing it
    abort = ("--abort", "--max-freeze", "3")
    r = crash_at.run(point, "--config", str(path), "adopt", "cutover", *abort, "--json")
    assert r.returncode == -9, r.stderr[-2000:]
    assert writer.thread.is_alive() or writer.stopped[0].sqlstate == "42P01", writer.stopped
    assert cli_json(path, *abort)["phase"] == "aborted"
    writer.thread.join(30)
    # its table's name gone (the abort renamed it): undefined_table
    assert writer.stopped and writer.stopped[0].sqlstate == "42P01", writer.stopped
    want = fleet_tasks(path, aborted=True)
    assert want[edit]["status"] == "DONE" and gone not in want
    assert not any(t["user_id"] % SHARDS == other for t in want.values())
    assert len(writer.acked) > 5 and set(writer.acked) <= set(want), len(writer.acked)
    with psycopg.connect(dsn, autocommit=True) as src:
        assert dict(sql(src, "SELECT id, to_jsonb(t) FROM public.tasks t")) == want
        assert sql(src, "SELECT phase FROM shardctl_adopt.run") == [("aborted",)]
        sql(src, "UPDATE tasks SET status = 'TODO' WHERE id = %s", edit)  # writable again
    cols = "task_id, label"
    assert old_rows(dsn, "task_labels", cols) == fleet_table_rows(
        path, "task_labels", cols, aborted=True
    )
    assert load(path).adoption.authoritative == "source"
    no_mirror_left(path)
    assert all(x.startswith("parent") for v in leftovers(path, dsn).values() for x in v)
