"""``status``: one table for the fleet, one query round per host."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import control_exists, for_each_host, select_hosts
from ..sql.migrations import for_topology
from ..model.ranges import format_shards
from ..model.topology import Host, Topology


@dataclass
class HostStatus:
    host: str
    dsn: str
    reachable: bool = False
    error: str | None = None
    server_version: str | None = None
    expected: int = 0
    present: int = 0
    missing: str = ""
    unexpected: str = ""
    min_version: int | None = None
    max_version: int | None = None
    moving: str = ""
    orphan_versions: list[int] = field(default_factory=list)
    last_event: str | None = None

    @property
    def drift(self) -> bool:
        return bool(self.missing or self.unexpected)


def status(topo: Topology, *, hosts: list[str] | None = None,
           connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT) -> dict:
    started = time.perf_counter()
    known_versions = {m.version for m in for_topology(topo)}

    def work(host: Host) -> HostStatus:
        st = HostStatus(host.name, host.masked_dsn, expected=len(host.shards))
        try:
            with db.connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="status") as conn:
                st.reachable = True
                st.server_version = conn.execute("SHOW server_version").fetchone()[0]
                if not control_exists(conn):
                    st.error = "no control schema (run shardctl init)"
                    st.missing = format_shards(host.shards)
                    return st
                rows = conn.execute(
                    """SELECT s.shard_id, s.state, coalesce(max(m.version), 0),
                              (SELECT array_agg(DISTINCT version) FROM shardctl.migrations),
                              (SELECT kind || ' at ' || to_char(at, 'YYYY-MM-DD HH24:MI:SS') || coalesce(' (' || shards || ')', '')
                                 FROM shardctl.events ORDER BY id DESC LIMIT 1)
                         FROM shardctl.shards s
                         LEFT JOIN shardctl.migrations m USING (shard_id)
                        GROUP BY 1, 2""").fetchall()
                if not rows:
                    row = conn.execute("SELECT kind || ' at ' || to_char(at, 'YYYY-MM-DD HH24:MI:SS') "
                                       "FROM shardctl.events ORDER BY id DESC LIMIT 1").fetchone()
                    st.last_event = row[0] if row else None
                # A shard is present when it is recorded *and* its schema really exists.
                schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
                recorded = {r[0] for r in rows}
                real = {topo.shard_of_schema(name) for name in schemas} - {None}
                present = recorded & real
                stray = real - recorded
                versions = [r[2] for r in rows if r[0] in set(host.shards)]
                st.present = len(present & set(host.shards))
                st.missing = format_shards(set(host.shards) - present)
                st.unexpected = format_shards((present | stray) - set(host.shards))
                st.moving = format_shards(r[0] for r in rows if r[1] != "active")
                if versions:
                    st.min_version, st.max_version = min(versions), max(versions)
                if rows:
                    st.orphan_versions = sorted(set(rows[0][3] or []) - known_versions)
                    st.last_event = rows[0][4]
        except db.HostUnreachable as exc:
            st.error = exc.reason
        except psycopg.Error as exc:
            st.error = db.first_line(exc)
        return st

    results = for_each_host(select_hosts(topo, hosts), work)
    return {"command": "status", "seconds": round(time.perf_counter() - started, 3),
            "latest_version": len(known_versions),
            "ok": all(h.reachable and not h.drift and not h.error for h in results),
            "hosts": [dict(asdict(h), drift=h.drift) for h in results]}
