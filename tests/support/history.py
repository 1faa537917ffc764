"""A history of what clients did and saw, checked afterwards against the real databases.

Modelled on Jepsen's Elle and Citus' isolation tests, in the small: clients (Router threads, psql
processes, pgbench runs) record every acknowledged write (key, id, when), every read (key, the
schema that answered, the ids it saw, when) and every error. :meth:`History.check` then reads
every shard schema on every host over direct (admin) connections and reports:

* ``lost``: an acknowledged row that no live shard schema holds;
* ``duplicated``: an acknowledged row held more than once (two hosts, or twice in one schema);
* ``wrong_shard``: a row (acknowledged or tagged by this history) in a schema that is not its
  key's shard, or on a host that the topology does not give that shard to;
* ``read_wrong_shard``: a read answered by a schema other than its key's shard;
* ``stale_read``: a read that missed a row of its key acknowledged before the read began;
* ``batch``: a counted batch (pgbench) whose tagged rows number fewer than the acknowledged
  transactions, or more than acknowledged + ambiguous;
* ``error``: an error the application saw that is not a documented retry.

Documented retries (a direct client told "shard N moved to HOST", SQLSTATE SCM01, that
re-resolves and tries again) are recorded with :meth:`History.retried` and only counted.

``assert report.ok, report`` prints the counts and the first violations.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from shardctl.ids.routing import shard_for_key
from shardctl.model.topology import Topology

TAG_PREFIX = "hist:"  # every row a history's clients write carries a caption starting with its tag


@dataclass
class Write:
    client: str
    key: int
    id: int
    schema: str | None  # what the client saw (current_schema() at the insert), when it can tell
    start: float
    end: float


@dataclass
class Read:
    client: str
    key: int
    schema: str  # the schema that answered
    ids: frozenset[int]
    start: float
    end: float
    server: str | None = None  # where it ran, when the client can tell (e.g. the server's port)


@dataclass
class Failure:
    client: str
    op: str
    key: int | None
    error: str
    start: float
    end: float


@dataclass
class Batch:
    """Rows whose caption is ``tag``: ``acked`` acknowledged, ``ambiguous`` more may exist."""

    client: str
    tag: str
    acked: int
    ambiguous: int


@dataclass
class Report:
    counts: dict[str, int]
    violations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def add(self, kind: str, text: str) -> None:
        self.violations.setdefault(kind, []).append(text)

    def __str__(self) -> str:
        lines = ["history: " + ", ".join(f"{k} {v}" for k, v in self.counts.items())]
        for kind, items in self.violations.items():
            if items:
                lines.append(f"  {kind}: {len(items)}")
                lines += [f"    {item}" for item in items[:5]]
        return "\n".join(lines)

    __repr__ = __str__


def now() -> float:
    """Wall-clock seconds: comparable with the timestamps of shardctl's reports (a move's freeze)."""
    return time.time()


class History:
    """Thread-safe record of one run's operations; ``tag`` marks the rows its clients write."""

    def __init__(
        self, path: Path, table: str = "photos", tag: str | None = None, key_is_id: bool = False
    ):
        self.path = Path(path)
        self.table = table
        # the rows' key (user_id) is an ID minted on its shard (a photo on its owner's shard), not a
        # value routed by the topology's rule
        self.key_is_id = key_is_id
        self.tag = tag or f"{TAG_PREFIX}{time.time_ns() % 10**12:x}"
        self.writes: list[Write] = []
        self.reads: list[Read] = []
        self.failures: list[Failure] = []
        self.retries: list[Failure] = []
        self.batches: list[Batch] = []
        self._lock = threading.Lock()

    def caption(self, client: str) -> str:
        return f"{self.tag} {client}"

    # ---- recording --------------------------------------------------------------------------
    def acked(
        self, client: str, key: int, id: int, start: float, end: float, schema: str | None = None
    ) -> None:
        with self._lock:
            self.writes.append(Write(client, key, int(id), schema, start, end))

    def read(
        self,
        client: str,
        key: int,
        schema: str,
        ids,
        start: float,
        end: float,
        server: str | None = None,
    ) -> None:
        with self._lock:
            self.reads.append(
                Read(client, key, schema, frozenset(int(i) for i in ids or ()), start, end, server)
            )

    def failed(
        self, client: str, op: str, key: int | None, error: object, start: float, end: float
    ) -> None:
        with self._lock:
            self.failures.append(Failure(client, op, key, _text(error), start, end))

    def retried(self, client: str, op: str, key: int | None, error: object) -> None:
        with self._lock:
            self.retries.append(Failure(client, op, key, _text(error), now(), now()))

    def batch(self, client: str, tag: str, acked: int, ambiguous: int = 0) -> None:
        with self._lock:
            self.batches.append(Batch(client, tag, acked, ambiguous))

    def settle(
        self,
        clients: set[str],
        writes: int = 51,
        reads: int = 21,
        rounds: int = 3,
        within: float = 30.0,
    ) -> None:
        """Wait, at most ``within`` seconds, until the clients have made ``writes`` acknowledged writes
        and ``reads`` reads in all, and each of ``clients`` has finished ``rounds`` more operations
        begun from now: traffic that ends here outlasted the event it ran across (a move, a
        migration), however loaded the machine."""
        mark = now()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self._lock:
                records = [*self.writes, *self.reads, *self.failures]
                enough = len(self.writes) >= writes and len(self.reads) >= reads
            since = Counter(r.client for r in records if r.start >= mark)
            if enough and all(since[client] >= rounds for client in clients):
                return
            time.sleep(0.05)

    # ---- checking ---------------------------------------------------------------------------
    def check(self, path: Path | None = None) -> Report:
        """Compare the history with every shard schema on every host (direct connections)."""
        topo = Topology.load(path or self.path)
        rows = self._rows(topo)  # (host, schema, id, user_id, caption)
        report = Report(
            counts={
                "writes": len(self.writes),
                "reads": len(self.reads),
                "batches": sum(b.acked for b in self.batches),
                "rows": len(rows),
                "retries": len(self.retries),
                "errors": len(self.failures),
            }
        )
        self._check_rows(topo, rows, report)
        self._check_reads(topo, report)
        for f in self.failures:
            report.add("error", f"{f.client} {f.op} key {f.key}: {f.error}")
        return report

    def _rows(self, topo: Topology) -> list[tuple[str, str, int, int, str]]:
        """Every row of ``table`` in a live shard schema (a real table, not a moved shard's stub view
        nor its renamed old schema) on every host the topology names."""
        out = []
        for host in topo.hosts:
            with psycopg.connect(**host.connect_kwargs(purpose="admin"), autocommit=True) as conn:
                schemas = [
                    s
                    for (s,) in conn.execute(
                        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE c.relname = %s AND c.relkind IN ('r', 'p')",
                        (self.table,),
                    ).fetchall()
                    if topo.shard_of_schema(s) is not None
                ]
                for i in range(0, len(schemas), 200):
                    union = " UNION ALL ".join(
                        f"SELECT '{s}', id, user_id, caption FROM \"{s}\".{self.table} WHERE caption LIKE %s"
                        for s in schemas[i : i + 200]
                    )
                    like = self.tag.replace("%", r"\%").replace("_", r"\_") + "%"
                    out += [
                        (host.name, *r)
                        for r in conn.execute(union, [like] * len(schemas[i : i + 200]))
                    ]
        return out

    def _check_rows(self, topo: Topology, rows: list, report: Report) -> None:
        where: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for host, schema, id_, user_id, _caption in rows:
            where[id_].append((host, schema))
            shard = self._shard_of_key(topo, user_id)
            if schema != topo.schema_name(shard) or topo.host_of(shard).name != host:
                report.add(
                    "wrong_shard",
                    f"row {id_} (user_id {user_id}, shard {shard} on "
                    f"{topo.host_of(shard).name}) found in {host}:{schema}",
                )
        for w in self.writes:
            found = where.get(w.id, [])
            if not found:
                report.add("lost", f"{w.client} key {w.key} id {w.id} (acked at {w.end:.3f})")
            elif len(found) > 1:
                report.add("duplicated", f"{w.client} key {w.key} id {w.id} in {found}")
            if w.schema is not None and w.schema != topo.schema_name(
                self._shard_of_key(topo, w.key)
            ):
                report.add(
                    "wrong_shard", f"{w.client} key {w.key} id {w.id}: the insert ran in {w.schema}"
                )
        captions = Counter(r[4] for r in rows)
        for b in self.batches:
            n = captions.get(b.tag, 0)
            if not b.acked <= n <= b.acked + b.ambiguous:
                report.add(
                    "batch",
                    f"{b.client} {b.tag}: {n} rows for {b.acked} acknowledged "
                    f"(+{b.ambiguous} ambiguous)",
                )

    def _shard_of_key(self, topo: Topology, key: int) -> int:
        return topo.layout.shard_of(key) if self.key_is_id else shard_for_key(key, topo.modulus)

    def _check_reads(self, topo: Topology, report: Report) -> None:
        acked_by_key: dict[int, list[Write]] = defaultdict(list)
        for w in self.writes:
            acked_by_key[w.key].append(w)
        for r in self.reads:
            expected = topo.schema_name(self._shard_of_key(topo, r.key))
            if r.schema != expected:
                report.add(
                    "read_wrong_shard",
                    f"{r.client} key {r.key}: answered by {r.schema}, not {expected}",
                )
            missed = [
                w.id for w in acked_by_key.get(r.key, []) if w.end < r.start and w.id not in r.ids
            ]
            if missed:
                report.add(
                    "stale_read",
                    f"{r.client} key {r.key} at {r.start:.3f}-{r.end:.3f} on {r.server}: "
                    f"saw {len(r.ids)}, missed {len(missed)} acked row(s), e.g. {missed[:3]}",
                )


def _text(error: object) -> str:
    if isinstance(error, BaseException):
        state = getattr(error, "sqlstate", None)
        return f"{type(error).__name__}{f' [{state}]' if state else ''}: {str(error).strip()[:300]}"
    return str(error).strip()[:300]
