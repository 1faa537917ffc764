"""``adopt cutover``: the old database stops taking writes to the adopted tables and the fleet becomes
authoritative, in a freeze bounded by ``--max-freeze`` whatever the data size.

Before the freeze (writes go on): the last ``adopt verify`` must have passed; the way back is made
(on each fleet host a publication of its parents ``WITH (publish_via_partition_root = true)`` and its
slot, the parents' replica identity FULL; for a table ``adopt copy`` routes by trigger, which has no
parent, a trigger on each shard table mirrors its writes into the routed table, published likewise:
:func:`mirror_routed`; for a global table, its mirror on the global host: :func:`mirror_globals`),
the control objects the guard and the redirects need (schema ``shardctl`` on the old database), and
the forward subscriptions' lag must be small.

The freeze, the move's (``ops/move/cutover.BoundedFreeze``): one transaction on the old database,
``LOCK … IN EXCLUSIVE MODE`` on the adopted tables, wait until every forward subscription applied its
WAL up to there, the global tables' sequences set on the global host, a guard trigger on each adopted
table (SQLSTATE ``SCM01``, one line naming the new home, for direct clients), the adopted tables (the
global ones too) moved to schema ``shardctl_adopted`` and stubs put under their names (views made
before the freeze whose reads and writes raise ``SCM01``: a Router on a stale topology copy follows
on a read too, as after a move), a redirect per shard (Routers whose topology copy still says
``authoritative: source`` follow it to the fleet), the run recorded ``cut_over``. Before the commit,
each fleet host's partitioned parents move to ``shardctl_adopted`` too (committed; the forward
subscriptions have nothing left to apply): the way back publishes each change under the name its
parent has when it is made, so the fleet's writes, which start once the old database commits, come
back into the moved tables. A failed or late attempt rolls back and moves the parents back: the
source stays authoritative.

Then: ``adoption.authoritative: fleet`` in the topology file, the forward replication dropped, and the
way back started: a subscription per fleet host on the old database (``origin = none``: only the
fleet's own writes come back, none the forward copy applied), so ``--abort`` has every write made
after the cutover. The guards do not stop it (its apply worker runs as ``replica``). Each step is
idempotent: a run killed anywhere is finished by running the command again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, FreezeTimeout, OperationFailed, WaitTimeout
from ...model.documents import Result
from ...model.dsn import mask
from ...model.topology import Host, Topology
from ...model.topology_file import flip_adoption
from ...router.placement import GLOBAL
from ...sql import session
from ...sql.catalog import adopt_copy as copy_catalog
from ...sql.catalog import adopt_cutover as catalog
from ...sql.catalog import adopt_verify as verify_catalog
from ...sql.catalog import control, inspect, replication, stubs
from ..move import transfer
from ..move.cutover import CATCH_UP_BYTES, BoundedFreeze, lagging
from ..move.run import Progress, checkpoint, human_bytes, peer_conninfo
from .id_map import move_id_map
from .site import Site

CUT_OVER = "cut_over"
READY = ("synced",)  # the phase a cutover starts from: the copy caught up and streams
SEQUENCE_MARGIN = 1000  # global tables' sequences on the global host start past the source's
FLEET_IDENTITY = "fleet_identity"  # run detail: host → its shard tables made REPLICA IDENTITY FULL
PREPARE_LOCK_TIMEOUT = "5s"  # the way back's DDL on a fleet host gives up past it (run again)
# Before a freeze, how long every subscriber may take to stream again (an apply worker restarts
# within wal_retrieve_retry_interval, 5 s by default) before the cutover gives up unfrozen.
STREAMING_WAIT = 10.0


@dataclass
class CutoverResult(Result):
    """What ``adopt cutover`` (``action``: cutover, abort or cleanup) did."""

    command = "adopt cutover"

    action: str
    phase: str
    authoritative: str | None
    attempts: int = 0
    freeze_seconds: float | None = None  # the frozen side locked (fleet for abort), to commit
    freeze_lock_seconds: float | None = None
    freeze_caught_up_seconds: float | None = None
    topology_flipped: bool = False
    dropped: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True  # a cutover that cannot finish raises

    def raise_for_status(self) -> CutoverResult:
        return self

    def record(self, marks: dict[str, float]) -> None:
        """The committed freeze's times (``BoundedFreeze.marks``)."""
        self.freeze_seconds = marks.get("commit")
        self.freeze_lock_seconds = marks.get("lock")
        self.freeze_caught_up_seconds = marks.get("caught_up")


def adopt_cutover(
    topo: Topology,
    *,
    max_freeze: float = 0.5,
    attempts: int = 3,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    progress: Progress | None = None,
) -> CutoverResult:
    """Make the fleet authoritative for the adopted tables (see the module's text)."""
    if max_freeze <= 0 or attempts < 1:
        raise BadInput("--max-freeze must be above 0 and --attempts at least 1")
    t0 = time.perf_counter()
    site = Site.of(topo, connect_timeout, progress, need_source=True)
    result = CutoverResult("cutover", "", site.adoption.authoritative)
    with site.connect(site.source) as src:
        phase, _detail = site.run_state(src)
        if phase in READY:
            _require_verified(src, _detail.get("restarted_at"))
    if phase == CUT_OVER:
        site.note("the old database was already frozen: finishing the switch")
    elif phase in READY:
        prepare(site, _detail)
        _freeze(site, max_freeze, attempts, result)
    else:
        raise BadInput(
            f"the adoption is in phase {phase}: a cutover needs a running copy ({', '.join(READY)}); "
            f"see `shardctl adopt status`"
        )
    result.topology_flipped, result.dropped = finish(site)
    result.phase, result.authoritative, result.notes = CUT_OVER, "fleet", site.notes
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _require_verified(src: psycopg.Connection, since: float | None = None) -> None:
    """The precondition ``adopt verify`` provides: its last run on the old database (since the copy
    started again after an abort, ``since``) finished and found no problem. Without it, nothing is
    frozen."""
    last = verify_catalog.last_run(src, since)
    if verify_catalog.passed(last):
        return
    if last is None:
        why = "never ran"
    elif last["finished_at"] is None:
        why = "did not finish its last run"
    elif last["summary"].get("problems"):
        why = f"found differences in its last run ({last['summary']['problems'][0]} …)"
    else:
        why = f"found dark reads that differ in its last run ({last['summary'].get('dark_reads')})"
    raise BadInput(
        f"adopt verify {why}: the cutover needs a verified copy (run `shardctl adopt verify` until "
        f"it passes); nothing was frozen"
    )


def prepare(site: Site, detail: dict) -> None:
    """Before the freeze, idempotent: the control objects on the old database, and the way back on
    each fleet host (replica identity FULL on its parents and shard tables, the publication, its slot)."""
    with site.connect(site.source) as src:
        control.ensure_move_objects(src)  # the guard function, the stubs' functions, the redirects
        catalog.ensure_schema(src, catalog.MOVED_SCHEMA)
        stubs.create_moved_stubs(
            src,
            {catalog.STUB_STAGING: (site.schema, stub_message(site))},
            only=site.tables + site.globals,
        )
    recorded: dict[str, list[str]] = dict(detail.get(FLEET_IDENTITY) or {})
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            # DDL on tables the app may use: wait for their locks a bounded time, never queue behind
            session.set_settings(conn, {"lock_timeout": PREPARE_LOCK_TIMEOUT}, local=False)
            # the redirects an abort records, and the function of the Routers' check of them
            control.ensure_move_objects(conn)
            _parents_home(site, host, conn)
            _redirects_back(site, host, conn, detail)
            mirror_globals(site, host, conn, make=True)
            _identities_full(site, host, conn, recorded)
            mirror_routed(site, host, conn, make=True)
            name = site.back(host)
            catalog.create_root_publication(conn, name, site.parents(host))
            owner = catalog.slot_database(conn, name)
            if owner is None:
                replication.create_slot(conn, name)
            elif owner != conn.info.dbname:
                raise OperationFailed(
                    f"cutover: {host.name}'s server already has a replication slot {name}, of its "
                    f"database {owner} (another adoption into that server); finish or clean that one "
                    f"up first; nothing was frozen"
                )
    checkpoint("adopt-prepared")


def _redirects_back(site: Site, host: Host, conn: psycopg.Connection, detail: dict) -> None:
    """In a run that follows an abort (``restarted_at``), ``host``'s redirects back to the old
    database, as the abort left them until a freeze commits (a freeze killed after its fleet side
    dropped them, :meth:`AdoptFreeze._move_fleet`, left them dropped). Idempotent."""
    if detail.get("restarted_at") is not None:
        site.redirect_back(conn, host)


def _parents_home(site: Site, host: Host, conn: psycopg.Connection) -> None:
    """``host``'s parents in the app's schema, where the forward subscription applies: a freeze
    killed after it moved them (:meth:`AdoptFreeze._move_fleet`) left them moved."""
    catalog.ensure_schema(conn, catalog.MOVED_SCHEMA)
    moved = [p for p in site.located(conn, host) if p[0] == catalog.MOVED_SCHEMA]
    if moved:
        conn.execute(catalog.set_schema_sql(moved, site.schema))


def _identities_full(
    site: Site, host: Host, conn: psycopg.Connection, recorded: dict[str, list[str]]
) -> None:
    """REPLICA IDENTITY FULL on ``host``'s parents and their partitions (the shard tables), each one
    recorded on the old database before it is changed (``--abort`` and ``--cleanup`` put DEFAULT back).

    Why: a change of a partition is published as its parent's, with the old row as the partition's
    identity logs it. The old database finds the row by its own identity, which may hold more than
    the ID (``adopt copy``'s ``FULL``, the id map's index on (ID, key)): only a full old row serves
    every identity there, and only a parent with identity FULL declares every column a key column."""
    parents = site.parents(host)
    leaves = [(s, t) for s, t in site.shard_tables(host) if (site.schema, t) in parents]
    leaves = [x for x in leaves if x not in site.routed_shard_tables(host)]
    leaves += site.routed_partitions(host)
    ident = catalog.replica_identities(conn, parents + leaves)
    todo = [(s, t) for s, t in parents + leaves if ident.get(f"{s}.{t}") not in ("f", None)]
    if not todo:
        return
    mine = set(recorded.get(host.name) or [])
    recorded[host.name] = sorted(mine | {f"{s}.{t}" for s, t in todo if s != site.schema})
    with site.connect(site.source) as src:
        catalog.merge_detail(src, {FLEET_IDENTITY: recorded})
    for s, t in todo:
        conn.execute(catalog.set_replica_identity_sql(s, t, full=True))


def mirror_routed(site: Site, host: Host, conn: psycopg.Connection, make: bool) -> None:
    """The way back's triggers on ``host`` (``make``; else dropped): the tables routed by trigger
    have each shard table's writes mirrored into its partition of the routed table, which the way
    back publishes like a parent (``sql/catalog/adopt_copy.create_mirror``); and every shard table's
    TRUNCATE deletes its rows first, so that it comes back (``catalog.create_truncate_back``). The
    apply worker's writes before the cutover fire neither (they fire for the app's sessions only)."""
    if not make:
        catalog.drop_truncate_back(conn)
    elif host.shards:
        shard_tables = [(site.topo.schema_name(n), t) for n in host.shards for t in site.tables]
        catalog.create_truncate_back(conn, shard_tables)
    for table in site.routed_tables if host.shards else []:
        shards = {n: site.topo.schema_name(n) for n in host.shards}
        if not make:  # after an abort, the shard tables have its names
            copy_catalog.drop_mirror(conn, table, shards, (table, catalog.aborted_name(table)))
            continue
        pk = copy_catalog.primary_key(conn, (shards[host.shards[0]], table))
        copy_catalog.create_mirror(conn, table, shards, pk)


def mirror_globals(site: Site, host: Host, conn: psycopg.Connection, make: bool) -> None:
    """The way back of the global tables, on the global host (``make``; else dropped): each kept
    whole in a mirror under the name the old database's table takes at the cutover
    (:data:`MOVED_SCHEMA`, where a stub then takes its old name), which the way back publishes
    (``sql/catalog/adopt_copy.create_table_mirror``). The mirror holds the rows as of the cutover:
    the forward subscription's writes are mirrored too (and, having its origin, never go back)."""
    if host.name != site.global_host.name:
        return
    for table in site.globals:
        if make:
            copy_catalog.create_table_mirror(
                conn, (site.schema, table), (catalog.MOVED_SCHEMA, table)
            )
        else:
            names = (table, catalog.aborted_name(table))  # its name after an abort
            copy_catalog.drop_mirror(conn, table, {GLOBAL: site.schema}, names)
            conn.execute(catalog.drop_table_sql((catalog.MOVED_SCHEMA, table)))


def restore_fleet_identities(site: Site, detail: dict) -> list[str]:
    """Put DEFAULT back on the shard tables :func:`prepare` made FULL (the parents go or stay FULL)."""
    out = []
    for host in site.fleet_hosts():
        names = (detail.get(FLEET_IDENTITY) or {}).get(host.name) or []
        if not names:
            continue
        with site.connect(host) as conn:
            session.set_settings(conn, {"lock_timeout": PREPARE_LOCK_TIMEOUT}, local=False)
            for name in names:
                schema, table = name.split(".", 1)
                # after an abort, under the name it gave the table
                for now in (table, catalog.aborted_name(table)):
                    if copy_catalog.table_exists(conn, schema, now):
                        conn.execute(catalog.set_replica_identity_sql(schema, now, full=False))
                        out.append(f"{host.name}:{name}")
                        break
    return out


def streams(site: Site, src: psycopg.Connection) -> list[str]:
    """The slots on the old database whose subscribers the freeze waits for: the copy's, and the id
    map's when it has one (a row written just before the freeze is found by its old ID right after)."""
    names = site.forward_names()
    if catalog.slot_database(src, site.id_map()) == src.info.dbname:  # not another adoption's
        names.append(site.id_map())
    return names


def _wait_small_lag(site: Site, src: psycopg.Connection, deadline: float) -> None:
    """Before freezing, the forward subscriptions (and the id map's) must be a few MB behind at most."""
    names = streams(site, src)
    lag: int | None = None

    def caught_up() -> bool:
        nonlocal lag
        lag = replication.slot_lag(src, names)
        if lag is None:
            raise OperationFailed(
                f"cutover: the copy's replication slots ({', '.join(names)}) are missing on the old "
                f"database: run `shardctl adopt copy` again"
            )
        site.progress("catch-up", 0, 0, f"lag {human_bytes(lag)}")
        return lag <= CATCH_UP_BYTES

    transfer.wait_for(
        caught_up,
        deadline,
        lambda: WaitTimeout(
            f"cutover: the copy stays {human_bytes(lag or 0)} behind the old database: a freeze now "
            f"could not finish within --max-freeze; nothing was frozen, try when the load is lower"
        ),
    )
    # A small lag is the slots' confirmed position: a subscription whose apply worker is restarting
    # (for up to wal_retrieve_retry_interval) has one too, and no freeze would see lag 0 before it
    # is back. So, still outside the freeze: every subscriber streams and applies what is there now.
    lsn = replication.wal_insert_lsn(src)
    transfer.wait_for(
        lambda: replication.replayed(src, names, lsn),
        min(deadline, time.monotonic() + STREAMING_WAIT),
        lambda: WaitTimeout(
            f"cutover: the copy's subscriptions are not applying the old database's changes: "
            f"{lagging(src, names, lsn)}; nothing was frozen (see "
            f"`shardctl adopt status`)"
        ),
    )


def _freeze(site: Site, max_freeze: float, attempts: int, result: CutoverResult) -> None:
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        result.attempts = attempt
        with site.connect(site.source) as src:
            _wait_small_lag(site, src, time.monotonic() + max(30.0, max_freeze * 6))
        freeze = AdoptFreeze(site, max_freeze)
        try:
            freeze.attempt()
        except FreezeTimeout as exc:
            last = exc
            site.note(f"cutover attempt {attempt}: {exc}; writes resumed on the old database")
            time.sleep(min(5.0, attempt * 0.5))
            continue
        result.record(freeze.marks)
        return
    raise OperationFailed(
        f"cutover: gave up after {attempts} attempts ({last}); the old database stays "
        f"authoritative; run the cutover again or raise --max-freeze"
    )


def stub_message(site: Site) -> str:
    """What a direct client reading or writing an adopted table's old name is told (one line)."""
    hosts = ", ".join(h.name for h in site.fleet_hosts())
    return (
        f"this table of {site.schema} was adopted into the shardctl fleet ({hosts}; topology "
        f"{site.topo.path}): read and write it through shardctl's Router (the rows as of the "
        f"cutover: schema {catalog.MOVED_SCHEMA})"
    )


def guard_message(site: Site, table: str) -> str:
    """What a direct client writing an adopted table on the old database is told: one line."""
    hosts = ", ".join(h.name for h in site.fleet_hosts())
    return (
        f"table {site.schema}.{table} was adopted into the shardctl fleet ({hosts}; topology "
        f"{site.topo.path}): write through shardctl's Router"
    )


class AdoptFreeze(BoundedFreeze):
    """One freeze attempt on the old database (see the module's text)."""

    def __init__(self, site: Site, max_freeze: float):
        super().__init__(max_freeze, site.progress)
        self.site = site
        self.fleet_moved: list[Host] = []

    def attempt(self) -> None:
        site = self.site
        self.src = src = site.connect(site.source, autocommit=False)
        self.aux = site.connect(site.source)
        glob = site.connect(site.global_host) if site.globals else None
        self.subscribers = [site.connect(h) for h in site.subscriber_hosts()]
        try:
            self._timeouts()
            self._watch(self.subscribers)
            names = streams(site, self.aux)  # before the clock: nothing is locked yet
            self.start_clock()
            self._lock(site.source_tables())
            checkpoint("adopt-in-freeze")
            self._wait_applied(names)
            if glob is not None:
                self._sequences(glob)
            self._budget()
            self._retire()
            self._before_commit()
            src.commit()
            self._mark("commit")
            checkpoint("adopt-after-freeze")
        except (
            psycopg.errors.QueryCanceled,
            psycopg.errors.LockNotAvailable,  # moving the tables waits for readers' locks
            psycopg.errors.DeadlockDetected,
        ) as exc:
            self._rollback()
            self._unmove_fleet()
            raise FreezeTimeout(
                f"a statement of the freeze ran past --max-freeze ({db.first_line(exc)})"
            ) from None
        except BaseException:
            self._rollback()
            self._unmove_fleet()
            raise
        finally:
            for c in (self.src, self.aux, glob, *self.subscribers):
                if c is not None:
                    c.close()

    def _sequences(self, glob: psycopg.Connection) -> None:
        """The global tables keep their sequences: on the global host, past the source's values."""
        schema = self.site.schema
        there = inspect.sequences(glob, [schema])
        values = [
            (s, n, min(int(v["last_value"]) + SEQUENCE_MARGIN, int(v["max_value"])))
            for (s, n), v in inspect.sequences(self.src, [schema]).items()
            if v["last_value"] is not None and (s, n) in there
        ]
        inspect.set_sequences(glob, values)
        self._mark("sequences")

    def _retire(self) -> None:
        site, src = self.site, self.src
        src.execute(
            "".join(stubs.guard_sql(s, t, guard_message(site, t)) for s, t in site.source_tables())
        )
        # The stubs take the adopted tables' names, the global ones' too: a Router on a stale
        # topology copy meets SCM01 on a read too, and follows the redirect (catalog only: no row is
        # touched; the way back applies into the moved tables, by their new names).
        src.execute(catalog.set_schema_sql(site.source_tables(), catalog.MOVED_SCHEMA))
        staged = [(catalog.STUB_STAGING, t) for t in site.tables + site.globals]
        src.execute(catalog.set_schema_sql(staged, site.schema, view=True))
        self._move_fleet()
        for host in site.fleet_hosts():
            shards = site.redirected(host)
            schemas = [site.topo.schema_name(n) if n >= 0 else site.schema for n in shards]
            control.write_redirects(src, shards, schemas, host.name, host.dsn, "adoption")
        catalog.set_run(
            src,
            CUT_OVER,
            {
                "cutover": {
                    "at": time.time(),
                    "freeze_caught_up_seconds": self.marks.get("caught_up"),
                }
            },
        )
        self._mark("retired")

    def _move_fleet(self) -> None:
        """Each fleet host's parents to :data:`MOVED_SCHEMA`, and an earlier abort's redirects there
        (back to the old database) dropped, committed before the old database's commit: the way back
        decodes each change of the fleet under the name its parent has then, and the first ones come
        once the old database committed; a Router sent to the fleet from then on must not be sent
        back (``Placement.redirect_check``). The forward subscriptions have nothing left to apply
        (lag 0, the old tables locked); a failed attempt puts both back."""
        site = self.site
        for host in site.fleet_hosts():
            left = session.duration(max(self.deadline - time.monotonic(), 0.001))
            with site.connect(host) as conn:
                session.set_settings(
                    conn, {"lock_timeout": left, "statement_timeout": left}, local=False
                )
                self.fleet_moved.append(host)
                with conn.transaction():
                    if host.shards:
                        parents = [p for p in site.located(conn, host) if p[0] == site.schema]
                        parents = [p for p in parents if p[1] in site.adoption.tables]
                        conn.execute(catalog.set_schema_sql(parents, catalog.MOVED_SCHEMA))
                    control.clear_redirects(conn, site.redirected(host))
        checkpoint("adopt-fleet-moved")
        self._mark("fleet_moved")

    def _unmove_fleet(self) -> None:
        """After a failed attempt: the parents back where the forward subscriptions apply, and the
        abort's redirects back (unless the old database's commit went through after all: then they
        stay as the attempt left them)."""
        if not self.fleet_moved:
            return
        site = self.site
        with site.connect(site.source) as src:
            phase, detail = site.run_state(src)
        if phase == CUT_OVER:
            return
        for host in self.fleet_moved:
            with site.connect(host) as conn, conn.transaction():
                _parents_home(site, host, conn)
                _redirects_back(site, host, conn, detail)
        self.fleet_moved = []


def finish(site: Site) -> tuple[bool, dict]:
    """After the freeze committed: the topology flipped, the forward replication dropped, the way back
    started. Idempotent. Returns (whether this call flipped the file, what was dropped)."""
    flipped = flip_adoption(site.topo.path, "fleet")
    checkpoint("adopt-after-flip")
    dropped = drop_forward(site)
    checkpoint("adopt-after-forward-dropped")
    # The old database's tables moved: so do the id map's, which its changes reach by that name.
    move_id_map(site.topo, catalog.MOVED_SCHEMA, connect_timeout=site.connect_timeout)
    start_back(site)
    with site.connect(site.source) as src, src.transaction():
        catalog.set_run(src, CUT_OVER, {"switched": True})
    return flipped, dropped


def drop_forward(site: Site) -> dict:
    """The copy's subscriptions (fleet hosts), publications and slots (old database). Idempotent."""
    names = site.forward_names()
    out: dict[str, list] = {"subscriptions": [], "publications": [], "slots": []}
    oids: list[int] = []
    for host in site.fleet_hosts():
        with site.connect(host) as conn:
            name = site.forward(host)
            oids += list(replication.subscriptions(conn, [name]).values())
            if replication.drop_subscription(conn, name) != "absent":
                out["subscriptions"].append(f"{host.name}:{name}")
    with site.connect(site.source) as src:
        out["publications"] = replication.drop_publications(src, names)
        out["slots"] = transfer.drop_slots(src, names, oids)
    return out


def start_back(site: Site) -> None:
    """On the old database, a subscription per fleet host on the slot made before the freeze: every
    write made on the fleet after the cutover reaches the old tables (for ``--abort``)."""
    with site.connect(site.source) as src, site.connect(site.source, autocommit=False) as hold:
        for host in site.fleet_hosts():
            name = site.back(host)
            if name not in replication.subscriptions(src, [name]):
                try:
                    catalog.create_back_subscription(src, name, peer_conninfo(host))
                except psycopg.Error as exc:
                    raise OperationFailed(
                        f"cutover: the way back from {host.name} could not be made on the old "
                        f"database ({db.first_line(exc)}; {mask(host.dsn)})"
                    ) from None
            moved = site.parents(host, moved=True)  # the old database's tables, moved
            replication.start_subscription(src, name, False, hold, moved)
