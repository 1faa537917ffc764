"""``adopt copy`` after ``adopt cutover --abort``: a fresh run, once the aborted one's rows are off the
fleet.

The fleet is not authoritative after an abort: every row it holds is on the old database too (the
abort's freeze waited until the way back had applied each fleet host's WAL), and the shards' tables
are out of their names (``back.py``). So, and only when the abort finished, the topology says
``authoritative: source`` and the way back is gone: on each fleet host, in one transaction, the
adopted shard tables (and the global tables on the global host) back under their names, the parents
back in the app's schema (where the copy finds them), the abort's guards and redirects dropped and
the tables truncated. The new run keeps the
aborted run's ID floor: the IDs the fleet minted meanwhile, now on the old database, stay above it and
keep decoding to the shard that made them. The last ``adopt verify`` no longer counts: the cutover
wants one of the new run."""

from __future__ import annotations

import psycopg

from ...errors import BadInput
from ...sql import session
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import control, data, replication
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
        with site.connect(host, autocommit=False) as conn:
            session.set_settings(conn, {"lock_timeout": PREPARE_LOCK_TIMEOUT})
            # the tables back under their names, the parents back in the app's schema (where the
            # copy finds them), as before the cutover
            now = site.shard_table_names(conn, host)
            renamed = [(s, name, t) for (s, t), name in now.items() if name != t]
            if renamed:
                conn.execute(catalog.rename_tables_sql(renamed))
            moved = [p for p in site.located(conn, host) if p[0] == catalog.MOVED_SCHEMA]
            if moved:
                conn.execute(catalog.set_schema_sql(moved, site.schema))
            tables = site.shard_tables(host)
            parents = site.located(conn, host)
            conn.execute(catalog.drop_guards_sql(tables + parents))
            control.clear_redirects(conn, site.redirected(host))
            data.truncate_tables(conn, tables)  # one statement: their foreign keys hold
            conn.commit()
            conn.autocommit = True
            catalog.drop_empty_schema(conn, catalog.MOVED_SCHEMA)
        out.append(host.name)
    return out
