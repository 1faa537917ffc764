"""``adopt copy`` after ``adopt cutover --abort``: a fresh run, once the aborted one's rows are off the
fleet.

The fleet is not authoritative after an abort: every row it holds is on the old database too (the
abort's freeze waited until the way back had applied each fleet host's WAL), and the shards' tables
are out of their names (``back.py``). So, and only when the abort finished, the topology says
``authoritative: source`` and the way back is gone: on each fleet host, the
adopted shard tables (and the global tables on the global host) truncated and back under their
names, the abort's guards dropped, a batch of shards a transaction, then the parents back in the
app's schema (where the copy finds them). The abort's redirects stay until the next cutover's
freeze drops them, just before its commit (:meth:`.cutover.AdoptFreeze._move_fleet`). The new run keeps the
aborted run's ID floor: the IDs the fleet minted meanwhile, now on the old database, stay above it and
keep decoding to the shard that made them. The last ``adopt verify`` no longer counts: the cutover
wants one of the new run."""

from __future__ import annotations

import psycopg

from ...errors import BadInput
from ...model.topology import Host
from ...sql import session
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import data, replication
from .cutover import PREPARE_LOCK_TIMEOUT
from .site import Site


def clear_aborted_run(site: Site, src: psycopg.Connection, detail: dict) -> list[str]:
    """Empty the fleet of the aborted run (see the module's text); returns the hosts emptied."""
    if not (detail.get("abort") or {}).get("finished"):
        raise BadInput(
            "the last adoption run's abort did not finish: run `shardctl adopt cutover --abort` "
            "again first; nothing was changed"
        )
    if site.adoption.authoritative != "source":
        raise BadInput(
            f"the topology {site.topo.path} says adoption.authoritative: "
            f"{site.adoption.authoritative}: the fleet's rows may be the only copy; run "
            f"`shardctl adopt cutover --abort` again first; nothing was changed"
        )
    back = replication.subscriptions(src, site.back_names())
    if back:
        raise BadInput(
            f"the aborted run's way back ({', '.join(sorted(back))}) is still on the old database: "
            f"run `shardctl adopt cutover --abort` again first; nothing was changed"
        )
    out = []
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            session.set_settings(conn, {"lock_timeout": PREPARE_LOCK_TIMEOUT}, local=False)
            now = site.shard_table_names(conn, host)
            groups = _groups(site, host)
            # A batch of shards a transaction, never every table of the host at once (their locks
            # would overflow its lock table at a few thousand): their tables emptied under the
            # name they have, back under their own, unguarded. Their redirects stay until the
            # next cutover's freeze: a Router whose copy of the file still says fleet finds the
            # redirect before each transaction (Placement.redirect_check) and goes to the old
            # database, never to the tables this copy refills.
            for batch in data.batched(groups):
                tables = [t for i in batch for t in groups[i]]
                with conn.transaction():
                    data.truncate_tables(conn, [(s, now[s, t]) for s, t in tables if (s, t) in now])
                    renamed = [(s, now[s, t], t) for s, t in tables if now.get((s, t), t) != t]
                    if renamed:
                        conn.execute(catalog.rename_tables_sql(renamed))
                    conn.execute(catalog.drop_guards_sql(tables))
            # The parents last, back in the app's schema (where the copy finds them): there before
            # the tables were back, they would answer a stale Router's reads through search_path.
            # A parent's statement trigger and schema are its own: no partition is locked.
            with conn.transaction():
                moved = [p for p in site.located(conn, host) if p[0] == catalog.MOVED_SCHEMA]
                if moved:
                    conn.execute(catalog.set_schema_sql(moved, site.schema))
                conn.execute(catalog.drop_guards_sql(site.located(conn, host)))
            catalog.drop_empty_schema(conn, catalog.MOVED_SCHEMA)
        out.append(host.name)
    return out


def _groups(site: Site, host: Host) -> list[list[tuple[str, str]]]:
    """``host``'s :meth:`Site.shard_tables` grouped as their foreign keys go (a shard's tables; the
    global tables)."""
    groups = [[(site.topo.schema_name(n), t) for t in site.tables] for n in host.shards]
    if site.globals and host.name == site.global_host.name:
        groups.append([(site.schema, t) for t in site.globals])
    return groups
