"""``adopt cutover --abort`` (the old database authoritative again, with every write made on the fleet
since the cutover) and ``adopt cutover --cleanup`` (the replication and the parents gone for good).

Abort, until cleanup: one freeze bounded by ``--max-freeze`` (the move's ``BoundedFreeze``): on each
fleet host a transaction locks its adopted tables, waits until the way back (the old database's
subscription) has applied the host's WAL up to there, takes each shard table (and, on the global
host, each global table) out of its name (renamed within its schema to ``shardctl_aborted_<name>``,
``catalog.aborted_name``), guards its parents (one line naming the old database), which stay in
``shardctl_adopted``, and writes a redirect per shard to the old database. A Router whose topology
copy still says ``fleet`` reads and writes by name (``search_path``: the shard's schema, then
``public``): it meets undefined_table, which it follows through the redirect to the old database,
so it never reads the fleet's rows, stale from the moment the old database takes writes (a read
fires no trigger: a guard alone stopped only its writes). Then one transaction on the old database
drops its guards and redirects, puts the stubs away and the tables back under their names, sets the
global tables' sequences past the global host's, and records the run ``aborted``. The fleet hosts
commit, then the old database: a writer blocked on the fleet finds its table's name gone once it
has the lock, and its Router waits on the old database's locks until it is open. Then
``adoption.authoritative: source`` in the topology file, the way back and the id map dropped, the
replica identities ``adopt copy`` changed restored (a new attempt starts with ``adopt copy``, which
puts the fleet's tables back under their names and the parents in the app's schema before emptying
them: ``restart.py``). A run killed between the two commits left every side closed to writes: run
``--abort`` again at once (a table renamed already is left as it is).

Cleanup, after a cutover: the way back dropped, each parent's partitions detached (they stay, as the
shards' tables) and the parent dropped, the id map's replication dropped (its rows stay), the replica
identities ``adopt copy`` changed on the old database restored, the run recorded ``cleaned``, and
``adoption.source`` dropped from the topology (``id_floor``, ``tables`` and ``id_map`` stay: old IDs
live forever). The old tables themselves stay on the old database, guarded, in schema
``shardctl_adopted`` (their rows as of the cutover); the stubs keep their old names: a direct client's
read or write is refused with the line naming the fleet, and stale Routers still find the redirects.
Dropping them is the team's decision, when nothing reads them.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, FreezeTimeout, OperationFailed
from ...model.topology import Host, Topology
from ...model.topology_file import drop_adoption_source, flip_adoption
from ...sql import session
from ...sql.catalog import adopt_copy as copy_catalog
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import control, inspect, replication, stubs
from ..move import transfer
from ..move.cutover import LOCK_WINDOW_SHARE, BoundedFreeze
from ..move.run import Progress, checkpoint
from .cutover import (
    CUT_OVER,
    READY,
    CutoverResult,
    finish,
    mirror_globals,
    mirror_routed,
    restore_fleet_identities,
)
from .id_map import drop_id_map
from .site import Site

ABORTED = "aborted"
CLEANED = "cleaned"
DETACH_LOCK_WAIT = 0.5  # seconds the app's queries on a shard table may queue behind its detach
DETACH_TRIES = 60  # detaches of one partition (then: run again)


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
        _drop_moved_schemas(site)
        site.note("no cutover ran: the old database is authoritative; nothing was frozen")
    elif phase in (CUT_OVER, ABORTED):
        if phase == CUT_OVER and not detail.get("switched"):
            finish(site)  # the way back must carry the writes Routers made after the freeze
        if not (detail.get("abort") or {}).get("finished"):
            # From aborted too: a run killed between the old database's commit and the fleet's
            # left the fleet unguarded; this brings back what was written there meanwhile.
            _abort_freeze(site, max_freeze, attempts, phase == CUT_OVER, result)
        result.topology_flipped = flip_adoption(topo.path, "source")
        checkpoint("adopt-abort-flipped")
        result.dropped = drop_back(site)
        # The old database as before the adoption: its identities, no id map (adopt copy makes both
        # again for a new attempt).
        drop_id_map(topo, site.source, keep_data=False, connect_timeout=connect_timeout)
        with site.connect(site.source) as src:
            restored = _restore_identities(site, src, detail)
        restored += restore_fleet_identities(site, detail)
        _drop_moved_schemas(site)
        with site.connect(site.source) as src, src.transaction():
            catalog.set_run(
                src,
                ABORTED,
                {"abort": {"at": time.time(), "finished": True}, "restored": restored},
            )
        result.phase, result.authoritative = ABORTED, "source"
    else:
        raise BadInput(f"the adoption is in phase {phase}: there is no cutover to abort")
    result.notes, result.seconds = site.notes, round(time.perf_counter() - t0, 3)
    return result


def fleet_message(site: Site) -> str:
    return (
        f"the adoption was aborted: the adopted tables live on the old database again (topology "
        f"{site.topo.path}, adoption.source): write through shardctl's Router"
    )


class AbortFreeze(BoundedFreeze):
    """One freeze over every fleet host, then the old database reopened (see the module's text)."""

    def __init__(self, site: Site, max_freeze: float, reopen: bool):
        super().__init__(max_freeze, site.progress)
        self.site, self.reopen = site, reopen
        self.fleet: list[psycopg.Connection] = []
        self.sequences: dict[tuple[str, str], dict] = {}  # the global host's, once it is locked

    def attempt(self) -> None:
        site = self.site
        opened: list[psycopg.Connection] = []
        try:
            # Every connection before the clock starts, as the cutover's freeze does: opening one
            # holds no lock, and under load the openings alone could use up --max-freeze while the
            # first host's tables are locked.
            hosts = []
            for host in site.fleet_hosts():
                conns = site.connect(host, autocommit=False), site.connect(host)
                opened += conns
                hosts.append((host, *conns))
            source = site.connect(site.source, autocommit=False) if self.reopen else None
            opened += [source] if source is not None else []
            subscriber = site.connect(site.source)  # the way back's subscriptions are there
            opened.append(subscriber)
            self._watch([subscriber])
            self.start_clock()
            for host, src, aux in hosts:
                self.src, self.aux = src, aux
                self.fleet.append(src)
                self._freeze_host(host)
            checkpoint("adopt-abort-fleet-locked")
            if source is not None:
                self.src = source
                self._timeouts()
                self._budget()
                _reopen_source(site, self.src, self.sequences)
                self._late()
            # The fleet first: its writers (their tables' names gone: a Router follows the redirect)
            # wait on the old database's locks (its tables' names) until it commits. The other way
            # round, a run killed between the two commits would leave both sides open to writes.
            self._before_commit()
            for conn in self.fleet:
                conn.commit()
            checkpoint("adopt-abort-fleet-committed")
            if self.reopen:
                self.src.commit()  # the old database takes writes
                checkpoint("adopt-abort-source-open")
            self._mark("commit")
        except (
            psycopg.errors.QueryCanceled,
            psycopg.errors.LockNotAvailable,  # renaming the shard tables waits for readers' locks
            psycopg.errors.DeadlockDetected,
        ) as exc:
            raise FreezeTimeout(
                f"a statement of the freeze ran past --max-freeze ({db.first_line(exc)})"
            ) from None
        finally:
            for conn in opened:
                if not conn.closed and not conn.broken and not conn.autocommit:
                    try:
                        conn.rollback()  # nothing is left to roll back after the commits
                    except psycopg.Error:
                        pass
                conn.close()

    def _freeze_host(self, host: Host) -> None:
        """Lock ``host``'s adopted tables, wait until the old database applied its WAL, then take its
        shard tables (and global tables) out of their names, guard its parents and redirect its
        shards to the old database (uncommitted). Idempotent: a table renamed already is left as is."""
        site = self.site
        self._timeouts()
        now = site.shard_table_names(self.src, host)  # (a run killed after the commit renamed them)
        located = site.located(self.src, host)  # in MOVED_SCHEMA since the cutover
        parents = [p for p in located if p[1] not in site.globals]
        routed = [(s, now.get((s, t), t)) for s, t in site.routed_shard_tables(host)]
        globals_ = [
            (s, now.get((s, t), t)) for s, t in site.shard_tables(host) if t in site.globals
        ]
        # a parent's lock covers its partitions; a routed table's shard tables first (their writers
        # then write its partitions: the same order, no deadlock)
        self._lock(routed + parents + globals_)
        self._wait_applied([site.back(host)])
        self._budget()
        if site.globals and host.name == site.global_host.name:
            self.sequences = inspect.sequences(self.src, [site.schema])
        # A Router whose topology copy still says fleet reads by name, and a read fires no trigger:
        # under their names the tables would answer with the rows as of now, stale from the moment
        # the old database takes writes. Renamed, a read meets undefined_table and the Router follows
        # the redirect (a write too: it looks the name up again once it has its lock). The parents
        # stay out of the app's schema (its name would be found through search_path) and keep the
        # guard: nothing else writes them.
        hide = [(s, t, catalog.aborted_name(t)) for (s, t), name in now.items() if name == t]
        message = fleet_message(site)
        self.src.execute(
            "".join(stubs.unguard_sql(s, t) + stubs.guard_sql(s, t, message) for s, t in parents)
            + catalog.rename_tables_sql(hide)
        )
        # parents an earlier version moved home at its abort go out of the app's schema too
        home = [p for p in parents if p[0] == site.schema]
        if home:
            catalog.ensure_schema(self.src, catalog.MOVED_SCHEMA)
            self.src.execute(catalog.set_schema_sql(home, catalog.MOVED_SCHEMA))
        # Routers whose topology copy still says fleet follow back (the cutover clears these).
        site.redirect_back(self.src, host)
        self._late()

    def _late(self) -> None:
        if time.monotonic() > self.deadline:
            raise FreezeTimeout(f"the freeze ran past --max-freeze {self.max_freeze:g}s")


def _abort_freeze(
    site: Site, max_freeze: float, attempts: int, reopen: bool, result: CutoverResult
) -> None:
    with site.connect(site.source) as src:
        names = site.back_names()
        missing = [n for n in names if n not in replication.subscriptions(src, names)]
    if missing:
        raise OperationFailed(
            f"abort: the way back ({', '.join(missing)} on the old database) is missing: the "
            f"writes made on the fleet since the cutover cannot be carried back; nothing was changed"
        )
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        result.attempts = attempt
        freeze = AbortFreeze(site, max_freeze, reopen)
        try:
            freeze.attempt()
            result.record(freeze.marks)
            return
        except FreezeTimeout as exc:
            last = exc
            site.note(f"abort, attempt {attempt}: {exc}; writes resumed on the fleet")
            time.sleep(min(5.0, attempt * 0.5))
    raise OperationFailed(
        f"abort: gave up after {attempts} attempts ({last}); the fleet stays authoritative; run "
        f"--abort again or raise --max-freeze"
    )


def _reopen_source(
    site: Site, src: psycopg.Connection, sequences: dict[tuple[str, str], dict]
) -> None:
    """In the abort's freeze, on the old database: its guards and redirects gone, the global tables'
    sequences past the global host's ``sequences`` (the rows made there came back), the run
    ``aborted`` (committed by the caller)."""
    tables = site.located(src)
    src.execute(catalog.drop_guards_sql(tables))
    # the stubs out of the tables' names (back to their staging schema), the tables back in
    moved = [t for s, t in tables if s == catalog.MOVED_SCHEMA]
    src.execute(
        catalog.set_schema_sql([(site.schema, t) for t in moved], catalog.STUB_STAGING, True)
    )
    src.execute(catalog.set_schema_sql([(catalog.MOVED_SCHEMA, t) for t in moved], site.schema))
    here = inspect.sequences(src, [site.schema])
    inspect.set_sequences(
        src,
        [
            (s, n, int(v["last_value"]))
            for (s, n), v in sequences.items()
            if v["last_value"] is not None and (s, n) in here
        ],
    )
    control.clear_redirects(src, [n for h in site.fleet_hosts() for n in site.redirected(h)])
    catalog.set_run(src, ABORTED, {"abort": {"at": time.time()}, "switched": False})


def drop_back(site: Site) -> dict:
    """The way back: the old database's subscriptions, each fleet host's publication, slot and
    mirror triggers (of the tables routed by trigger), and the global tables' mirrors."""
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
            mirror_routed(site, host, conn, make=False)
            mirror_globals(site, host, conn, make=False)
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
    # Old IDs live forever: the id map keeps its rows, only its replication goes.
    drop_id_map(
        topo,
        site.source,
        keep_data=True,
        schema=catalog.MOVED_SCHEMA,
        connect_timeout=site.connect_timeout,
    )
    restored = restore_fleet_identities(site, detail)
    with site.connect(site.source) as src:
        # The stubs keep the old names (a direct client is told where the rows went); the frozen
        # tables stay in their schema: dropping them is the team's decision.
        stubs.drop_moved_stubs(src, [catalog.STUB_STAGING])  # only its next_id() is left
        restored += _restore_identities(site, src, detail, catalog.MOVED_SCHEMA)
        with src.transaction():
            catalog.set_run(src, CLEANED, {"cleanup": {"at": time.time(), "restored": restored}})
    checkpoint("adopt-cleanup-recorded")
    drop_adoption_source(topo.path)
    result.notes, result.seconds = site.notes, round(time.perf_counter() - t0, 3)
    return result


def _drop_parents(site: Site) -> list[str]:
    """Each fleet host's partitioned parents (partitions detached: they stay) and tables routed by
    trigger, with their routing functions (schema ``shardctl_adopt``); the global tables stay."""
    out = []
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            # One partition per statement, each waiting briefly for its shard table: the app's
            # queries queue behind a detach for DETACH_LOCK_WAIT at most, and a detach holds no
            # other shard table meanwhile. An app's write to a partition also locks its parent,
            # so a detach can still be in a deadlock with it; waiting within LOCK_WINDOW_SHARE of
            # deadlock_timeout, the detach gives up (and retries) before the app's check runs.
            wait = min(DETACH_LOCK_WAIT, LOCK_WINDOW_SHARE * session.deadlock_timeout(conn))
            session.set_settings(conn, {"lock_timeout": session.duration(wait)}, local=False)
            for schema, table in site.located(conn, host):
                if table in site.globals:
                    continue
                parent = (schema, table)
                for child in catalog.partitions(conn, schema, table):
                    _while_locked(host, child, conn, catalog.detach_sql(parent, child))
                _while_locked(host, parent, conn, catalog.drop_table_sql(parent))
                out.append(f"{host.name}:{schema}.{table}")
            catalog.drop_state_schema(conn)
            catalog.drop_empty_schema(conn, catalog.MOVED_SCHEMA)
    return out


def _while_locked(
    host: Host, table: tuple[str, str], conn: psycopg.Connection, statement: sql.Composed
) -> None:
    """Run the DDL ``statement`` on ``table`` (autocommit), retried while others hold the table."""
    transfer.retry_while_locked(
        lambda: conn.execute(statement),
        DETACH_TRIES,
        lambda: OperationFailed(
            f"{host.name}: {table[0]}.{table[1]} stayed locked by other transactions for "
            f"{DETACH_TRIES} tries of {DETACH_LOCK_WAIT:g}s; nothing is lost: run the same command "
            f"again"
        ),
    )


def _drop_moved_schemas(site: Site) -> None:
    """After an abort: the stubs' staging schema on the old database, and the emptied schema the
    cutover moved the tables to there and on the fleet hosts."""
    with site.connect(site.source) as src:
        stubs.drop_moved_stubs(src, [catalog.STUB_STAGING])
        catalog.drop_empty_schema(src, catalog.MOVED_SCHEMA)
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            catalog.drop_empty_schema(conn, catalog.MOVED_SCHEMA)


def _restore_identities(
    site: Site, src: psycopg.Connection, detail: dict, schema: str | None = None
) -> list[str]:
    """Put back the replica identities ``adopt copy`` set to FULL (its run's detail
    ``replica_identity``: table → [kind, index] before) and drop its triggers (``retoast``), on the
    tables in ``schema`` (default: the app's)."""
    schema = schema or site.schema
    out = []
    for table, (kind, index) in (detail.get("replica_identity") or {}).items():
        where = schema if table in site.adoption.tables else site.schema
        if copy_catalog.table_exists(src, where, table):
            copy_catalog.restore_replica_identity(src, where, table, kind, index)
            out.append(table)
    for table in detail.get("retoast") or []:
        where = schema if table in site.adoption.tables else site.schema
        if copy_catalog.table_exists(src, where, table):
            copy_catalog.drop_retoast_trigger(src, where, table)
    return out
