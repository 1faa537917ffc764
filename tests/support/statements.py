"""Statements counted by the servers: ``pg_stat_statements`` calls per database, before and after
some work (how the old-ID tests know a get took at most two round trips and never a fan-out)."""

from __future__ import annotations

import psycopg


class Statements:
    """pg_stat_statements' calls per database of the statements that mention ``needle``."""

    QUERY = (
        "SELECT d.datname, sum(s.calls)::int FROM pg_stat_statements s JOIN pg_database d "
        "ON d.oid = s.dbid WHERE s.query ILIKE %s AND s.query NOT ILIKE %s GROUP BY 1"
    )

    def __init__(self, dsns: list[str]):
        self.dsns = dsns  # one database per server: where the extension is created
        for dsn in dsns:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def calls(self, needle: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for dsn in self.dsns:
            with psycopg.connect(dsn) as c:
                for db, n in c.execute(self.QUERY, (f"%{needle}%", "%pg_stat_statements%")):
                    out[db] = out.get(db, 0) + n
        return out

    def delta(self, needle: str, work, lookup: str | None = None) -> tuple[object, dict[str, int]]:
        """``work()``'s value and the calls it made per database of the statements with ``needle``
        (and, under the key "lookups", of those with ``lookup``: the id map's)."""
        needles = [needle] + ([lookup] if lookup else [])
        before = [self.calls(n) for n in needles]
        value = work()
        after = [self.calls(n) for n in needles]
        grown = [
            {db: n - b.get(db, 0) for db, n in a.items() if n != b.get(db, 0)}
            for b, a in zip(before, after)
        ]
        out = grown[0]
        if lookup:
            out["lookups"] = grown[1]
        return value, out
