"""Migration test support: a migration added to a fleet, and what each shard's ledger and tables say."""

from __future__ import annotations

from pathlib import Path

from .fleet import connect

ADD_LOCATION = (
    "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"
    "CREATE INDEX photos_location_idx ON {{ schema|ident }}.photos (location);\n"
)


def add_migration(fleet: Path, name: str, sql: str) -> Path:
    path = fleet.parent / "migrations" / name
    path.write_text(sql)
    return path


def ledger(topo, host: str, version: int) -> set[int]:
    with connect(topo, host) as conn:
        return {
            r[0]
            for r in conn.execute(
                "SELECT shard_id FROM shardctl.migrations WHERE version = %s", (version,)
            )
        }


def shards_with_column(topo, host: str, table: str, column: str) -> set[int]:
    with connect(topo, host) as conn:
        rows = conn.execute(
            """SELECT s.shard_id FROM shardctl.shards s JOIN information_schema.columns c
                   ON c.table_schema = s.schema_name AND c.table_name = %s AND c.column_name = %s""",
            (table, column),
        ).fetchall()
    return {r[0] for r in rows}


def migrated(doc: dict) -> set[int]:
    """Shards a run migrated; a run refused before any work (its JSON is an error document) migrated none."""
    return {int(s) for h in doc.get("hosts", []) for s in h["migrated"]}
