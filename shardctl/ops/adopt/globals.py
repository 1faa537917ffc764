"""The global tables (no shard key) on ``placement.global_host``: created as the source defines them,
in the source's schema name, before the copy fills them (``adopt copy``)."""

from __future__ import annotations

from typing import Any

import psycopg

from ...sql.catalog import adopt as source_catalog
from ...sql.catalog import adopt_copy as catalog


def create_global_tables(job: Any, conn: psycopg.Connection, names: list[str]) -> None:
    """Create each of ``names`` on ``conn`` (the global host, in its transaction) unless it exists:
    the definitions read from the source; a serial column's sequence made first (its value is the
    cutover's to set)."""
    missing = [n for n in names if not catalog.table_exists(conn, job.schema, n)]
    if not missing:
        return
    with job.connect(job.source) as src, src.transaction():
        source_catalog.qualified_names(src)
        tables = {t.name: t for t in source_catalog.tables(src, job.schema)}
    for name in missing:
        table = tables[name]
        for column in table.columns:
            if column.sequence and not column.identity:
                catalog.create_sequence(conn, column.sequence)
        catalog.execute_ddl(conn, catalog.global_table_ddl(table, job.schema))
