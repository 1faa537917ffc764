"""``adopt cutover --abort`` (the old database authoritative again, with every write made on the fleet
since the cutover) and ``adopt cutover --cleanup`` (the replication and the parents gone for good).

Abort, until cleanup: on each fleet host in turn, a freeze bounded by ``--max-freeze`` (the move's
``BoundedFreeze``): its adopted tables locked, wait until the way back (the old database's subscription)
has applied the host's WAL up to there, a guard trigger on each shard table (one line naming the old
database); commit. Then, in one transaction on the old database, its guards and redirects dropped and the
run recorded ``aborted``; then ``adoption.authoritative: source`` in the topology file (Routers that
meet a guard on the fleet wait for it and follow), and the way back dropped.

Cleanup, after a cutover: the way back dropped, each parent's partitions detached (they stay, as the
shards' tables) and the parent dropped, the replica identities ``adopt copy`` changed on the old
database restored, the run recorded ``cleaned``, and ``adoption.source`` dropped from the topology
(``id_floor``, ``tables`` and ``id_map`` stay: old IDs live forever). The old tables themselves stay on
the old database, guarded: reads still work, a write is refused with the line naming the fleet, and
stale Routers still find the redirects. Dropping them is the team's decision, when nothing reads them.
"""

from __future__ import annotations

import time

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, FreezeTimeout, OperationFailed
from ...model.topology import Host, Topology
from ...model.topology_file import drop_adoption_source, flip_adoption
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import control, replication, stubs
from ..move import transfer
from ..move.cutover import BoundedFreeze
from ..move.run import Progress, checkpoint
from .cutover import CUT_OVER, READY, CutoverResult, finish
from .site import Site

ABORTED = "aborted"
CLEANED = "cleaned"


def adopt_abort(
    topo: Topology,
    *,
    max_freeze: float = 0.5,
    attempts: int = 3,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    progress: Progress | None = None,
) -> CutoverResult:
    """Make the old database authoritative again, with the writes made on the fleet since the cutover."""
    t0 = time.perf_counter()
    site = Site.of(topo, connect_timeout, progress, need_source=True)
    with site.connect(site.source) as src:
        phase, detail = site.run_state(src)
    result = CutoverResult("abort", phase, site.adoption.authoritative)
    if phase in READY:
        # No cutover ran: the old database is authoritative; only the way back made for it goes.
        result.dropped = drop_back(site)
        site.note("no cutover ran: the old database is authoritative; nothing was frozen")
    elif phase in (CUT_OVER, ABORTED):
        if phase == CUT_OVER:
            if not detail.get("switched"):
                finish(site)  # the way back must carry the writes Routers made after the freeze
            for host in site.fleet_hosts():
                _guard_fleet_host(site, host, max_freeze, attempts)
            checkpoint("adopt-abort-fleet-guarded")
            _reopen_source(site)
            checkpoint("adopt-abort-source-open")
        result.topology_flipped = flip_adoption(topo.path, "source")
        checkpoint("adopt-abort-flipped")
        result.dropped = drop_back(site)
        result.phase, result.authoritative = ABORTED, "source"
    else:
        raise BadInput(f"the adoption is in phase {phase}: there is no cutover to abort")
    result.notes, result.seconds = site.notes, round(time.perf_counter() - t0, 3)
    return result


def fleet_message(site: Site, host: Host) -> str:
    return (
        f"the adoption was aborted: the adopted tables live on the old database again (topology "
        f"{site.topo.path}, adoption.source): write through shardctl's Router"
    )


class FleetFreeze(BoundedFreeze):
    """One fleet host's tables locked until the old database has applied its WAL, then guarded."""

    def __init__(self, site: Site, host: Host, max_freeze: float):
        super().__init__(max_freeze, site.progress)
        self.site, self.host = site, host

    def attempt(self) -> None:
        site, host = self.site, self.host
        self.src = conn = site.connect(host, autocommit=False)
        self.aux = site.connect(host)
        try:
            self._timeouts()
            self.start_clock()
            self._lock(site.parents(host))  # a parent's lock covers its partitions
            self._wait_applied([site.back(host)])
            self._budget()
            guarded = site.shard_tables(host) + site.parents(host)
            message = fleet_message(site, host)
            conn.execute(
                "".join(
                    stubs.unguard_sql(s, t) + stubs.guard_sql(s, t, message) for s, t in guarded
                )
            )
            conn.commit()
            self._mark("commit")
        except psycopg.errors.QueryCanceled as exc:
            self._rollback()
            raise FreezeTimeout(
                f"a statement of the freeze on {host.name} ran past --max-freeze ({db.first_line(exc)})"
            ) from None
        except BaseException:
            self._rollback()
            raise
        finally:
            conn.close()
            self.aux.close()


def _guard_fleet_host(site: Site, host: Host, max_freeze: float, attempts: int) -> None:
    with site.connect(site.source) as src:
        name = site.back(host)
        if name not in replication.subscriptions(src, [name]):
            raise OperationFailed(
                f"abort: the way back from {host.name} (subscription {name} on the old database) is "
                f"missing: the writes made there since the cutover cannot be carried back; nothing "
                f"was changed on {host.name}"
            )
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            FleetFreeze(site, host, max_freeze).attempt()
            return
        except FreezeTimeout as exc:
            last = exc
            site.note(f"abort on {host.name}, attempt {attempt}: {exc}; writes resumed there")
            time.sleep(min(5.0, attempt * 0.5))
    raise OperationFailed(
        f"abort: gave up on {host.name} after {attempts} attempts ({last}); the fleet stays "
        f"authoritative; run --abort again or raise --max-freeze"
    )


def _reopen_source(site: Site) -> None:
    """One transaction on the old database: its guards and redirects gone, the run ``aborted``."""
    with site.connect(site.source, autocommit=False) as src:
        src.execute(catalog.drop_guards_sql(site.source_tables()))
        control.clear_redirects(src, list(range(site.topo.shard_count)))
        catalog.set_run(src, ABORTED, {"abort": {"at": time.time()}, "switched": False})
        src.commit()


def drop_back(site: Site) -> dict:
    """The way back: the old database's subscriptions, each fleet host's publication and slot."""
    out: dict[str, list] = {"subscriptions": [], "publications": [], "slots": []}
    oids: dict[str, int] = {}
    with site.connect(site.source) as src:
        for host in site.fleet_hosts():
            name = site.back(host)
            oids.update(replication.subscriptions(src, [name]))
            if replication.drop_subscription(src, name) != "absent":
                out["subscriptions"].append(name)
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            name = site.back(host)
            out["publications"] += [
                f"{host.name}:{p}" for p in replication.drop_publications(conn, [name])
            ]
            sub = [oids[name]] if name in oids else []
            out["slots"] += [f"{host.name}:{s}" for s in transfer.drop_slots(conn, [name], sub)]
    return out


def adopt_cleanup(
    topo: Topology,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    progress: Progress | None = None,
) -> CutoverResult:
    """Drop what the adoption left after a cutover (see the module's text)."""
    t0 = time.perf_counter()
    site = Site.of(topo, connect_timeout, progress, need_source=False)
    if site.adoption.source is None:
        result = CutoverResult("cleanup", CLEANED, site.adoption.authoritative)
        result.notes = ["already cleaned up: adoption.source is gone from the topology"]
        return result
    with site.connect(site.source) as src:
        phase, detail = site.run_state(src)
    if phase not in (CUT_OVER, CLEANED) or (phase == CUT_OVER and not detail.get("switched")):
        after = "an aborted adoption starts again with adopt copy" if phase == ABORTED else ""
        raise BadInput(
            f"the adoption is in phase {phase}: --cleanup follows a finished cutover (run "
            f"`shardctl adopt cutover` first){'; ' + after if after else ''}"
        )
    result = CutoverResult("cleanup", CLEANED, "fleet")
    result.dropped = drop_back(site)
    checkpoint("adopt-cleanup-back-dropped")
    result.dropped["parents"] = _drop_parents(site)
    with site.connect(site.source) as src:
        restored = _restore_identities(site, src, detail)
        with src.transaction():
            catalog.set_run(src, CLEANED, {"cleanup": {"at": time.time(), "identities": restored}})
    checkpoint("adopt-cleanup-recorded")
    drop_adoption_source(topo.path)
    result.notes, result.seconds = site.notes, round(time.perf_counter() - t0, 3)
    return result


def _drop_parents(site: Site) -> list[str]:
    """Each fleet host's partitioned parents: partitions detached (they stay), parent dropped."""
    out = []
    for host in site.fleet_hosts():
        with site.connect(host, autocommit=False) as conn:
            for schema, table in site.parents(host):
                if not catalog.is_partitioned(conn, schema, table):
                    continue  # a global table, or already dropped
                children = catalog.partitions(conn, schema, table)
                conn.execute(catalog.detach_and_drop_sql((schema, table), children))
                out.append(f"{host.name}:{schema}.{table}")
            conn.commit()
    return out


def _restore_identities(site: Site, src: psycopg.Connection, detail: dict) -> list[str]:
    """Put back the replica identities ``adopt copy`` set to FULL (recorded in the run's detail as
    ``replica_identity``: table → its kind before, ``d`` the primary key)."""
    recorded = detail.get("replica_identity") or {}
    out = []
    for table, before in recorded.items():
        kind = before.get("kind") if isinstance(before, dict) else before
        if kind == "d" and catalog.relation_exists(src, site.schema, table):
            src.execute(catalog.set_replica_identity_sql(site.schema, table, full=False))
            out.append(table)
    return out
