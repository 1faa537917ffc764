#!/usr/bin/env python
"""``adopt copy`` (the initial copy of an old database into the fleet) against the
``pg_dump --data-only | psql`` floor: the same tables into one target, side by side.

    python bench/adopt.py [--mb 300] [--app forum_django,tasks_prisma] [--shards 64] [--writes 20]

For each app of tests/data/apps (``--app``, in turn), set up once (not timed), in a sandbox of two
servers of the same major version: on pg1 the old database, loaded at ``--mb`` MB
(tests/support/apps.py), its plan's fixes run and keys changed by update; ``adopt plan`` and
``adopt baseline``; on pg2 the fleet (one host owning every shard and the global tables),
initialised from the baseline and kept as a template database, and the floor's database holding the
old database's schema (``pg_dump --schema-only``), another template. Each round, each candidate gets
a fresh copy of the old database (``CREATE DATABASE … TEMPLATE``) and a fresh target, while
``--writes`` pgbench transactions/s (a new row, a key changed by update) go on on the old database:

* ``pg_dump | psql``   ``pg_dump --data-only --disable-triggers -t <every adopted table>`` of the old
                       database piped into ``psql`` on the floor's database (binaries of the
                       sandbox's own build); without trigger checks, as the copy copies;
* ``adopt copy``       ``adopt_copy`` into the fleet, timed to the moment every table is copied (the
                       subscription exists: it is created after the initial copy), with ``to lag 0``
                       (the call returns once the subscriptions have caught up) next to it.

The copy is paired with the floor of its round: the ratio is its time over the floor's, the median
over rounds. Target: ``adopt copy`` <= 1.2x the floor. Also measured, by a sampler independent of the
copy's code: the WAL the old database's replication slots hold (the largest seen, sampled every
0.1 s). Every run is checked: the floor's tables hold at least the rows the old database had; after
the copy, the writes stopped and lag 0 again, every (table, shard) holds exactly the old database's
rows of its keys (count and a hash of every row), the global tables all of theirs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _common as c
import psycopg
from psycopg import sql
from support.apps import ROWS, app_writes, caught_up, fleet_rows, prepare, source_rows, table_bytes

from shardctl.ops.adopt.state import load_run, run_tag, slot_name  # pub = slot = subscription
from shardctl.testing import _drop_replication  # what the test suite drops after a failed move

TARGET = 1.2
# The WAL the old database's slots hold: from the oldest restart_lsn of its slots to the present.
HELD = (
    "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), min(restart_lsn)), 0)::bigint "
    "FROM pg_replication_slots WHERE database = current_database()"
)


class Sampler(threading.Thread):
    """Every ``every`` s: does the fleet host's subscription exist yet (the initial copy is over), and
    how much WAL the old database's slots hold (the most seen)."""

    def __init__(self, source: str, target_port: int, host: str, every: float = 0.1):
        super().__init__(daemon=True)
        self.source, self.target_port, self.host, self.every = (source, target_port, host, every)
        self.started = 0.0
        self.subscribed: float | None = None  # seconds from the start
        self.held_max = 0
        self.samples = 0
        self.error: str | None = None
        self.halt = threading.Event()

    def start(self) -> None:
        self.started = time.perf_counter()
        super().start()

    def run(self) -> None:
        try:
            with (
                psycopg.connect(self.source, autocommit=True) as src,
                c.connect(self.target_port) as dst,
            ):
                while not self.halt.wait(self.every):
                    (held,) = src.execute(HELD).fetchone()
                    self.held_max = max(self.held_max, held)
                    self.samples += 1
                    run = load_run(src) if self.subscribed is None else None
                    if (
                        run is not None
                        and dst.execute(
                            "SELECT 1 FROM pg_subscription WHERE subname = %s",
                            (slot_name(self.host, run_tag(run)),),  # the run's tag names it
                        ).fetchone()
                    ):
                        self.subscribed = time.perf_counter() - self.started
        except psycopg.Error as exc:
            self.error = str(exc)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


class Bench:
    """One app on the sandbox's two servers: its old database and the two targets' templates."""

    def __init__(self, box, args, app: str):
        self.box, self.args, self.app = box, args, app
        self.src, self.dst = box.state.hosts[0], box.state.hosts[1]
        self.bin = Path(box.state.bin_dir)
        self.dir = Path(box.dir) / app
        self.tag = app.split("_")[0]
        self.old, self.fleet, self.floor = (f"{self.tag}_{n}" for n in ("old", "fleet", "floor"))
        self.plan_file = self.dir / "adopt-plan.yaml"
        self.adopted: list[str] = []
        self.plan: dict = {}
        self.counts: dict[str, int] = {}
        self.bytes = 0
        self.users = 0
        self.n = 0
        self.version = box.state.version

    def dsn(self, host, db: str) -> str:
        return c.admin_dsn(host.port, db)

    def topology(self, db: str) -> Path:
        """The fleet: pg2 alone, every shard and the global tables, the baseline its migration."""
        self.n += 1
        return c.topology_for(
            self.box,
            [db],
            self.args.shards,
            name=f"{self.app}/topo_{self.n}",
            migrations="migrations/",
            hosts=[1],
            extra="routing:\n  key: user_id",
        )

    def setup(self) -> list[str]:
        """The old database at size, planned, fixed, its baseline; the two templates. Notes."""
        from shardctl.ops.provision import init

        args, old = self.args, self.dsn(self.src, self.old)
        for host, db in ((self.src, self.old), (self.dst, self.fleet), (self.dst, self.floor)):
            with c.connect(host.port) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        (self.dir / "migrations").mkdir(parents=True)
        topo = c.load_topology(self.topology(self.fleet))
        seconds, self.plan = c.timed(
            lambda: prepare(topo, old, self.app, self.plan_file, mb=args.mb)
        )
        self.users = self.plan["users"]
        c.log(f"{self.app}: {self.users} users loaded and planned in {seconds:.0f}s")
        init(topo).raise_for_status()
        tables = self.plan["tables"]
        self.adopted = [t["name"] for t in tables if t["kind"] in ("root", "column", "global")]
        self.bytes = table_bytes(old, tables=self.adopted)
        self.counts = {t: n for t, (n, _) in rows_of(old, self.adopted).items()}
        self.pipe(
            self.pg("pg_dump", self.src, self.old, "--schema-only"),
            self.pg("psql", self.dst, self.floor),
        )
        sharded = sum(t["kind"] != "global" for t in tables if t["name"] in self.adopted)
        note = (
            f"{self.app} at {self.bytes / 2**20:.0f} MB ({self.users} users): {len(self.adopted)} "
            f"tables adopted ({sharded} sharded, {len(self.adopted) - sharded} global), "
            f"{sum(self.counts.values())} rows; {args.shards} shards on one host; PostgreSQL "
            f"{self.version}"
        )
        return [note]

    def pg(self, tool: str, host, db: str, *more: str) -> list[str]:
        """A client binary of the sandbox's build (the servers' major version) on ``db``."""
        conn = ["-h", "127.0.0.1", "-p", str(host.port), "-U", "postgres", "-d", db]
        if tool == "psql":
            return [str(self.bin / tool), *conn, "-X", "-q", "-v", "ON_ERROR_STOP=1", *more]
        return [str(self.bin / tool), *conn, *more]

    @staticmethod
    def pipe(first: list[str], second: list[str]) -> None:
        """``first | second``, both exit 0."""
        dump = subprocess.Popen(first, stdout=subprocess.PIPE)
        restore = subprocess.run(
            second, stdin=dump.stdout, capture_output=True, text=True, check=False
        )
        dump.stdout.close()
        if dump.wait() != 0 or restore.returncode != 0:
            raise SystemExit(f"{Path(first[0]).name} | psql failed: {restore.stderr[-800:]}")

    @contextlib.contextmanager
    def clones(self, target: str, tag: str):
        """A fresh copy of the old database on pg1 and of ``target`` on pg2, dropped afterwards with
        any database the copy made there (the id map's), and any subscription and slot left."""
        names = (f"{self.old}_{tag}", f"{target}_{tag}")
        before = databases(self.dst.port)
        for host, tpl, db in ((self.src, self.old, names[0]), (self.dst, target, names[1])):
            with c.connect(host.port) as conn:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(db), sql.Identifier(tpl)
                    )
                )
        c.checkpoint([self.src.port, self.dst.port])
        try:
            yield names
        finally:
            made = sorted(databases(self.dst.port) - before)  # the target and the copy's own
            for db in made:
                with contextlib.suppress(psycopg.Error):
                    _drop_replication(self.dsn(self.dst, db))
            with contextlib.suppress(psycopg.Error):
                _drop_replication(self.dsn(self.src, names[0]))
            c.drop_databases([self.src.port] + [self.dst.port] * len(made), [names[0], *made])

    def writes(self, db: str):
        return app_writes(self.dsn(self.src, db), self.app, self.args.writes)

    def run_floor(self, tag: str) -> float:
        with self.clones(self.floor, tag) as (old, target), self.writes(old) as w:
            tables = [f"--table=public.{quoted(t)}" for t in self.adopted]
            seconds, _ = c.timed(
                lambda: self.pipe(
                    self.pg("pg_dump", self.src, old, "--data-only", "--disable-triggers", *tables),
                    self.pg("psql", self.dst, target),
                )
            )
            got = rows_of(self.dsn(self.dst, target), self.adopted)
        short = {t: (n, self.counts[t]) for t, (n, _) in got.items() if n < self.counts[t]}
        if short or w["errors"]:
            raise SystemExit(f"pg_dump | psql: tables short of rows {short}; {w['errors']}")
        return seconds

    def run_copy(self, tag: str) -> dict:
        """``adopt_copy`` timed; then the writes stopped, lag 0 again, and every table compared."""
        with self.clones(self.fleet, tag) as (old, target):
            source = self.dsn(self.src, old)
            topo_path = self.topology(target)
            sampler = Sampler(source, self.dst.port, self.dst.name)
            with self.writes(old) as w:
                sampler.start()
                returned, report = c.timed(
                    lambda: adopt_copy_call(topo_path, source, self.plan_file)
                )
                sampler.stop()
            if sampler.error or sampler.subscribed is None:
                raise SystemExit(f"no subscription seen during the copy: {sampler.error}")
            if w["errors"]:
                raise SystemExit(f"the app's writes failed during the copy: {w['errors']}")
            caught_up(source)
            want, got = (
                source_rows(source, self.plan),
                fleet_rows(c.load_topology(topo_path), self.plan),
            )
            wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            wrong |= {k: (v, None) for k, v in got.items() if k not in want}
            if wrong:
                raise SystemExit(
                    f"adopt copy: (table, shard): (fleet, old database) differ: {wrong}"
                )
            return {
                "copied": sampler.subscribed,
                "lag0": returned,
                "held_max": sampler.held_max,
                "writes": w["transactions"],
                "report": report,
            }


def adopt_copy_call(topo_path: Path, source: str, plan_file: Path) -> dict:
    """``adopt_copy`` as ``shardctl adopt copy`` calls it: returns once every subscription has
    caught up (phase ``synced``)."""
    from shardctl import adopt_copy

    return adopt_copy(c.load_topology(topo_path), source, plan_file).to_dict()


def databases(port: int) -> set[str]:
    """The databases of the server at ``port``."""
    with c.connect(port) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def quoted(name: str) -> str:
    """``name`` as a pg_dump pattern matches it exactly (case kept)."""
    return '"' + name.replace('"', '""') + '"'


def rows_of(dsn: str, tables: list[str]) -> dict[str, tuple]:
    """Per table of ``public``: (rows, sum of a hash of every row)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            t: conn.execute(
                sql.SQL(ROWS).format(sql.SQL(""), sql.Identifier("public", t), sql.SQL(""))
            ).fetchone()
            for t in tables
        }


def loadavg() -> str:
    """The first three fields of /proc/loadavg (the machine is shared)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def parser():
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, help="MB of the old database's tables (300, --quick 60).")
    p.add_argument(
        "--app",
        default="forum_django,tasks_prisma",
        help="The apps of tests/data/apps, in turn (comma-separated).",
    )
    p.add_argument("--shards", type=int, default=64, help="Logical shards (all on one host).")
    p.add_argument(
        "--writes",
        type=float,
        default=20,
        help="The app's transactions/s during each run (0: none).",
    )
    p.add_argument("--pg", help="PostgreSQL major version of both servers (default the newest).")
    p.add_argument("--skip", default="", help="Candidates to leave out (comma-separated): copy.")
    return p


def rows_for(series: dict[str, c.Series]) -> list[c.Row]:
    """One row per series; every one but the floor paired with the floor of its round."""
    rows = []
    base = series.get("floor")
    for name, s in series.items():
        ratios = s.ratios_to(base, faster_is_higher=False) if base and s is not base else []
        target = name == "copy"
        rows.append(
            c.Row(
                s.name,
                c.fmt_s(s.median_s),
                c.spread_s(s),
                c.median(ratios) if ratios else None,
                f"<= {TARGET}x the floor" if target else "(info)",
                (c.median(ratios) <= TARGET) if target and ratios else None,
                c.fmt_rate(s.median_rate, "MB/s"),
                c.ratio_range(ratios) if ratios else None,
            )
        )
    return rows


LABELS = {
    "floor": "pg_dump --data-only | psql",
    "copy": "adopt copy (every table copied)",
    "lag0": "adopt copy, to lag 0",
}


def measure(bench: Bench, names: list[str], rounds: int) -> dict:
    """One app: set up, then the candidates interleaved over ``rounds``; its series and notes."""
    notes = bench.setup()
    mb = bench.bytes / 2**20
    keys = [*names, "lag0"] if "copy" in names else names
    series = {n: c.Series(f"{bench.app}: {LABELS[n]}", work=mb, unit="MB/s") for n in keys}
    held, writes = [], []
    for r in range(rounds):
        for name in c.rotated(names, r):
            if name == "floor":
                series[name].add(bench.run_floor(f"r{r}"))
                c.log(f"{bench.app} round {r + 1}/{rounds}: floor {series[name].seconds[-1]:.2f}s")
                continue
            got = bench.run_copy(f"r{r}")
            series["copy"].add(got["copied"])
            series["lag0"].add(got["lag0"])
            held.append(got["held_max"])
            writes.append(got["writes"])
            c.log(
                f"{bench.app} round {r + 1}/{rounds}: copy {got['copied']:.2f}s, to lag 0 "
                f"{got['lag0']:.2f}s, slots held {got['held_max'] / 2**20:.1f} MB at most"
            )
    if held:
        notes.append(
            f"{bench.app}: WAL the old database's slots held during the copy: at most "
            f"{max(held) / 2**20:.1f} MB (sampled every 0.1 s), the app writing "
            f"{bench.args.writes:g} transactions/s ({sum(writes)} in the copy runs)"
        )
    rows = rows_for(series)
    figures = {
        "megabytes": round(mb, 1),
        "users": bench.users,
        "tables": len(bench.adopted),
        "rows": sum(bench.counts.values()),
        "results": [r.figures(s) for r, s in zip(rows, series.values())],
        "seconds": {n: s.seconds for n, s in series.items()},
        "slot_wal_held_max_bytes": held,
        "writes_in_copy_runs": writes,
    }
    return {"rows": rows, "notes": notes, "figures": figures}


def main() -> int:
    args = parser().parse_args()
    rounds = c.check_rounds(args.rounds or 3)
    args.mb = args.mb or (60 if args.quick else 300)
    apps = args.app.split(",")
    names = [n for n in ("floor", "copy") if n not in args.skip.split(",")]
    load = {"start": loadavg()}
    per_app = {}
    with c.sandbox(
        2,
        args.shards,
        keep=args.keep,
        prefix="shardctl-bench-adopt-",
        base=c.sandbox_base(args.tmp, need_gb=4 + 5 * args.mb / 1000),
        pg=args.pg,
    ) as box:
        version = box.state.version
        for app in apps:
            per_app[app] = measure(Bench(box, args, app), names, rounds)
    load["end"] = loadavg()
    rows = [r for got in per_app.values() for r in got["rows"]]
    notes = [n for got in per_app.values() for n in got["notes"]]
    notes.append(
        f"load average (/proc/loadavg): {load['start']} at the start, {load['end']} at the end"
    )
    title = f"adopt copy vs pg_dump | psql: {args.mb:g} MB per app, median of {rounds} rounds"
    c.print_table(title, rows, "floor", notes)
    c.save_run(
        args,
        {
            "apps": {app: got["figures"] for app, got in per_app.items()},
            "shards": args.shards,
            "pg": version,
            "writes_per_s": args.writes,
            "rounds": rounds,
            "loadavg": load,
            "notes": notes,
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
