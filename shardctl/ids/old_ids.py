"""Pre-adoption IDs: the ID floor that separates them from ``next_id()`` IDs, and where they live.

An adopted database's rows keep their IDs (``bigserial``, identity). New rows get ``next_id()`` IDs,
which must sort after every old one so that ``ORDER BY id`` still means time: the floor is the first
ID ``next_id()`` can mint at the copy's start, ``(start_ms - epoch) << (shard_bits + sequence_bits)``.
Every ID below it is a pre-adoption ID; its shard comes from its row's key, not from its bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import BadInput
from ..model.adoption import AdoptedTable, Adoption
from ..model.layouts import Layout
from .routing import is_integer_key, shard_for_key


def id_floor(layout: Layout, at_ms: int | None = None) -> int:
    """The first ID ``next_id()`` can mint at Unix millisecond ``at_ms`` (now when None): shard 0,
    sequence 0. Every ID minted at or after ``at_ms`` is at least this."""
    if not layout.has_time:
        raise BadInput(f"layout {layout.name} has no time field: it has no ID floor")
    ms = int(time.time() * 1000) if at_ms is None else at_ms
    return layout.encode(unix_ms=ms)


def adopted_table(adoption: Adoption, table: str | None, value: int) -> AdoptedTable:
    """The adopted table a get of pre-adoption ID ``value`` names; BadInput naming ``table=`` when it
    names none, or one that is not adopted (an old ID does not say which table it is from)."""
    if table is None:
        raise BadInput(
            f"{value} is a pre-adoption ID (below the ID floor {adoption.id_floor}): pass table= "
            f"(one of {', '.join(sorted(adoption.tables))}) to find its row"
        )
    found = adoption.table(table)
    if found is None:
        raise BadInput(
            f"table={table!r} is not an adopted sharded table "
            f"(one of {', '.join(sorted(adoption.tables))})"
        )
    if found.id is None:
        raise BadInput(f"table {table} has no single ID column: it cannot be read by ID")
    return found


def root_shard(table: AdoptedTable, value: int, modulus: int) -> int | None:
    """The shard of a root table's old ID (its ID is its key): ``value % modulus``; None for any
    other table, whose key is looked up in the id map."""
    return shard_for_key(value, modulus) if table.root else None


def shard_of_id(topology: Any, value: int) -> int:
    """The shard of an ID-valued key (an object's own ID, or a key column holding one): a
    pre-adoption ID is its own key, ``value % modulus``; a ``next_id()`` ID names it in its bits."""
    adoption = topology.adoption
    if adoption is not None and type(value) is int and adoption.is_old_id(value):
        return shard_for_key(value, topology.modulus)
    return topology.layout.shard_of(value)


def shard_of_key(topology: Any, key: int | str, *, force_string: bool = False) -> int:
    """The shard of a routing key: ``key % modulus`` (strings: ``md5``), except on a fleet with an
    adoption, where an integer key is an ID (the key columns hold the root's IDs): one at or above
    ``id_floor`` is a ``next_id()`` ID minted on the fleet (a user made after the cutover) and names
    its shard in its bits (:func:`shard_of_id`). The rule the copy's row filters, ``adopt verify``
    and the way back apply in SQL (``adopt_copy.key_shard``)."""
    if topology.adoption is not None and not force_string:
        value = key if type(key) is int else _integer(key)
        if value is not None:
            return shard_of_id(topology, value)
    return shard_for_key(key, topology.modulus, force_string=force_string)


def _integer(key: Any) -> int | None:
    """The integer an integer-looking text key routes as (``shard_for_key``'s reading), else None."""
    if isinstance(key, str) and is_integer_key(key):
        try:
            return int(key.strip())
        except ValueError:  # beyond int()'s digits: shard_for_key says so
            return None
    return None


def describe(
    topology: Any,
    value: int,
    table: str | None = None,
    lookup: Callable[[AdoptedTable, int], int | None] | None = None,
) -> dict[str, Any]:
    """What ``decode-id`` says of pre-adoption ID ``value``: that it is one (its bits name no shard),
    the floor, and with ``table`` where its row lives: the root's shard is ``id % modulus``; another
    table's is its key's (:func:`shard_of_id`), which ``lookup(table, id)`` reads where the Router
    reads it: on the old database while it is authoritative, else in the id map (None: not found)."""
    adoption = topology.adoption
    out: dict[str, Any] = {
        "id": value,
        "pre_adoption": True,
        "id_floor": adoption.id_floor,
        "table": table,
        "shard": None,
        "schema": None,
        "host": None,
    }
    note = f"pre-adoption ID (below the ID floor {adoption.id_floor})"
    found = adoption.table(table) if table else None
    if table is not None and found is None:
        raise BadInput(
            f"--table {table} is not an adopted sharded table "
            f"(one of {', '.join(sorted(adoption.tables))})"
        )
    if adoption.on_source:
        out["host"], out["schema"] = adoption.source.name, adoption.schema
    if found is None:
        out["note"] = note + ("" if adoption.on_source else ": give --table to find its shard")
        return out
    if found.root:
        out["shard"] = shard_for_key(value, topology.modulus)
    elif lookup is not None:
        key = lookup(found, value)
        if key is None:
            where = "the old database has" if adoption.on_source else "the id map knows"
            out["note"] = f"{note}: no row of {table} has it ({where} none)"
            return out
        out["shard"] = shard_of_key(topology, key)
    if out["shard"] is not None and not adoption.on_source:
        out["schema"] = topology.schema_name(out["shard"])
        out["host"] = topology.host_of(out["shard"]).name
    where = "on the old database (authoritative)" if adoption.on_source else ""
    out["note"] = f"{note} of {table}" + (f", {where}" if where else "")
    return out
