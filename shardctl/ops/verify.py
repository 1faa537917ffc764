"""``verify``: prove every shard's IDs are right, its function is the template's, and placement matches."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg

from ..engine import connections as db
from ..engine.fanout import HostResult, fan_out, raise_for_status, select_hosts
from ..errors import BadInput
from ..ids import checks as id_checks
from ..sql import catalog
from ..sql.catalog import control_exists
from ..model.identifiers import quote_ident
from ..sql.render import next_id_body, render_next_id
from ..model.topology import Host, Topology

DEFAULT_SAMPLES = 16
DEFAULT_TOLERANCE_MS = 5000
SAMPLE_BATCH = 256


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

    def to_dict(self) -> dict:
        return {"shards_checked": self.shards_checked, "ids_checked": self.ids_checked,
                "clock_skew_ms": self.clock_skew_ms, "server_version": self.server_version,
                "violations": len(self.violations)}


@dataclass
class VerifyReport:
    hosts: list[HostResult[HostVerification]]
    seconds: float
    samples: int
    layout: dict

    @property
    def violations(self) -> list[Violation]:
        return [v for h in self.hosts for v in h.value.violations]

    @property
    def ok(self) -> bool:
        return not self.violations and all(h.reachable and not h.error for h in self.hosts)

    def to_dict(self) -> dict:
        return {
            "command": "verify", "ok": self.ok, "seconds": round(self.seconds, 3), "samples": self.samples,
            "layout": self.layout,
            "hosts": [h.to_dict() for h in self.hosts],
            "violations": [v.__dict__ for v in self.violations],
        }

    def raise_for_status(self) -> "VerifyReport":
        """Exit 3 for an unreachable host, 1 for a violation or a host that could not be checked."""
        first = self.violations[0] if self.violations else None
        problems = [f"{len(self.violations)} violation(s); first: {first.host} shard {first.shard}: "
                    f"{first.reason}"] if first else []
        raise_for_status("verify", self.hosts, problems, report=self.to_dict())
        return self


def verify(topo: Topology, *, hosts: list[str] | None = None, samples: int = DEFAULT_SAMPLES,
           tolerance_ms: int = DEFAULT_TOLERANCE_MS, connect_timeout: int = db.DEFAULT_CONNECT_TIMEOUT) -> VerifyReport:
    """Check every shard on every host: placement, records, next_id() bodies, and sampled IDs (strictly
    increasing, minted for the right shard, near the host clock). Touches nothing but the ID sequences."""
    if samples < 2:
        raise BadInput("--samples must be at least 2 (strict increase needs two IDs)")
    started = time.perf_counter()
    expected_bodies: dict[int, str] = {}

    def expected_body(n: int) -> str:
        if n not in expected_bodies:
            expected_bodies[n] = next_id_body(render_next_id(topo, n))
        return expected_bodies[n]

    def work(host: Host, result: HostResult[HostVerification]) -> None:
        with db.connect(host, autocommit=True, connect_timeout=connect_timeout, purpose="verify") as conn:
            _check_host(conn, topo, host, result.value, expected_body, samples, tolerance_ms)

    reports = fan_out(select_hosts(topo, hosts), work, lambda h: HostVerification(h.name))
    layout = {"name": topo.layout.name, **topo.layout.limits()}
    return VerifyReport(reports, time.perf_counter() - started, samples, layout)


def _check_host(conn: psycopg.Connection, topo: Topology, host: Host, result: HostVerification,
                expected_body, samples: int, tolerance_ms: int) -> None:
    def violation(shard: int | None, reason: str) -> None:
        schema = topo.schema_name(shard) if shard is not None else None
        result.violations.append(Violation(host.name, shard, schema, reason))

    result.server_version = conn.execute("SHOW server_version").fetchone()[0]
    before = time.time()
    server_now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    after = time.time()
    result.clock_skew_ms = round((server_now - (before + after) / 2) * 1000, 1)
    if abs(result.clock_skew_ms) > tolerance_ms:
        violation(None, f"host clock is {result.clock_skew_ms:+.0f} ms off this machine's "
                        f"(tolerance {tolerance_ms} ms)")

    schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
    # Any name the schema format yields, within the layout's shard bits, is a shard schema.
    present = {topo.shard_of_schema(s) for s in schemas} - {None}
    expected = set(host.shards)
    recorded: set[int] = set()
    if control_exists(conn):
        recorded = {r[0] for r in conn.execute(
            "SELECT shard_id FROM shardctl.shards WHERE state = 'active'").fetchall()}
    else:
        violation(None, "no shardctl control schema (run `shardctl init`)")
    for n in sorted(expected - present):
        violation(n, "shard schema is missing")
    for n in sorted(present - expected):
        owner = next((h.name for h in topo.hosts if n in h.shards), None)
        where = f"it belongs to {owner}" if owner else "it is not in the topology"
        if n in recorded:
            violation(n, f"unexpected shard schema on this host ({where})")
        else:
            violation(n, f"unexpected shard schema on this host, not recorded by shardctl ({where})")
    for n in sorted((expected & present) - recorded):
        violation(n, "schema exists but shardctl has no record of creating it (half-built or created by hand)")

    functions = dict(conn.execute(
        """SELECT n.nspname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE p.proname = 'next_id' AND p.pronargs = 0""").fetchall())
    checkable = []
    for n in sorted(expected & present):
        schema = topo.schema_name(n)
        body = functions.get(schema)
        if body is None:
            violation(n, "next_id() is missing")
            continue
        if body != expected_body(n):
            violation(n, "next_id() differs from the template's rendering (changed by hand or stale)")
        checkable.append(n)

    _check_sequences(conn, topo, checkable, violation)
    for i in range(0, len(checkable), SAMPLE_BATCH):
        _sample(conn, topo, checkable[i:i + SAMPLE_BATCH], samples, tolerance_ms, result, violation)


def _sample(conn: psycopg.Connection, topo: Topology, shards: list[int], samples: int, tolerance_ms: int,
            result: HostVerification, violation) -> None:
    parts = []
    for n in shards:
        fn = f"{quote_ident(topo.schema_name(n))}.next_id"
        parts.append(f"SELECT {int(n)} AS shard, (SELECT array_agg({fn}() ORDER BY g) "
                     f"FROM generate_series(1, {int(samples)}) AS g) AS ids, "
                     f"(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS at_ms")
    try:
        rows = conn.execute("\nUNION ALL\n".join(parts)).fetchall()
    except psycopg.Error:
        rows = []
        for n in shards:  # find the shard(s) whose next_id() fails
            fn = f"{quote_ident(topo.schema_name(n))}.next_id"
            try:
                rows.append(conn.execute(
                    f"SELECT {int(n)}, (SELECT array_agg({fn}() ORDER BY g) FROM generate_series(1, {int(samples)}) g), "
                    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone())
            except psycopg.Error as exc:
                violation(n, f"next_id() fails: {db.first_line(exc)}")
    for shard, ids, at_ms in rows:
        result.shards_checked += 1
        result.ids_checked += len(ids)
        # What the layout promises (ids/checks.py): unique, ordered across milliseconds (a wrap
        # within one millisecond is fine), this shard's bits, a time near the host clock.
        for problem in id_checks.sample_problems(topo.layout, shard, ids, at_ms, tolerance_ms):
            violation(shard, problem)


def _check_sequences(conn: psycopg.Connection, topo: Topology, shards: list[int], violation) -> None:
    """Each shard's ID sequence keeps CACHE 1 and INCREMENT BY 1 (see ids/checks.py)."""
    settings = catalog.id_sequence_settings(conn, [topo.schema_name(n) for n in shards])
    for n in shards:
        found = settings.get(topo.schema_name(n))
        if found is None:
            violation(n, "ID sequence next_id_seq is missing")
            continue
        for problem in id_checks.sequence_problems(found):
            violation(n, problem)

