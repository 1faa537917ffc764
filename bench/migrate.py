#!/usr/bin/env python
"""Migrations over a provisioned fleet (default 8192 shards over 4 hosts).

Setup (not timed): ``shardctl init`` builds the fleet (V0001, V0002 of the example app) once in a template
database on every server; every candidate and round then gets a fresh copy
(``CREATE DATABASE ... TEMPLATE``, dropped afterwards), so each starts from the same state.

1. ``migrate --check`` with nothing pending. Candidates: the library call
   (``shardctl.ops.migrate.migrate(topo, check=True)``), the ``shardctl migrate --check`` command (a new
   process, as CI runs it), against the floor of "one query per host" (the ledger read with psycopg,
   hosts in parallel). Targets: the library <= 1 s, the process <= 0.25 s (issue #40;
   ``--against DIR`` also runs the process from the checkout in DIR, side by side). Shown for
   information: both without the verified-checksum cache (the first check after a shardctl upgrade
   re-renders every applied migration) and the bare start-up of a ``shardctl`` process.
2. Applying one migration, V0003 (adds a column and an index to the example app's photos table, written
   into a copy of the migrations dir). Candidates: ``shardctl migrate`` (library; the CLI process is shown
   for information) against two floors: the same rendered migration SQL, one ``psql -f`` per host, hosts in
   parallel; and the parallel floor, that SQL split into K ``psql -f`` streams per host (K = this machine's
   cores, where the sandbox servers run; ``--streams``). Target: <= 1.25x the parallel floor.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _fleet as f

V3_NAME = "V0003__add_photo_location.sql"
V3_SQL = """-- Example app: where a photo was taken, and an index to find photos by place.
ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;
CREATE INDEX photos_location_idx ON {{ schema|ident }}.photos (location);
"""


def ledger_query(topo) -> float:
    """The floor of "is anything pending?": one query per host, hosts in parallel (new connections)."""
    import psycopg

    def one(host) -> int:
        with psycopg.connect(**host.connect_kwargs(connect_timeout=10), autocommit=True) as conn:
            return len(
                conn.execute(
                    "SELECT shard_id, max(version) FROM shardctl.migrations GROUP BY 1"
                ).fetchall()
            )

    started = time.perf_counter()
    with ThreadPoolExecutor(len(topo.hosts)) as pool:
        counts = list(pool.map(one, topo.hosts))
    elapsed = time.perf_counter() - started
    if sum(counts) != topo.shard_count:
        raise SystemExit(
            f"ledger query: {sum(counts)} shards in the ledgers, expected {topo.shard_count}"
        )
    return elapsed


# The process floor: a new Python process that imports psycopg and reads each host's ledger (one query
# per host, in parallel) -- what any Python tool answering "is anything pending?" pays at least.
FLOOR_SCRIPT = """
import sys
from concurrent.futures import ThreadPoolExecutor
import psycopg
def one(dsn):
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return len(conn.execute("SELECT shard_id, max(version) FROM shardctl.migrations GROUP BY 1").fetchall())
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(sum(pool.map(one, sys.argv[1:])))
"""


def ledger_query_process(topo) -> float:
    """:func:`ledger_query` as a new process (``python -c``): the floor of the CLI process row."""
    import subprocess

    dsns = [h.dsn for h in topo.hosts]
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", FLOOR_SCRIPT, *dsns], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if out.returncode != 0 or int(out.stdout.strip() or 0) != topo.shard_count:
        raise SystemExit(f"ledger query process: {out.returncode} {out.stdout} {out.stderr[-800:]}")
    return elapsed


def forget_verified(box, databases: list[str]) -> list:
    """Take away the verified-checksum cache (if this shardctl keeps one), so the next check re-renders every
    applied migration; returns what to give back to :func:`restore_verified` (--check never writes it)."""
    from shardctl.ops import migrate as migrate_module

    key = getattr(migrate_module, "CACHE_KEY", None)
    saved = []
    for host, db in zip(box.state.hosts, databases):
        with c.connect(host.port, db) as conn:
            if (
                key is None
                or not conn.execute("SELECT to_regclass('shardctl.meta') IS NOT NULL").fetchone()[0]
            ):
                continue
            rows = conn.execute(
                "DELETE FROM shardctl.meta WHERE key = %s RETURNING key, value::text", (key,)
            ).fetchall()
            saved += [(host.port, db, k, v) for k, v in rows]
    return saved


def restore_verified(saved: list) -> None:
    for port, db, key, value in saved:
        with c.connect(port, db) as conn:
            conn.execute(
                "INSERT INTO shardctl.meta (key, value) VALUES (%s, %s::jsonb)", (key, value)
            )


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--shards", type=int, default=None, help="Logical shards (default 8192, --quick 1024)."
    )
    p.add_argument("--hosts", type=int, default=4, help="PostgreSQL servers.")
    p.add_argument(
        "--check-rounds", type=int, default=None, help="Rounds of the --check part (default 7)."
    )
    p.add_argument(
        "--skip",
        default="",
        help="Comma-separated parts/candidates to leave out: check, apply, cli.",
    )
    p.add_argument(
        "--streams", type=int, default=None, help="K of the parallel floor (default: cores)."
    )
    p.add_argument(
        "--jobs", type=int, default=None, help="migrate's --jobs (default: shardctl decides)."
    )
    p.add_argument(
        "--against",
        metavar="DIR",
        help="Also run `migrate --check` (the process) from the checkout in DIR, side by side.",
    )
    p.add_argument(
        "--per-shard",
        action="store_true",
        help="Also time V0003 applied with one connection and transaction per shard, hosts in turn.",
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 5))
    check_rounds = c.check_rounds(args.check_rounds or (5 if args.quick else 7))
    shards = args.shards or (1024 if args.quick else 8192)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    from shardctl.engine.executor import RunOptions
    from shardctl.ops.migrate import migrate
    from shardctl.ops.provision import init
    from shardctl.sql.render import builtin_dir

    tables: list[list[c.Row]] = []
    notes: list[str] = []
    doc: dict = {"shards": shards, "hosts": args.hosts}
    with c.sandbox(
        hosts=args.hosts,
        shards=min(shards, 8192),
        keep=args.keep,
        prefix="shardctl-bench-migrate-",
        base=c.sandbox_base(args.tmp),
    ) as box:
        ports = [h.port for h in box.state.hosts]
        notes.append(f"sandbox in {box.dir} ({args.hosts} servers)")
        base_dir = box.dir / "migrations_base"
        v3_dir = box.dir / "migrations_v3"
        shutil.copytree(builtin_dir("migrations"), base_dir)
        shutil.copytree(base_dir, v3_dir)
        (v3_dir / V3_NAME).write_text(V3_SQL)

        # The template fleet: init once (not timed).
        tpl = c.create_databases(ports, "tpl")
        tpl_topo = c.load_topology(
            c.topology_for(box, tpl, shards, name="tpl", migrations="migrations_base/")
        )
        seconds, report = c.timed(lambda: init(tpl_topo))
        if not report.ok:
            raise SystemExit(f"setup: shardctl init failed: {json.dumps(report.to_dict())[:2000]}")
        notes.append(
            f"setup: shardctl init of {shards} shards (V0001, V0002) in {seconds:.1f}s, once, into a "
            f"template database per server"
        )
        c.log(f"template fleet ready ({seconds:.1f}s)")

        def fresh(tag: str, migrations: str) -> tuple[list[str], Path]:
            started = time.perf_counter()
            dbs = _copy_each(ports, tag, tpl)
            c.log(f"  copied the fleet for {tag} in {time.perf_counter() - started:.1f}s")
            return dbs, c.topology_for(box, dbs, shards, name=f"topo_{tag}", migrations=migrations)

        # ---- 1. migrate --check, nothing pending ----------------------------------------------------
        if "check" not in skip:
            against = str(Path(args.against).resolve()) if args.against else None
            names = ["floor", "lib", "lib_nocache"] + (
                [] if "cli" in skip else ["cli", "floor_process", "cli_nocache", "startup"]
            )
            names += ["cli_base"] if against and "cli" not in skip else []
            labels = {
                "cli_base": f"shardctl migrate --check (CLI process) @{c.commit_of(against or '.')}",
                "floor": "floor: 1 ledger query per host, in parallel",
                "floor_process": "floor as a process: python, import psycopg, 1 query per host",
                "lib": "migrate(check=True) (library)",
                "cli": "shardctl migrate --check (CLI process)",
                "lib_nocache": "migrate(check=True), no verified-checksum cache",
                "cli_nocache": "shardctl migrate --check, no verified-checksum cache",
                "startup": "shardctl --version (process start-up)",
            }
            series = {n: c.Series(labels[n]) for n in names}
            dbs, path = fresh("chk", "migrations_base/")
            if "cli" not in skip:  # each checkout as pip installs it: every module has its .pyc
                for checkout in filter(None, [str(c.REPO), against]):
                    c.log(f"compiled {c.compile_package(c.against_env(checkout))}")
            try:
                topo = c.load_topology(path)
                migrate(
                    topo, check=True
                )  # warm the server caches once, as a CI job's first run would not
                for r in range(check_rounds):
                    for name in c.rotated(names, r):
                        saved = []
                        if name.endswith("_nocache"):
                            # As on the first check after an upgrade of shardctl (the cache is keyed by the
                            # renderer's code): every applied migration is rendered and its checksum compared.
                            saved = forget_verified(box, dbs)
                        if name == "floor":
                            seconds = ledger_query(topo)
                        elif name == "floor_process":
                            seconds = ledger_query_process(topo)
                        elif name == "startup":
                            seconds, _ = f.shardctl_cli(["--version"], path)
                        elif name.startswith("lib"):
                            seconds, rep = c.timed(lambda: migrate(topo, check=True))
                            if not rep.ok or rep.pending_total != 0:
                                raise SystemExit(
                                    f"migrate --check (library) found work or failed: "
                                    f"{json.dumps(rep.to_dict())[:2000]}"
                                )
                        else:
                            seconds, out = f.shardctl_cli(
                                ["migrate", "--check"],
                                path,
                                base_env=c.against_env(against) if name == "cli_base" else None,
                            )  # cli, cli_nocache, cli_base
                            if out.returncode != 0:
                                raise SystemExit(
                                    f"shardctl migrate --check exited {out.returncode}: "
                                    f"{out.stderr[-1500:]}{out.stdout[-800:]}"
                                )
                        restore_verified(saved)
                        series[name].add(seconds)
                    c.log(
                        f"check round {r + 1}/{check_rounds}: "
                        + ", ".join(f"{n} {series[n].seconds[-1] * 1000:.0f}ms" for n in names)
                    )
            finally:
                c.drop_databases(ports, dbs)
            rows = []
            for name in names:
                s = series[name]
                ratio = s.ratio_to(series["floor"], faster_is_higher=False)
                rng = c.ratio_range(s.ratios_to(series["floor"], faster_is_higher=False))
                ok = None
                if name == "floor":
                    target, note = "baseline", ""
                elif name.endswith("_nocache"):
                    target, note = "(info)", "first check after an upgrade"
                elif name == "cli_base":
                    mine = series["cli"].ratio_to(s, faster_is_higher=False)
                    target, note = "(baseline)", f"this checkout's process: {mine:.2f}x its time"
                elif name == "startup":
                    target, note = "(info)", "included in every CLI row"
                elif name == "floor_process":
                    mine = series["cli"].ratio_to(s, faster_is_higher=False)
                    target, note = "(info)", f"the CLI process: {mine:.2f}x its time"
                else:
                    # targets: the process within 0.25 s, the library call within 1 s
                    limit = 0.25 if name == "cli" else 1.0
                    target, ok, note = f"<= {limit:g} s", s.median_s <= limit, ""
                rows.append(
                    c.Row(s.name, c.fmt_s(s.median_s), c.spread_s(s), ratio, target, ok, note, rng)
                )
            title = (
                f"migrate --check, nothing pending: {shards} shards over {args.hosts} hosts, "
                f"median of {check_rounds} rounds"
            )
            c.print_table(title, rows, "floor")
            tables.append(rows)
            doc["check_rounds"] = check_rounds
            if against:
                doc["against"] = c.commit_of(against)
            doc["check"] = [row.figures(series[n]) for n, row in zip(names, rows)]
            doc["check_seconds"] = {n: series[n].seconds for n in names}

        # ---- 2. apply V0003 ---------------------------------------------------------------------------
        if "apply" not in skip:
            streams = args.streams or f.default_streams()
            names = (
                ["floor", "floor-par", "lib"]
                + ([] if "cli" in skip else ["cli"])
                + (["per-shard"] if args.per_shard else [])
            )
            labels = {
                "floor": "floor: psql -f per host, in parallel",
                "floor-par": f"parallel floor: {streams} psql -f per host",
                "lib": f"shardctl migrate (library, jobs {args.jobs or 'auto'})",
                "cli": "shardctl migrate (CLI process)",
                "per-shard": "per-shard txns, hosts in turn",
            }
            series = {n: c.Series(labels[n], work=shards) for n in names}
            v3_topo = c.load_topology(
                c.topology_for(
                    box, ["app"] * args.hosts, shards, name="render_v3", migrations="migrations_v3/"
                )
            )
            floor_files = f.write_floor_files(
                v3_topo, box.dir, "v3", control=False, create=False, versions={3}
            )
            par_files = f.write_floor_files(
                v3_topo,
                box.dir,
                "v3par",
                streams=streams,
                control=False,
                create=False,
                versions={3},
            )
            for r in range(rounds):
                for name in c.rotated(names, r):
                    dbs, path = fresh(f"v3{name.replace('-', '')}", "migrations_v3/")
                    try:
                        topo = c.load_topology(path)
                        c.checkpoint(ports)
                        if name == "floor":
                            seconds = f.run_floor(box, dbs, floor_files)
                        elif name == "floor-par":
                            seconds = f.run_floor(box, dbs, par_files)
                        elif name == "lib":
                            seconds, rep = c.timed(
                                functools.partial(migrate, topo, options=RunOptions(jobs=args.jobs))
                            )
                            if not rep.ok:
                                raise SystemExit(
                                    f"shardctl migrate failed: {json.dumps(rep.to_dict())[:2000]}"
                                )
                        elif name == "cli":
                            extra = ["--jobs", str(args.jobs)] if args.jobs else []
                            seconds, out = f.shardctl_cli(["migrate", "--json"] + extra, path)
                            if out.returncode != 0:
                                raise SystemExit(
                                    f"shardctl migrate (CLI) exited {out.returncode}: "
                                    f"{out.stderr[-1500:]}{out.stdout[-800:]}"
                                )
                        else:
                            seconds = f.per_shard_transactions(topo, create=False, above=2)
                        have = f.column_count(box, dbs, "photos", "location")
                        if have != shards:
                            raise SystemExit(
                                f"{labels[name]}: {have} photos tables have the new column, "
                                f"expected {shards}"
                            )
                    finally:
                        c.drop_databases(ports, dbs)
                    series[name].add(seconds)
                    c.log(f"apply round {r + 1}/{rounds}: {name} {seconds:.2f}s")
            rows = []
            par = series["floor-par"]
            for name in names:
                s = series[name]
                ratio = s.ratio_to(par, faster_is_higher=False)
                rng = c.ratio_range(s.ratios_to(par, faster_is_higher=False))
                one = s.ratio_to(series["floor"], faster_is_higher=False)
                note = f"{c.fmt_rate(s.median_rate, 'shards/s')}, {one:.2f}x the 1-stream floor"
                if name == "floor-par":
                    target, ok = "baseline", None
                elif name == "lib":
                    target, ok = "<= 1.25x parallel floor", ratio <= 1.25
                else:
                    target, ok = "(info)", None
                rows.append(
                    c.Row(s.name, c.fmt_s(s.median_s), c.spread_s(s), ratio, target, ok, note, rng)
                )
            c.print_table(
                f"migrate: apply {V3_NAME} to {shards} shards over {args.hosts} hosts, fresh copy "
                f"of the fleet per candidate, median of {rounds} rounds",
                rows,
                "parallel floor",
                [
                    (
                        "ratios are medians of per-round ratios (time / the parallel floor's time in the same "
                        "round); lower is better"
                    ),
                    f"parallel floor: {streams} streams per host",
                ],
            )
            tables.append(rows)
            doc["rounds"] = rounds
            doc["streams"] = streams
            doc["apply"] = [row.figures(series[n]) for n, row in zip(names, rows)]
            doc["apply_seconds"] = {n: series[n].seconds for n in names}
        c.drop_databases(ports, tpl)

    notes.append(c.machine_note())
    for n in notes:
        print(f"  {n}")
    doc["notes"] = notes
    c.save_run(args, doc)
    return c.verdict_exit(tables)


def _copy_each(ports: list[int], tag: str, templates: list[str]) -> list[str]:
    out = []
    for port, tpl in zip(ports, templates):
        out += c.create_databases([port], tag, template=tpl)
    return out


if __name__ == "__main__":
    sys.exit(main())
