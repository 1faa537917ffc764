"""The initial copy of a batch of schemas, done by shardctl itself rather than by the subscription's
table-sync workers: a logical slot created with an exported snapshot on the source, then several
connections pairs copying tables (binary COPY) as of that snapshot into the target, in parallel; the
subscription then starts from the slot's consistent point without copying (``copy_data = false``).

This is as fast as ``pg_dump | psql`` with parallel jobs, needs no table-sync workers (so a target
with few logical replication workers still copies in parallel), and loses nothing: every change
after the snapshot is in the slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import psycopg

from ...sql.catalog import data, inspect, replication
from . import transfer
from .run import MoveRun

MAX_COPY_WORKERS = 4
T = TypeVar("T")
R = TypeVar("R")


def copy_workers(run: MoveRun, tables: int) -> int:
    """Parallel copies: at most MAX_COPY_WORKERS, and never more than there are tables."""
    return max(1, min(MAX_COPY_WORKERS, run.options.copy_workers, tables))


def slot_and_copy(run: MoveRun, name: str, schemas: list[str]) -> int:
    """Create slot ``name`` with a snapshot and copy the schemas' tables as of it. Returns bytes copied."""
    kwargs = run.source.connect_kwargs(
        purpose="admin",
        connect_timeout=run.options.connect_timeout,
        application_name="shardctl move-shard copy",
    )
    with run.connect(run.source) as src:
        items = inspect.tables(src, schemas, "r")
    lock, done = threading.Lock(), [0]

    def tick(n: int) -> None:
        with lock:
            done[0] += n
            run.progress("copy", done[0], len(items), name)

    def one(snapshot: str, chunk: list[tuple[str, str]]) -> int:
        with run.connect(run.source) as s, run.connect(run.target, autocommit=False) as t:
            return transfer.copy_in_snapshot(s, t, snapshot, chunk, tick, run.pause())

    return sum(in_new_slot(kwargs, name, items, copy_workers(run, len(items)), one))


def in_new_slot(
    repl_kwargs: dict, name: str, items: list[T], workers: int, copy: Callable[[str, list[T]], R]
) -> list[R]:
    """Create logical slot ``name`` with an exported snapshot (a replication connection made with
    ``repl_kwargs``, held open while the snapshot is in use), then ``copy(snapshot, chunk)`` for
    ``workers`` chunks of ``items`` in parallel threads. Returns each chunk's result."""
    repl = psycopg.connect(autocommit=True, replication="database", **repl_kwargs)
    try:
        _, snapshot = replication.create_slot_with_snapshot(repl, name)
        chunks = [c for c in (items[i::workers] for i in range(max(1, workers))) if c]
        with ThreadPoolExecutor(
            max_workers=max(1, len(chunks)), thread_name_prefix="shardctl-copy"
        ) as pool:
            futures = [pool.submit(copy, snapshot, chunk) for chunk in chunks]
            try:
                return [f.result() for f in futures]
            except KeyboardInterrupt:
                transfer.COPIES.abandon()  # the pool's exit waits for the threads: stop them now
                raise
    finally:
        transfer.COPIES.abandoned.clear()
        repl.close()


def forget_partial_copy(run: MoveRun, name: str, schemas: list[str]) -> None:
    """An interrupted copy: drop its slot (its snapshot is gone) and empty the target's tables."""
    with run.connect(run.source) as src:
        if replication.slot_exists(src, name):
            transfer.drop_slots(src, [name], [])
        items = inspect.tables(src, schemas, "r")
    with run.connect(run.target) as tgt:
        data.truncate_tables(tgt, items)
