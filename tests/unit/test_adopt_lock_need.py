"""``adopt copy``'s check of a fleet host's lock table (``_check_lock_table``): the largest of its
transactions there, each counted as PostgreSQL takes its locks, against the share of the table it may
use. The real server's side (a host with a small table refusing, a bigger one passing the whole path)
is tests/fleet/test_adopt_lock_table.py; here, which transaction is named and the setting asked for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardctl.errors import BadInput
from shardctl.ops.adopt.copy import _check_lock_table

FACTS = {"max_locks_per_transaction": 64, "lock_processes": 125}  # stock: 8,000 locks


def check(tables: int, shards: int, footprint: int, routed: bool, facts: dict = FACTS) -> str:
    job = SimpleNamespace(sharded=[(f"t{i}", "user_id") for i in range(tables)])
    target = SimpleNamespace(
        host=SimpleNamespace(name="pg1"), shards=list(range(shards)), globals=[]
    )
    with pytest.raises(BadInput) as refused:
        _check_lock_table(job, target, facts, [footprint] * tables, routed)
    return str(refused.value)


def test_the_abort_freeze_is_named_when_it_needs_most():
    message = check(tables=5, shards=2048, footprint=3, routed=False)
    assert "adopt cutover --abort locks its 10,245 adopted tables" in message, message
    assert "max_locks_per_transaction to at least 103 there" in message, message  # 10,245/0.8/125


def test_the_copy_is_named_when_one_tables_footprint_needs_most():
    message = check(tables=2, shards=2048, footprint=6, routed=False)
    assert "fills the 2,048 shard tables of a table in one COPY" in message, message
    assert "12,289 locks" in message, message


def test_a_routed_tables_partitions_are_counted():
    """Two tables of small footprint: the abort (4,098) and the COPY (4,097) fit 6,400; making a
    routed table's 2,048 partitions, each with its key, TOAST table and TOAST index, does not."""
    message = check(tables=2, shards=2048, footprint=2, routed=True)
    assert "makes the 2,048 partitions of a table routed by its shard's own types" in message
    assert "8,193 locks" in message, message
    job = SimpleNamespace(sharded=[("a", "user_id"), ("b", "user_id")])
    target = SimpleNamespace(host=SimpleNamespace(name="pg1"), shards=list(range(2048)), globals=[])
    _check_lock_table(job, target, FACTS, [2, 2], False)  # the same host, nothing routed: it fits
