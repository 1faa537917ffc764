"""The way back (``adopt cutover --abort``) of a table ``adopt copy`` routes by trigger (#39): the task
tracker's ``tasks``, whose enum column has each shard's own type, so it has no parent whose
partitions are the shard tables; a mirror trigger on each shard table writes the fleet's changes
into the shard's staging partition, which the way back publishes.

Judged by the old database's rows, read by these tests' own queries, against the fleet's rows read
directly on each shard (what the fleet held when the abort closed it to writes) and the writes a
writer was told are done."""

from __future__ import annotations

from pathlib import Path

import psycopg
from support.fleet import load
from test_adopt_cutover import SHARDS, cli_json, fleet_tasks, real_adoption, sql


def shard_rows(path: Path, table: str, cols: str) -> set[tuple]:
    """(cols) of every row of ``table`` on the fleet's shards, each read directly."""
    topo = load(path)
    out: set[tuple] = set()
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
            for n in host.shards:
                out |= set(sql(conn, f"SELECT {cols} FROM {topo.schema_name(n)}.{table}"))
    return out


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
    want = fleet_tasks(path)
    assert made in want and len(want) == others + 1
    with psycopg.connect(dsn, autocommit=True) as src:
        got = dict(sql(src, "SELECT id, to_jsonb(t) FROM public.tasks t"))
    assert got == want
    cols = "task_id, label"
    assert old_rows(dsn, "task_labels", cols) == shard_rows(path, "task_labels", cols)
    no_mirror_left(path)
