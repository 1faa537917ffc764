"""``shardctl adopt verify``: before the switch, outside any freeze, each shard's rows compared with the
rows of its keys in the old database (the source), and the app's own reads run on both.

Each sharded table is split into chunks by ranges of its ID column (its key where it has none),
recorded on the source in ``shardctl_adopt.verify_chunks`` before the first is checked. A chunk is
checked as the move's ``--verify-before full`` checks a table (``data.checksum_rows``, by
``transfer.at_lag_zero``): on the source, one snapshot, the chunk's row count and checksum per
``key % modulus``; on every host, once the subscriptions ``shardctl_adopt_<host>_<tag>`` have applied the
source's WAL up to past that snapshot, the same per shard, with the rows whose key belongs to another
shard. A shard that differs is checked again: while the app writes it may differ because its rows were
written meanwhile (the source's figures changed: "busy", left to the cutover's own check); one that
differs in two more rounds while the source stays unchanged, or at all when nothing replicates (no
such slot on the source), is a problem named precisely: table, shard, range, the counts on both sides
and the first rows that differ. Each chunk's result is recorded as it is known, so a run killed midway
and run again checks only the chunks not recorded. Dark reads: :mod:`.dark_reads`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ...engine import connections as db
from ...engine.defaults import DEFAULT_CONNECT_TIMEOUT
from ...errors import BadInput, OperationFailed, WaitTimeout, first_few
from ...model.documents import Result
from ...model.topology import Topology
from ...sql.catalog import adopt_copy as copy_catalog
from ...sql.catalog import adopt_verify as state
from ...sql.catalog import data
from ..move import transfer
from ..move.run import checkpoint
from .dark_reads import DarkRead, run_dark_reads
from .keys import SHARDED
from .plan import read_plan, source_host
from .state import load_run

CHUNK_ROWS = 100_000  # source rows per chunk (by the table's estimate)
ROUNDS = 3  # a differing shard is checked up to this many times in all
DRILL_ROWS = 50_000  # rows per side read to name the rows of a shard that differs
NAMED_ROWS = 5  # rows named per problem
LAG_TIMEOUT = 30.0


@dataclass
class Problem:
    """A difference that stayed while the source did not change: what and where, precisely."""

    table: str
    shard: int | None
    host: str | None
    column: str | None
    lo: int | None
    hi: int | None
    source_rows: int
    shard_rows: int
    rows: list[str] = field(default_factory=list)  # the first rows that differ, each said
    message: str = ""


@dataclass
class AdoptVerifyResult(Result):
    command = "adopt verify"

    source: str  # the DSN, masked
    run: int  # the run's id in shardctl_adopt.verify_runs
    resumed: bool  # an interrupted run continued
    replicating: bool  # the copy's subscriptions exist: differences are re-checked at lag 0
    tables: list[str] = field(default_factory=list)
    chunks: int = 0
    checked: int = 0  # chunks checked by this invocation
    recorded: int = 0  # chunks an earlier, interrupted invocation had recorded
    busy: int = 0  # chunks being written throughout (the cutover's own check compares them)
    source_rows: int = 0
    fleet_rows: int = 0
    problems: list[Problem] = field(default_factory=list)
    dark_reads: list[DarkRead] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and not any(d.status == "differs" for d in self.dark_reads)

    def raise_for_status(self) -> AdoptVerifyResult:
        """OperationFailed (exit 1) naming the first problems, when there are any."""
        if self.problems:
            raise OperationFailed(
                f"adopt verify: {len(self.problems)} difference(s) between the source and the "
                f"fleet: {first_few(self.problems, 2, lambda p: p.message)}",
                report=self.to_dict(),
            )
        differs = [d for d in self.dark_reads if d.status == "differs"]
        if differs:
            raise OperationFailed(
                f"adopt verify: {len(differs)} dark read(s) differ: "
                f"{first_few(differs, 1, lambda d: d.detail)}",
                report=self.to_dict(),
            )
        return self


@dataclass(frozen=True)
class Table:
    """A table as the check reads it: its key (None: a global table, whole on the global host), the
    column its chunks split (a global table's first column, which names its rows), its columns."""

    name: str
    key: str | None
    column: str
    columns: tuple[tuple[str, bool], ...]
    nullable_key: bool


@dataclass(frozen=True)
class Chunk:
    number: int
    table: str
    column: str | None
    lo: int | None
    hi: int | None


def say_range(column: str | None, lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return "all rows"
    if lo is None:
        return f"{column} < {hi}"
    if hi is None:
        return f"{column} >= {lo}"
    return f"{column} [{lo}, {hi})"


def split(low: int | None, high: int | None, rows: int, per_chunk: int) -> list[tuple]:
    """(lo, hi) ranges covering every value: open at both ends, so rows written later fall in one."""
    if low is None or high is None:
        return [(None, None)]
    count = max(1, min(math.ceil(rows / max(1, per_chunk)), high - low + 1))
    step = math.ceil((high - low + 1) / count)
    edges = [low + step * i for i in range(1, count)]
    return list(zip([None, *edges], [*edges, None]))


def adopt_verify(
    topo: Topology,
    dsn: str,
    plan_file: Path,
    *,
    dark_reads: int = 10,
    chunk_rows: int = CHUNK_ROWS,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
) -> AdoptVerifyResult:
    """Compare every shard's rows with the source's rows of its keys (chunked, resumable, at lag 0
    while the copy replicates), then run ``dark_reads`` sampled reads of each of the app's
    single-shard statements on both (0: none). ``progress``: a bar factory ``(label, total) -> tick``."""
    started = time.perf_counter()
    if chunk_rows < 1 or dark_reads < 0:
        raise BadInput("--chunk-rows must be at least 1 and --dark-reads at least 0")
    doc = read_plan(Path(plan_file))
    _check_plan(doc, Path(plan_file))
    host = source_host(dsn)
    check = Check(topo, doc, host, connect_timeout)
    try:
        result = check.run(chunk_rows, progress)
        if dark_reads:
            result.dark_reads = run_dark_reads(
                topo, doc, check.src, dark_reads, connect_timeout, progress, check.settle()
            )
        result.seconds = time.perf_counter() - started
        check.finish(result)
    finally:
        check.close()
    return result


def _check_plan(doc: dict[str, Any], path: Path) -> None:
    """BadInput for a plan the check cannot follow: blockers left, a sharded table without its key."""
    if doc["blockers"]:
        raise BadInput(
            f"--plan {path} lists {len(doc['blockers'])} blocker(s): fix them, plan again, and "
            f"copy before verifying"
        )
    for t in doc["tables"]:
        if t["kind"] in SHARDED and not t.get("key"):
            raise BadInput(f"--plan {path}: table {t['name']} has no key column; plan again")


def _id_floor(topo: Topology, src: psycopg.Connection) -> int | None:
    """The ID floor the fleet places ID-valued keys by: the topology's adoption's (the Router's),
    else the copy's run's on the source; None (every key an old ID: ``key % modulus``) without."""
    if topo.adoption is not None:
        return topo.adoption.id_floor
    run = load_run(src)
    return None if run is None else run.detail.get("id_floor")


class Check:
    """One verify run: the source's connection (state and reads), one connection per fleet host."""

    def __init__(self, topo: Topology, doc: dict[str, Any], host: Any, connect_timeout: int):
        self.topo, self.doc, self.schema = topo, doc, doc["schema"]
        self.modulus = topo.modulus
        self.masked = host.masked_dsn
        self.conns: dict[str, psycopg.Connection] = {}
        self.src = db.connect(
            host, autocommit=True, connect_timeout=connect_timeout, purpose="adopt verify"
        )
        try:
            self.global_host = doc.get("global_host") or topo.global_host or topo.hosts[0].name
            for h in topo.hosts:
                if h.shards or h.name == self.global_host:
                    self.conns[h.name] = db.connect(
                        h, autocommit=True, connect_timeout=connect_timeout, purpose="adopt verify"
                    )
            for conn in [self.src, *self.conns.values()]:
                data.pin_text_settings(conn)
        except BaseException:
            self.close()
            raise
        self.slots = state.copy_slots(self.src)
        self.id_floor = _id_floor(topo, self.src)

    def shard_of(self, key: str) -> str:
        """A row's shard by its key as SQL: the Router's rule (``adopt_copy.key_shard``, as the copy's
        row filters and partitions place rows) with the ID floor; plain ``key % modulus`` without."""
        if self.id_floor is None:
            return ""
        rule = copy_catalog.key_shard(key, self.modulus, self.topo.layout, self.id_floor)
        return rule.as_string(self.src)

    def close(self) -> None:
        for conn in [getattr(self, "src", None), *self.conns.values()]:
            if conn is not None:
                conn.close()

    def tables(self) -> list[Table]:
        out = []
        for t in self.doc["tables"]:
            if t["kind"] not in (*SHARDED, "global"):
                continue
            try:
                cols = state.columns(self.src, self.schema, t["name"])
            except psycopg.errors.UndefinedTable:
                raise BadInput(
                    f"--plan names table {self.schema}.{t['name']}, which the source does not "
                    f"have; plan again"
                ) from None
            nullable = any(n == t["key"] and not notnull for n, _, notnull in cols)
            out.append(
                Table(
                    t["name"],
                    t["key"] if t["kind"] != "global" else None,
                    t.get("id_column") or t["key"] or cols[0][0],
                    tuple((n, text) for n, text, _ in cols),
                    nullable,
                )
            )
        return out

    def fingerprint(self, tables: list[Table], chunk_rows: int) -> str:
        owners = {h.name: h.shards for h in self.topo.hosts}
        what = [self.schema, self.modulus, owners, chunk_rows, [t.__dict__ for t in tables]]
        what.append(self.id_floor)
        return hashlib.sha256(json.dumps(what, default=list).encode()).hexdigest()[:16]

    def plan_chunks(self, tables: list[Table], chunk_rows: int) -> list[tuple]:
        out = []
        for t in tables:
            if t.key is None:  # a global table: one chunk
                out.append((t.name, t.column, None, None))
                continue
            low, high, rows = state.bounds(self.src, self.schema, t.name, t.column)
            out += [(t.name, t.column, lo, hi) for lo, hi in split(low, high, rows, chunk_rows)]
        return out

    def run(
        self, chunk_rows: int, progress: Callable[[str, int], Callable[[int], None]] | None
    ) -> AdoptVerifyResult:
        tables = self.tables()
        if not state.ensure_state(self.src):
            raise OperationFailed(
                f"adopt verify: another adopt verify is running on {self.masked}; wait for it "
                f"to finish"
            )
        fingerprint = self.fingerprint(tables, chunk_rows)
        run_id = state.unfinished_run(self.src, fingerprint)
        resumed = run_id is not None
        if run_id is None:
            run_id = state.new_run(self.src, fingerprint, self.plan_chunks(tables, chunk_rows))
        recorded = state.chunks(self.src, run_id)
        result = AdoptVerifyResult(
            self.masked, run_id, resumed, bool(self.slots), [t.name for t in tables]
        )
        result.chunks = len(recorded)
        by_name = {t.name: t for t in tables}
        for t in tables:
            if t.key and t.nullable_key:
                n = state.null_keys(self.src, self.schema, t.name, t.key)
                result.problems += [_no_key(t, n)] if n else []
        tick = progress("chunks", len(recorded)) if progress else None
        for row in recorded:
            chunk = Chunk(*row[:5])
            if row[5] != "pending":
                result.recorded += 1
                status, counts, problems = row[5], (row[7] or 0, row[8] or 0), row[9]
            else:
                status, rounds, counts, problems = self.check_chunk(by_name[chunk.table], chunk)
                state.record_chunk(self.src, run_id, chunk.number, status, rounds, counts, problems)
                result.checked += 1
                checkpoint("adopt-verify-chunk")
            result.busy += status == "busy"
            result.source_rows += counts[0]
            result.fleet_rows += counts[1]
            result.problems += [Problem(**p) for p in problems]
            if tick:
                tick(1)
        return result

    def finish(self, result: AdoptVerifyResult) -> None:
        """The run is complete: its summary (what ``adopt status`` shows) recorded on the source."""
        summary = {
            "ok": result.ok,
            "chunks": result.chunks,
            "busy": result.busy,
            "source_rows": result.source_rows,
            "fleet_rows": result.fleet_rows,
            "problems": [p.message for p in result.problems[:5]],
            "dark_reads": dict(Counter(d.status for d in result.dark_reads)),
            "seconds": round(result.seconds, 3),
        }
        state.finish_run(self.src, result.run, summary)

    def settle(self) -> Any:
        """``(read_source, read_fleet) -> (source's, fleet's)`` at lag 0; None when nothing replicates."""
        if not self.slots:
            return None
        return lambda read_source, read_fleet: transfer.at_lag_zero(
            self.src, self.slots, read_source, read_fleet, LAG_TIMEOUT, self.timed_out
        )

    def timed_out(self, lsn: str) -> WaitTimeout:
        return WaitTimeout(
            f"adopt verify: the copy's subscriptions (slots {', '.join(self.slots)}) did not "
            f"apply the source's WAL up to {lsn} within {LAG_TIMEOUT:g}s; run adopt status, "
            f"then verify again"
        )

    # ---- one chunk ---------------------------------------------------------------------
    def scopes(self, t: Table, chunk: Chunk) -> tuple[data.Scope, dict[str, list[data.Scope]]]:
        if t.key is None:
            whole = data.Scope(self.schema, t.name, columns=t.columns, column=t.column)
            return whole, {self.global_host: [whole]}
        common = {
            "columns": t.columns,
            "column": chunk.column,
            "lo": chunk.lo,
            "hi": chunk.hi,
            "key": t.key,
            "shard_of": self.shard_of(t.key),
        }
        source = data.Scope(self.schema, t.name, modulus=self.modulus, **common)
        fleet = {
            h.name: [
                data.Scope(
                    self.topo.schema_name(s),
                    t.name,
                    str(s),
                    modulus=self.modulus,
                    shard=s,
                    **common,
                )
                for s in h.shards
            ]
            for h in self.topo.hosts
            if h.shards
        }
        return source, fleet

    def sums(self, source: data.Scope, fleet: dict[str, list[data.Scope]]) -> tuple[dict, dict]:
        """({shard or None: (count, checksum)} on the source, {shard: (count, checksum, wrong)} on
        the fleet), the fleet's read once it has applied the source's WAL past the source's read."""

        def read_source(conn: psycopg.Connection) -> dict:
            return {r[1]: (r[2], r[3]) for r in data.checksum_rows(conn, [source])}

        def read_host(name: str) -> dict:
            out, scopes = {}, fleet[name]
            try:
                for i in range(0, len(scopes), data.CHUNK):
                    for r in data.checksum_rows(self.conns[name], scopes[i : i + data.CHUNK]):
                        out[r[1]] = (r[2], r[3], r[4])
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                raise OperationFailed(
                    f"adopt verify: {name}: {str(exc).splitlines()[0]}: the fleet's tables are not "
                    f"the source's (the shards' come from init with the baseline, the global "
                    f"tables' from adopt copy)"
                ) from None
            return out

        def read_fleet() -> dict:
            out: dict = {}
            with ThreadPoolExecutor(len(fleet), thread_name_prefix="shardctl-verify") as pool:
                for part in pool.map(read_host, list(fleet)):  # the hosts hash in parallel
                    out.update(part)
            return out

        return transfer.at_lag_zero(
            self.src, self.slots, read_source, read_fleet, LAG_TIMEOUT, self.timed_out
        )

    def check_chunk(self, t: Table, chunk: Chunk) -> tuple[str, int, tuple[int, int], list[dict]]:
        """(status, rounds, (source rows, fleet rows), problems) of one chunk."""
        source, fleet = self.scopes(t, chunk)
        previous: dict = {}
        unchanged: Counter = Counter()
        for round_no in range(1, ROUNDS + 1):
            src, got = self.sums(source, fleet)
            counts = (
                sum(v[0] for k, v in src.items() if k is not None or t.key is None),
                sum(v[0] for v in got.values()),
            )
            shards = sorted(set(got) | {k for k in src if k is not None or t.key is None}, key=str)
            differ = [s for s in shards if _differs(src.get(s), got.get(s))]
            if not differ:
                return "ok", round_no, counts, []
            if not self.slots:
                break  # nothing replicates: the difference is final
            for s in differ:
                unchanged[s] = unchanged[s] + 1 if previous.get(s, ()) == src.get(s) else 0
            if all(unchanged[s] >= ROUNDS - 1 for s in differ):
                break
            previous = {s: src.get(s) for s in differ}
            time.sleep(transfer.POLL)
        else:
            if not [s for s in differ if unchanged[s] >= ROUNDS - 1]:
                return "busy", ROUNDS, counts, []
        final = [s for s in differ if not self.slots or unchanged[s] >= ROUNDS - 1]
        problems = [
            self.describe(t, chunk, source, fleet, s, src.get(s), got.get(s)).__dict__
            for s in final
        ]
        return "differs", round_no, counts, problems

    def describe(
        self,
        t: Table,
        chunk: Chunk,
        source: data.Scope,
        fleet: dict[str, list[data.Scope]],
        shard: int,
        src: tuple | None,
        got: tuple | None,
    ) -> Problem:
        """The problem of one shard of a chunk, with the first rows that differ named."""
        where = say_range(chunk.column, chunk.lo, chunk.hi)
        if got is None:  # a key placed on no shard of the topology (a negative key, foreign bits)
            return Problem(
                t.name,
                shard,
                None,
                chunk.column,
                chunk.lo,
                chunk.hi,
                src[0],
                0,
                message=(
                    f"{t.name}, {where}: {src[0]} row(s) on the source whose {t.key} places them "
                    f"on shard {shard}: no shard holds them"
                ),
            )
        host = self.global_host if t.key is None else self.topo.host_of(shard).name
        scope = next(sc for sc in fleet[host] if sc.shard == shard)
        src_rows, src_sum = src or (0, "r0")
        method = (src_sum or got[1])[:1]
        on_source = data.row_hashes(self.src, source, method, shard, DRILL_ROWS + 1)
        on_shard = data.row_hashes(self.conns[host], scope, method, None, DRILL_ROWS + 1)
        rows = _rows_that_differ(t, shard, on_source, on_shard)
        what = f"{src_rows} row(s) on the source, {got[0]} on {'the host' if t.key is None else 'the shard'}"
        if src_rows == got[0]:
            what += ", checksums differ"
        named = "; ".join(rows[:NAMED_ROWS]) or "(too many rows to name them)"
        place = f"(global, on {host})" if t.key is None else f"shard {shard} ({host})"
        message = f"{t.name} {place}, {where}: {what}: {named}"
        return Problem(
            t.name,
            shard,
            host,
            chunk.column,
            chunk.lo,
            chunk.hi,
            src_rows,
            got[0],
            rows[:NAMED_ROWS],
            message,
        )


def _no_key(t: Table, rows: int) -> Problem:
    message = f"{t.name}: {rows} row(s) on the source have no {t.key}: no shard holds them"
    return Problem(t.name, None, None, None, None, None, rows, 0, message=message)


def _differs(src: tuple | None, got: tuple | None) -> bool:
    count, total = src or (0, None)
    if got is None:
        return True
    if got[2]:
        return True  # rows whose key belongs to another shard
    if count != got[0]:
        return True
    return bool(count) and total != got[1]


def _rows_that_differ(
    t: Table, shard: int, on_source: list[tuple], on_shard: list[tuple]
) -> list[str]:
    """Each row (by ``t.column``) that is on one side only, differs, or sits on the wrong shard (its
    shard as :func:`data.row_hashes` reads it: the fleet's rule)."""
    if len(on_source) > DRILL_ROWS or len(on_shard) > DRILL_ROWS:
        return []
    out = []
    for value, _, key, owner in on_shard:
        if t.key is not None and owner is not None and owner != shard:
            whose = "" if t.column == t.key else f" {t.key} {key}"
            out.append(f"{t.column} {value}:{whose} belongs on shard {owner}, not {shard}")
    src: dict = {}
    got: dict = {}
    for rows, into in ((on_source, src), (on_shard, got)):
        for value, hashed, *_ in rows:
            into.setdefault(value, Counter())[hashed] += 1
    for value in sorted(set(src) | set(got)):
        missing = src.get(value, Counter()) - got.get(value, Counter())
        extra = got.get(value, Counter()) - src.get(value, Counter())
        if missing and extra:
            out.append(f"{t.column} {value}: differs")
        elif missing:
            out.append(
                f"{t.column} {value}: {_rows(missing)}only on the source (missing on the shard)"
            )
        elif extra and not any(s.startswith(f"{t.column} {value}:") for s in out):
            out.append(f"{t.column} {value}: {_rows(extra)}only on the shard")
    return out


def _rows(counter: Counter) -> str:
    n = sum(counter.values())
    return "" if n == 1 else f"{n} rows "
