"""``verify``: prove every shard's IDs are right, its function is the template's, placement matches, and its
schema is what the migration files define (a reference built where nothing can shadow it: ops/reference.py)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import HostResult, fan_out, raise_for_status
from ..errors import BadInput, ShardctlError
from ..ids import checks as id_checks
from ..model.documents import Result, json_value, result_doc
from ..model.dsn import mask
from ..model.ranges import format_shards
from ..model.topology import Host, Topology
from ..sql import fingerprint
from ..sql.catalog import verify as queries
from ..sql.catalog.control import shard_list
from ..sql.host_migrations import host_for_topology
from ..sql.migrations import for_topology
from ..sql.render import next_id_body, render_next_id
from . import reference
from .health import FleetHealth, fleet_health

DEFAULT_SAMPLES = 16
DEFAULT_TOLERANCE_MS = 5000
# shards per host whose next_id() is rendered to learn the template's shape
DEFAULT_BODY_SAMPLES = 8
# Shards per host whose IDs are minted and checked (besides every shard whose body or sequence is off):
# a backend pays ~0.1-0.5 ms the first time it calls a shard's next_id() (compiling it, opening its
# sequence), so 65,536 shards cost seconds of server CPU; --full checks every shard.
DEFAULT_ID_SHARDS = 512


@dataclass
class Violation:
    host: str
    shard: int | None
    schema: str | None
    reason: str


@dataclass
class HostVerification:
    """What verify found on one host (the ``value`` of its HostResult)."""

    host: str
    shards_checked: int = 0
    ids_checked: int = 0
    clock_skew_ms: float | None = None
    server_version: str | None = None
    violations: list[Violation] = field(default_factory=list)
    # shard → md5 of its catalog (sql/fingerprint.py)
    fingerprints: dict[int, str] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)  # shard → highest version in its ledger

    def to_dict(self) -> dict:
        # the host is its HostResult's; the violations are listed once, in the report
        return result_doc(
            self, omit=("host", "fingerprints", "versions"), violations=len(self.violations)
        )


@dataclass
class SchemaGroup:
    """Shards whose ledger is at ``version`` and whose catalogs have one fingerprint; ``reference``:
    whether it is the fingerprint of the reference schema at that version (``ops/reference.py``). A
    group that is not is explained once, on ``sample``: ``differences`` from the reference."""

    fingerprint: str
    shards: list[int]
    version: int = 0
    reference: bool = False
    sample: int | None = None
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return result_doc(self, count=len(self.shards), shards=format_shards(self.shards))


@dataclass
class VerifyReport(Result):
    """The result of :func:`verify`: each host's findings, the ``samples`` IDs checked per shard, the
    ID ``layout``, the shards grouped by catalog and ledger version (``schemas``, those that match the
    reference first), and the versions still to run (``pending``, one line per host and version);
    ``violations`` lists every shard or host that is wrong."""

    command = "verify"

    hosts: list[HostResult[HostVerification]]
    seconds: float
    samples: int
    layout: dict
    full: bool = False
    schemas: list[SchemaGroup] = field(default_factory=list)
    # versions the files define that shards have not applied yet: work for `migrate`, shown but not a
    # violation (shards behind the rest of the fleet are the health check's finding, exit 4)
    pending: list[str] = field(default_factory=list)
    latest_version: int = 0
    # what building the reference met without failing (a host-level file that acts on the cluster)
    reference_notes: list[str] = field(default_factory=list)
    health: FleetHealth | None = None  # ops.health: what status, plan and migrate --check say too

    @property
    def violations(self) -> list[Violation]:
        return [v for h in self.hosts for v in h.value.violations]

    @property
    def ok(self) -> bool:
        healthy = self.health is None or self.health.ok
        return (
            healthy and not self.violations and all(h.reachable and not h.error for h in self.hosts)
        )

    def to_dict(self) -> dict:
        return {
            **super().to_dict(),
            "distinct_schemas": len({g.fingerprint for g in self.schemas}),
            "violations": json_value(self.violations),
        }

    def raise_for_status(self) -> VerifyReport:
        """The fleet's health first (``ops.health``: exit 3 for a host that cannot be reached or cannot
        authenticate, 4 for shards missing, failed or lagging), then 1 for a violation or a host that
        could not be checked. A version pending on every shard is work for ``migrate``, not a fault
        (``migrate --check`` is the gate that fails on it)."""
        if self.health is not None:
            self.health.raise_for("verify", self.to_dict())
        first = self.violations[0] if self.violations else None
        problems = []
        if first:
            where = f"shard {first.shard}" if first.shard is not None else "host"
            problems.append(
                f"{len(self.violations)} violation(s); first: {first.host} {where}: {first.reason}"
            )
        raise_for_status("verify", self.hosts, problems, report=self.to_dict())
        return self


def verify(
    topo: Topology,
    *,
    hosts: list[str] | None = None,
    samples: int = DEFAULT_SAMPLES,
    tolerance_ms: int = DEFAULT_TOLERANCE_MS,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    full: bool = False,
    body_samples: int = DEFAULT_BODY_SAMPLES,
    id_shards: int = DEFAULT_ID_SHARDS,
    schemas: bool = True,
) -> VerifyReport:
    """Check every shard on every host: placement, records, next_id() bodies, sampled IDs (strictly
    increasing, minted for the right shard, near the host clock), and its schema against the
    reference the migration files define. Touches nothing but the ID sequences, a temporary function
    of verify's own session, the scratch database each host builds its reference in (dropped
    again), and the reference kept in that host's ``shardctl.meta`` for the next run.

    A few set-based queries per host (docs/performance.md, Fleet-wide reads). Bodies: every
    shard's body, with its shard number and schema name taken out, must match the template
    rendered for ``body_samples`` shards per host; a shard that does not is rendered and compared
    in full. IDs: minted and checked on ``id_shards`` shards per host spread over its range, and
    on every shard whose body differs or whose sequence is missing.
    ``full`` renders and compares every body and checks every shard's IDs (slower: ~0.3 ms of client
    CPU and up to ~0.5 ms of server CPU per shard), and lists every object a shard differs in.

    ``schemas``: compare every shard's catalog fingerprint with the reference at the shard's ledger
    version (``compare_with_reference``); False leaves it out (bench/verify.py measures what it
    costs)."""
    if samples < 2:
        raise BadInput("--samples must be at least 2 (strict increase needs two IDs)")
    started = time.perf_counter()
    migrations = for_topology(topo)  # a bad file is bad input (exit 2) before any connection
    host_level = host_for_topology(topo)
    # One truth (ops.health): hosts that cannot be read, and shards behind the fleet's version, are
    # reported as such; only the hosts whose shards are level are checked further.
    health = fleet_health(topo, hosts=hosts, connect_timeout=connect_timeout)

    @functools.cache  # two threads may render one body at once: the same text, kept once
    def expected_body(n: int) -> str:
        return next_id_body(render_next_id(topo, n))

    def build_on(host: Host) -> reference.Reference:
        return reference.build(
            topo,
            host,
            migrations,
            host_level,
            per_shard,
            shard=reference_shard,
            connect_timeout=connect_timeout,
        )

    def work(host: Host, result: HostResult[HostVerification]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="verify"
        ) as conn:
            check = _HostCheck(conn, topo, host, result.value, expected_body, tolerance_ms)
            check.connect_timeout = connect_timeout
            check.run(samples, full, body_samples, id_shards, per_shard if schemas else None)

    per_shard = per_shard_functions(topo) if schemas else fingerprint.NEXT_ID
    reference_shard = min((n for h in topo.hosts for n in h.shards), default=0)
    selected = [topo.host(name) for name in health.level_hosts()]
    # the first host's reference is built while every host's shards are read
    early = _Background(lambda: build_on(selected[0])) if schemas and selected else None
    reports = fan_out(selected, work, lambda h: HostVerification(h.name))
    groups, pending, notes = (
        _against_reference(
            topo,
            reports,
            selected,
            early,
            build_on,
            len(migrations),
            connect_timeout=connect_timeout,
            full=full,
            per_shard=per_shard,
        )
        if early is not None
        else ([], [], [])
    )
    reports += [
        HostResult(h.host, reachable=False, error=h.error, value=HostVerification(h.host))
        for h in health.hosts
        if not h.reachable
    ]
    layout = {"name": topo.layout.name, **topo.layout.limits()}
    return VerifyReport(
        reports,
        time.perf_counter() - started,
        samples,
        layout,
        full,
        groups,
        pending,
        len(migrations),
        notes,
        health,
    )


def _against_reference(
    topo: Topology,
    reports: list[HostResult],
    selected: list[Host],
    early: _Background,
    build_on: Callable[[Host], reference.Reference],
    latest: int,
    *,
    connect_timeout: int,
    full: bool,
    per_shard: tuple[str, ...],
) -> tuple[list[SchemaGroup], list[str], list[str]]:
    """Every shard read by ``reports`` compared with the reference of its server's major version (the
    first host's built meanwhile, ``early``): the schema groups, the pending lines, and what building
    the references met."""
    try:
        first: reference.Reference | None = early.result()
    except (ShardctlError, psycopg.Error):  # that host's report says why
        first = None
    majors = {r.host: _major(r.value.server_version) for r in reports if r.value.server_version}
    refs = reference.for_hosts(selected, majors, build_on, first)
    notes = [n for ref in {id(r): r for r in refs.values()}.values() for n in ref.notes]
    groups, pending = compare_with_reference(
        topo,
        reports,
        refs,
        latest,
        connect_timeout=connect_timeout,
        full=full,
        per_shard=per_shard,
    )
    return groups, pending, notes


def check_applied(
    topo: Topology,
    reports: list[HostResult],
    locks: db.FleetLocks,
    *,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """``init``'s and ``migrate``'s last step, over their lock connections: on every host where shards
    were created or migrated, each shard's schema is compared with the reference at its ledger
    version (as ``verify`` does). A host whose shards differ gets an error naming them, so the command
    fails (exit 1) instead of reporting success: a migration that skipped its work on some shards (a
    catalog lookup that found another schema's object) is caught before anyone relies on it. What
    cannot be proven there (no CREATEDB) is left to ``verify``."""
    changed = [
        r for r in reports if r.ok and r.value is not None and (r.value.created or r.value.migrated)
    ]
    if not changed:
        return
    found = schema_problems(
        topo, [r.host for r in changed], locks=locks, connect_timeout=connect_timeout
    )
    for r in changed:
        if r.host in found:
            r.error = found[r.host]


def schema_problems(
    topo: Topology,
    hosts: list[str],
    *,
    locks: db.FleetLocks | None = None,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
) -> dict[str, str]:
    """Host → one line naming its shards whose schema is not the reference's at their version
    (``locks``: the run's lock connections, used instead of new ones)."""
    migrations, host_level = for_topology(topo), host_for_topology(topo)
    per_shard = per_shard_functions(topo)
    ref_shard = min((n for h in topo.hosts for n in h.shards), default=0)

    def opened(host: Host):
        if locks is not None:
            return locks.use(host)
        return db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="schema check"
        )

    def build_on(host: Host) -> reference.Reference:
        with opened(host) as conn:
            return reference.build(
                topo,
                host,
                migrations,
                host_level,
                per_shard,
                shard=ref_shard,
                connect_timeout=connect_timeout,
                admin=conn,
            )

    majors: dict[str, int] = {}

    def work(host: Host, result: HostResult[HostVerification]) -> None:
        with opened(host) as conn:
            majors[host.name] = conn.info.server_version // 10000
            rows = shard_list(conn)
            mine = [n for n in host.shards if n in rows and rows[n].state == "active"]
            prints = fingerprint.fingerprints(conn, [topo.schema_name(n) for n in mine], per_shard)
        result.value.versions = {n: rows[n].version for n in mine}
        result.value.fingerprints = {
            n: prints[topo.schema_name(n)] for n in mine if topo.schema_name(n) in prints
        }

    chosen = [topo.host(h) for h in hosts]
    reports = fan_out(chosen, work, lambda h: HostVerification(h.name))
    refs = reference.for_hosts(chosen, majors, build_on)
    compare_with_reference(
        topo, reports, refs, len(migrations), connect_timeout=connect_timeout, per_shard=per_shard
    )
    out = {}
    for r in reports:
        wrong = [v for v in r.value.violations if v.shard is not None]
        if r.error:
            out[r.host] = f"the schema check after it could not run: {r.error}"
        elif wrong:
            out[r.host] = (
                f"{len(wrong)} shard(s) ({format_shards(v.shard for v in wrong)}) do not have the "
                f"schema the migrations define; first: shard {wrong[0].shard}: {wrong[0].reason} "
                f"(`shardctl verify --full` lists every difference)"
            )
    return out


def _major(server_version: str) -> int:
    """The major version of a ``server_version`` setting ("18.6", "9.6.24", "17.2 (Debian …)")."""
    return int(server_version.split(".")[0].split()[0])


class _Background:
    """``work()`` in a thread of its own (the reference is built while the host's shards are read);
    ``result()`` waits for it and returns its value or raises its exception."""

    def __init__(self, work: Callable[[], reference.Reference]):
        self._value: reference.Reference | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name="verify-reference", daemon=True)
        self._thread.start()

    def result(self) -> reference.Reference:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


SHOWN_DIFFERENCES = 3  # per shard in a violation (``--full``: all of them)


def per_shard_functions(topo: Topology) -> tuple[str, ...]:
    """``name/nargs`` of the template's re-deployable functions (``next_id/0`` and a project's own): their
    bodies may hold the shard number, so the fingerprint leaves them out (the template checks cover them)."""
    from .redeploy import template_functions

    return tuple(sorted({f.object for f in template_functions(topo, 0)} | set(fingerprint.NEXT_ID)))


# groups of shards that differ from the reference, explained object by object, biggest first
EXPLAINED_GROUPS = 32


def _version(v: int) -> str:
    return f"V{v:04d}"


def compare_with_reference(
    topo: Topology,
    reports: list[HostResult[HostVerification]],
    refs: dict[str, reference.Reference],
    latest: int,
    *,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    full: bool = False,
    per_shard: tuple[str, ...] = fingerprint.NEXT_ID,
) -> tuple[list[SchemaGroup], list[str]]:
    """Compare each shard's fingerprint with its host's reference at the shard's ledger version. Returns
    the groups (matching the reference first) and the pending lines (one per host and version: a host
    whose shards are behind is named once, not shard by shard). Every shard that differs gets a
    violation naming what differs and the migration that should have made it; a host whose reference
    could not be built gets one naming what was not proven."""
    owner: dict[int, HostResult[HostVerification]] = {}
    keyed: dict[tuple[str, int, bool], list[int]] = {}
    pending: list[str] = []
    for r in reports:
        ref = refs.get(r.host)
        found = r.value.fingerprints
        behind: dict[int, list[int]] = {}
        unproven: list[int] = []
        for n, fp in sorted(found.items()):
            owner[n] = r
            v = r.value.versions.get(n, 0)
            if v > latest:
                r.value.violations.append(
                    Violation(
                        r.host,
                        n,
                        topo.schema_name(n),
                        f"its ledger is at {_version(v)}, beyond the last migration file "
                        f"({_version(latest)}): run the matching shardctl release or restore the files",
                    )
                )
                continue
            if v < latest:
                behind.setdefault(v, []).append(n)
            if ref is None or v not in ref.prints:
                unproven.append(n)
                continue
            keyed.setdefault((fp, v, fp == ref.prints[v]), []).append(n)
        for v, shards in sorted(behind.items()):
            span = _version(v + 1) + (f"–{_version(latest)}" if latest > v + 1 else "")
            where = (
                r.host
                if len(shards) == len(found)
                else f"{r.host} ({len(shards)} of its {len(found)} shards: {format_shards(shards)})"
            )
            pending.append(f"{span} pending on {where}: run migrate")
        if unproven:
            why = (ref.error if ref is not None else None) or "no reference was built"
            r.value.violations.append(
                Violation(
                    r.host,
                    None,
                    None,
                    f"schemas of {len(unproven)} shard(s) ({format_shards(unproven)}) not proven to be "
                    f"what the migrations define: {why}",
                )
            )
    groups = sorted(
        (SchemaGroup(fp, shards, v, match) for (fp, v, match), shards in keyed.items()),
        key=lambda g: (not g.reference, -g.version if g.reference else -len(g.shards), g.shards[0]),
    )
    wrong = [g for g in groups if not g.reference]
    for rank, group in enumerate(wrong):
        _explain_group(topo, group, owner, refs, rank, len(wrong), connect_timeout, full, per_shard)
    return groups, pending


def _explain_group(
    topo: Topology,
    group: SchemaGroup,
    owner: dict[int, HostResult[HostVerification]],
    refs: dict[str, reference.Reference],
    rank: int,
    count: int,
    connect_timeout: int,
    full: bool,
    per_shard: tuple[str, ...],
) -> None:
    """Name what ``group`` lacks, has extra or has otherwise than the reference (read on one of its
    shards; each costs a query), and give each of its shards a violation saying so."""
    at = f"the reference built from the migrations at {_version(group.version)}"
    if rank >= EXPLAINED_GROUPS:
        detail = (
            f"schema differs from {at}; {count} groups of shards differ, only the first "
            f"{EXPLAINED_GROUPS} explained: compare it with `verify --hosts`"
        )
    else:
        group.sample = sample = group.shards[0]
        host = owner[sample]
        ref = refs[host.host]
        try:
            with db.connect(
                topo.host(host.host),
                autocommit=True,
                connect_timeout=connect_timeout,
                purpose="verify",
            ) as conn:
                mine = fingerprint.objects(conn, [topo.schema_name(sample)], per_shard)
            group.differences = fingerprint.differences(
                ref.objects[group.version],
                mine[topo.schema_name(sample)],
                limit=0 if full else 160,
                why=lambda key, case: ref.made_by(key, group.version, case),
            )
        # a host gone since: say so, keep the rest
        except (psycopg.Error, OSError, ShardctlError) as exc:
            group.differences = [f"(could not read the objects: {_first_line(str(exc))})"]
        shown = group.differences if full else group.differences[:SHOWN_DIFFERENCES]
        more = len(group.differences) - len(shown)
        detail = (
            "; ".join(shown) + (f"; and {more} more (verify --full lists them)" if more else "")
        ) or "same objects, different fingerprint"
        detail += f"; the schema differs from {at}"
    for n in group.shards:
        owner[n].value.violations.append(Violation(owner[n].host, n, topo.schema_name(n), detail))


class _HostCheck:
    """verify on one host: catalog, bodies and IDs, each one set-based query (or a few)."""

    def __init__(
        self,
        conn: psycopg.Connection,
        topo: Topology,
        host: Host,
        result: HostVerification,
        expected_body: Callable[[int], str],
        tolerance_ms: int,
    ):
        self.conn, self.topo, self.host, self.result = conn, topo, host, result
        self.expected_body = expected_body
        self.tolerance_ms = tolerance_ms
        self.connect_timeout = db.DEFAULT_CONNECT_TIMEOUT

    def second_connection(self) -> psycopg.Connection:
        """Another connection to the host (half of the fingerprints are computed on it)."""
        return db.connect(
            self.host, autocommit=True, connect_timeout=self.connect_timeout, purpose="verify"
        )

    def violation(self, shard: int | None, reason: str) -> None:
        schema = self.topo.schema_name(shard) if shard is not None else None
        self.result.violations.append(Violation(self.host.name, shard, schema, reason))

    def run(
        self,
        samples: int,
        full: bool,
        body_samples: int,
        id_shards: int,
        per_shard: tuple[str, ...] | None = fingerprint.NEXT_ID,
    ) -> None:
        """``per_shard``: the functions whose bodies the fingerprint leaves out; None: no fingerprints."""
        checkable = self.placement()
        if not checkable:
            return
        if per_shard is not None:  # kept on the host while no DDL commits there (as status's)
            found = fingerprint.kept(
                self.conn, self.topo, set(checkable), per_shard, self.second_connection, full
            )
            mine = set(checkable)
            self.result.fingerprints = {
                n: fp for fp, shards in found.items() for n in shards if n in mine
            }
        bodies_ok, suspect = self.bodies(checkable, full, body_samples)
        if not full:
            chosen = set(_spread(checkable, id_shards)) | suspect
            checkable = [n for n in checkable if n in chosen]
        self.ids([n for n in checkable if bodies_ok.get(n, True)], samples)

    def placement(self) -> list[int]:
        """Clock, server version, shard schemas present vs expected vs recorded. Returns the shards to
        check further (expected, present)."""
        topo, result = self.topo, self.result
        before = time.time()
        version, server_now, has_control, schemas = self.conn.execute(
            queries.VERIFY_HOST_SQL
        ).fetchone()
        after = time.time()
        result.server_version = version
        result.clock_skew_ms = round((server_now - (before + after) / 2) * 1000, 1)
        if abs(result.clock_skew_ms) > self.tolerance_ms:
            self.violation(
                None,
                f"host clock is {result.clock_skew_ms:+.0f} ms off this machine's "
                f"(tolerance {self.tolerance_ms} ms)",
            )
        # Any name the schema format yields, within the layout's shard bits, is a shard schema.
        present = {topo.shard_of_schema(s) for s in schemas} - {None}
        expected = set(self.host.shards)
        recorded: set[int] = set()
        if has_control:
            rows = {n: r for n, r in shard_list(self.conn).items() if r.state == "active"}
            recorded = set(rows)
            result.versions = {n: r.version for n, r in rows.items()}
        else:
            self.violation(None, "no shardctl control schema (run `shardctl init`)")
        for n in sorted(expected - present):
            self.violation(n, "shard schema is missing")
        for n in sorted(present - expected):
            owner = next((h.name for h in topo.hosts if n in h.shards), None)
            where = f"it belongs to {owner}" if owner else "it is not in the topology"
            if n in recorded:
                self.violation(n, f"unexpected shard schema on this host ({where})")
            else:
                self.violation(
                    n, f"unexpected shard schema on this host, not recorded by shardctl ({where})"
                )
        for n in sorted((expected & present) - recorded):
            self.violation(
                n,
                "schema exists but shardctl has no record of creating it (half-built or created by hand)",
            )
        return sorted(expected & present)

    def bodies(
        self, shards: list[int], full: bool, body_samples: int
    ) -> tuple[dict[int, bool], set[int]]:
        """Compare next_id() bodies with the template. Returns shard → whether its IDs can be sampled
        (False: no next_id() at all), and the shards whose body or sequence is off (their IDs are
        always checked)."""
        schema = self.topo.schema_name
        suspect: set[int] = set()
        if full:
            compare = shards
        else:
            picks = _spread(shards, body_samples)
            expected = [self.expected_body(n) for n in picks]
            shapes, known, no_sequence = queries.next_id_shapes(
                self.conn,
                [schema(n) for n in shards],
                shards,
                expected=(expected, [schema(n) for n in picks], picks),
            )
            compare = sorted(
                n for shape, members in shapes.items() if shape not in known for n in members
            )
            suspect = set(compare) | set(no_sequence)
        found = queries.next_id_bodies(self.conn, [schema(n) for n in compare])
        usable: dict[int, bool] = {}
        for n in compare:
            body = found.get(schema(n))
            if body is None:
                self.violation(n, "next_id() is missing")
                usable[n] = False
            elif body != self.expected_body(n):
                self.violation(
                    n, "next_id() differs from the template's rendering (changed by hand or stale)"
                )
        return usable, suspect

    def ids(self, shards: list[int], samples: int) -> None:
        """Mint ``samples`` IDs on every shard (one query per host) and check them."""
        schema = self.topo.schema_name
        self.sequences(shards)
        rows = queries.sample_next_ids(self.conn, [schema(n) for n in shards], shards, samples)
        for shard, ids, at_ms, error in rows:
            if error is not None:
                self.violation(shard, f"next_id() fails: {_first_line(error)}")
                continue
            self.check_ids(shard, ids, at_ms)

    def check_ids(self, shard: int, ids: list[int], at_ms: int) -> None:
        """What the layout promises (ids/checks.py): unique, ordered across milliseconds (a wrap within
        one millisecond is fine), this shard's bits, a time near the host clock."""
        self.result.shards_checked += 1
        self.result.ids_checked += len(ids)
        for problem in id_checks.sample_problems(
            self.topo.layout, shard, ids, at_ms, self.tolerance_ms
        ):
            self.violation(shard, problem)

    def sequences(self, shards: list[int]) -> None:
        """Each shard's ID sequence keeps CACHE 1 and INCREMENT BY 1 (see ids/checks.py).

        A shard without ``next_id_seq`` (a project's own templates may name it otherwise) is left
        to the samples: a next_id() that cannot run fails there.
        """
        settings = queries.id_sequence_settings(
            self.conn, [self.topo.schema_name(n) for n in shards]
        )
        for n in shards:
            for problem in id_checks.sequence_problems(settings.get(self.topo.schema_name(n), {})):
                self.violation(n, problem)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in mask(text).splitlines() if ln.strip()]
    return lines[0] if lines else "error"


def _spread(items: list[int], k: int) -> list[int]:
    """``k`` items spread evenly over ``items`` (first and last included)."""
    if len(items) <= k:
        return list(items)
    step = (len(items) - 1) / max(1, k - 1)
    return sorted({items[round(i * step)] for i in range(k)})
