"""The SQL texts adoption writes out for people to read and run: the fixes ``adopt plan`` names for its
blockers (run by the team on the old database, after review). The baseline migration's DDL is
:mod:`.baseline`. Nothing here is sent by shardctl itself.
"""

from __future__ import annotations

from ..model.identifiers import quote_ident as q


def add_key_column(table: str, key: str, key_type: str) -> str:
    return f"ALTER TABLE {q(table)} ADD COLUMN {q(key)} {key_type};"


def backfill_key(
    table: str, key: str, fk: list[str], parent: str, ref: list[str], parent_key: str
) -> str:
    """Copy the key from the parent row the foreign key ``fk`` → ``parent(ref)`` names."""
    match = " AND ".join(f"p.{q(r)} = c.{q(c)}" for c, r in zip(fk, ref))
    return (
        f"UPDATE {q(table)} AS c SET {q(key)} = p.{q(parent_key)} FROM {q(parent)} AS p "
        f"WHERE {match} AND c.{q(key)} IS NULL;"
    )


def unique_key_and_id(table: str, key: str, id_column: str) -> str:
    """What a child's foreign key that includes the key references: (key, id) unique on the parent."""
    return f"ALTER TABLE {q(table)} ADD UNIQUE ({q(key)}, {q(id_column)});"


def fk_with_key(
    table: str,
    name: str,
    key: str,
    fk: list[str],
    parent: str,
    parent_key: str,
    ref: list[str],
    actions: str,
) -> str:
    """Replace a foreign key by one that includes the key on both sides (so both rows share a shard),
    keeping its ON DELETE / ON UPDATE ``actions``."""
    cols = ", ".join(q(c) for c in [key, *fk])
    refs = ", ".join(q(c) for c in [parent_key, *ref])
    return (
        f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(name)}, ADD CONSTRAINT {q(name)} "
        f"FOREIGN KEY ({cols}) REFERENCES {q(parent)} ({refs}){actions};"
    )


def set_not_null(table: str, column: str) -> str:
    return f"ALTER TABLE {q(table)} ALTER COLUMN {q(column)} SET NOT NULL;"


def unique_with_key(
    table: str, name: str, key: str, columns: list[str], constraint: bool
) -> list[str]:
    """Replace a unique constraint (or unique index) by one that leads with the key."""
    cols = ", ".join(q(c) for c in [key, *columns])
    if constraint:
        return [
            (
                f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(name)}, "
                f"ADD CONSTRAINT {q(name)} UNIQUE ({cols});"
            )
        ]
    return [f"DROP INDEX {q(name)};", f"CREATE UNIQUE INDEX {q(name)} ON {q(table)} ({cols});"]


def drop_constraint(table: str, name: str) -> str:
    return f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(name)};"


def replica_identity_full(table: str) -> str:
    return f"ALTER TABLE {q(table)} REPLICA IDENTITY FULL;"


def set_logged(table: str) -> str:
    return f"ALTER TABLE {q(table)} SET LOGGED;"


def to_bigint(table: str, column: str) -> str:
    return f"ALTER TABLE {q(table)} ALTER COLUMN {q(column)} TYPE bigint;"


def server_setting(name: str, value: str) -> str:
    return f"ALTER SYSTEM SET {name} = {value};"
