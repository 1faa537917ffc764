"""``verify``: prove every shard's IDs are right, its function is the template's, and placement matches."""

from __future__ import annotations

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
from ..sql.render import next_id_body, render_next_id
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

    def to_dict(self) -> dict:
        # the host is its HostResult's; the violations are listed once, in the report
        return result_doc(self, omit=("host", "fingerprints"), violations=len(self.violations))


@dataclass
class SchemaGroup:
    """Shards whose catalogs have one fingerprint; ``differences`` name what differs from the majority's
    (empty for the majority itself), as read on ``sample`` against ``reference``."""

    fingerprint: str
    shards: list[int]
    majority: bool = False
    sample: int | None = None
    reference: int | None = None
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return result_doc(self, count=len(self.shards), shards=format_shards(self.shards))


@dataclass
class VerifyReport(Result):
    """The result of :func:`verify`: each host's findings, the ``samples`` IDs checked per shard, the
    ID ``layout``, and the shards grouped by catalog (``schemas``); ``violations`` lists them all."""

    command = "verify"

    hosts: list[HostResult[HostVerification]]
    seconds: float
    samples: int
    layout: dict
    full: bool = False
    schemas: list[SchemaGroup] = field(default_factory=list)  # majority first
    health: FleetHealth | None = None  # ops.health: what status, plan and migrate --check say too

    @property
    def violations(self) -> list[Violation]:
        return [v for h in self.hosts for v in h.value.violations]

    @property
    def ok(self) -> bool:
        healthy = self.health is None or self.health.ok
        return healthy and not self.violations and all(h.ok for h in self.hosts)

    def to_dict(self) -> dict:
        return {
            **super().to_dict(),
            "distinct_schemas": len(self.schemas),
            "violations": json_value(self.violations),
        }

    def raise_for_status(self) -> VerifyReport:
        """The fleet's health first (``ops.health``: exit 3 for a host that cannot be reached or cannot
        authenticate, 4 for shards missing, failed or lagging), then 1 for a violation or a host that
        could not be checked."""
        if self.health is not None:
            self.health.raise_for("verify", self.to_dict())
        first = self.violations[0] if self.violations else None
        problems = (
            [
                (
                    f"{len(self.violations)} violation(s); first: {first.host} shard {first.shard}: "
                    f"{first.reason}"
                )
            ]
            if first
            else []
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
    """Check every shard on every host: placement, records, next_id() bodies, and sampled IDs (strictly
    increasing, minted for the right shard, near the host clock). Touches nothing but the ID sequences
    (and a temporary function of verify's own session).

    A few set-based queries per host (docs/performance.md, Fleet-wide reads). Bodies: every
    shard's body, with its shard number and schema name taken out, must match the template
    rendered for ``body_samples`` shards per host; a shard that does not is rendered and compared
    in full. IDs: minted and checked on ``id_shards`` shards per host spread over its range, and
    on every shard whose body differs or whose sequence is missing.
    ``full`` renders and compares every body and checks every shard's IDs (slower: ~0.3 ms of client
    CPU and up to ~0.5 ms of server CPU per shard).

    ``schemas``: compare every shard's catalog fingerprint across the hosts (``compare_schemas``); False
    leaves it out (bench/verify.py measures what it costs)."""
    if samples < 2:
        raise BadInput("--samples must be at least 2 (strict increase needs two IDs)")
    started = time.perf_counter()
    # One truth (ops.health): hosts that cannot be read, and shards behind the fleet's version, are
    # reported as such; only the hosts whose shards are level are checked further.
    health = fleet_health(topo, hosts=hosts, connect_timeout=connect_timeout)
    expected_bodies: dict[int, str] = {}
    lock = threading.Lock()

    def expected_body(n: int) -> str:
        with lock:
            if n not in expected_bodies:
                expected_bodies[n] = next_id_body(render_next_id(topo, n))
            return expected_bodies[n]

    def work(host: Host, result: HostResult[HostVerification]) -> None:
        with db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="verify"
        ) as conn:
            check = _HostCheck(conn, topo, host, result.value, expected_body, tolerance_ms)
            check.run(samples, full, body_samples, id_shards, per_shard if schemas else None)

    per_shard = per_shard_functions(topo) if schemas else fingerprint.NEXT_ID
    level = [topo.host(name) for name in health.level_hosts()]
    reports = fan_out(level, work, lambda h: HostVerification(h.name))
    reports += [
        HostResult(h.host, reachable=False, error=h.error, value=HostVerification(h.host))
        for h in health.hosts
        if not h.reachable
    ]
    groups = compare_schemas(
        topo, reports, connect_timeout=connect_timeout, full=full, per_shard=per_shard
    )
    layout = {"name": topo.layout.name, **topo.layout.limits()}
    return VerifyReport(
        reports, time.perf_counter() - started, samples, layout, full, groups, health
    )


SHOWN_DIFFERENCES = 3  # per shard in a violation (``--full``: all of them)


def per_shard_functions(topo: Topology) -> tuple[str, ...]:
    """``name/nargs`` of the template's re-deployable functions (``next_id/0`` and a project's own): their
    bodies may hold the shard number, so the fingerprint leaves them out (the template checks cover them)."""
    from .redeploy import template_functions

    return tuple(sorted({f.object for f in template_functions(topo, 0)} | set(fingerprint.NEXT_ID)))


# fingerprints (other than the majority's) explained object by object, biggest first
EXPLAINED_GROUPS = 32


def schema_groups(found: dict[int, str]) -> list[SchemaGroup]:
    """Shards by fingerprint, the majority first (a tie goes to the group with the lowest shard)."""
    by_fp: dict[str, list[int]] = {}
    for shard, fp in sorted(found.items()):
        by_fp.setdefault(fp, []).append(shard)
    groups = sorted(
        (SchemaGroup(fp, shards) for fp, shards in by_fp.items()),
        key=lambda g: (-len(g.shards), g.shards[0]),
    )
    if groups:
        groups[0].majority = True
    return groups


def compare_schemas(
    topo: Topology,
    reports: list[HostResult[HostVerification]],
    *,
    connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT,
    full: bool = False,
    per_shard: tuple[str, ...] = fingerprint.NEXT_ID,
) -> list[SchemaGroup]:
    """Compare the shards' fingerprints across the hosts checked. Each group that is not the majority's
    is explained once: one of its shards' objects against a majority shard's (on the same host when
    there is one), and every shard in the group gets a violation naming the difference."""
    owner = {n: r for r in reports for n in r.value.fingerprints}
    groups = schema_groups({n: fp for r in reports for n, fp in r.value.fingerprints.items()})
    if len(groups) < 2:
        return groups
    majority = groups[0]
    for rank, group in enumerate(groups[1:]):
        # each costs a query or two: name the shards, not the difference
        if rank >= EXPLAINED_GROUPS:
            for n in group.shards:
                owner[n].value.violations.append(
                    Violation(
                        owner[n].host,
                        n,
                        topo.schema_name(n),
                        f"schema differs from the majority's ({len(majority.shards)} shards, e.g. shard "
                        f"{majority.shards[0]}); {len(groups) - 1} other schemas, only the first {EXPLAINED_GROUPS} "
                        f"explained: compare it with `verify --hosts`",
                    )
                )
            continue
        sample = group.shards[0]
        host = owner[sample]
        near = [n for n in majority.shards if owner[n] is host]
        reference = near[0] if near else majority.shards[0]
        group.sample, group.reference = sample, reference
        try:
            group.differences = _explain(
                topo,
                host.host,
                sample,
                owner[reference].host,
                reference,
                connect_timeout,
                full,
                per_shard,
            )
        # a host gone since: say so, keep the rest
        except (psycopg.Error, OSError, ShardctlError) as exc:
            group.differences = [f"(could not read the objects: {_first_line(str(exc))})"]
        shown = group.differences if full else group.differences[:SHOWN_DIFFERENCES]
        more = len(group.differences) - len(shown)
        detail = "; ".join(shown) + (
            f"; and {more} more (verify --full lists them)" if more else ""
        )
        for n in group.shards:
            owner[n].value.violations.append(
                Violation(
                    owner[n].host,
                    n,
                    topo.schema_name(n),
                    (detail or "same objects, different fingerprint")
                    + f" (schema differs from the majority's: {len(majority.shards)} shards, e.g. shard {reference})",
                )
            )
    return groups


def _explain(
    topo: Topology,
    host: str,
    shard: int,
    ref_host: str,
    reference: int,
    connect_timeout: int,
    full: bool,
    per_shard: tuple[str, ...],
) -> list[str]:
    mine, theirs = topo.schema_name(shard), topo.schema_name(reference)
    with db.connect(
        topo.host(host), autocommit=True, connect_timeout=connect_timeout, purpose="verify"
    ) as conn:
        found = fingerprint.objects(
            conn, [mine] + ([theirs] if ref_host == host else []), per_shard
        )
    if ref_host != host:
        with db.connect(
            topo.host(ref_host), autocommit=True, connect_timeout=connect_timeout, purpose="verify"
        ) as conn:
            found.update(fingerprint.objects(conn, [theirs], per_shard))
    return fingerprint.differences(found[theirs], found[mine], limit=0 if full else 160)


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
        if per_shard is not None:
            schema = self.topo.schema_name
            found = fingerprint.fingerprints(self.conn, [schema(n) for n in checkable], per_shard)
            self.result.fingerprints = {
                n: found[schema(n)] for n in checkable if schema(n) in found
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
            recorded = queries.active_shard_ids(self.conn)
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
