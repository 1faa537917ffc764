#!/usr/bin/env python
"""Time to provision a fleet (default 8192 shards over 4 hosts) from empty databases.

Candidates, each on fresh databases (CREATE DATABASE per candidate and round on every server, DROP after):

* ``floor``            the same rendered SQL (control schema + every shard's render_shard + its migrations,
                       i.e. what ``shardctl render`` prints), one ``psql -f`` per host, all hosts in parallel;
* ``parallel floor``   the same SQL split into K files per host (K = this machine's cores, where the
                       sandbox servers run; ``--streams``), K ``psql -f`` per host at once: the hardware's floor;
* ``shardctl init``    the library call the CLI makes (``shardctl.ops.provision.init``);
* ``shardctl init (CLI)``  the ``shardctl init`` command in a new process, as a user runs it;
* ``per-shard txns``   the way schema-per-tenant tools do it: one connection and one transaction per shard,
                       hosts one after another.

Targets: shardctl init <= 1.1x the parallel floor (and <= 1.25x the one-stream floor), and >= 3x faster
than per-shard transactions. ``--jobs`` passes init's --jobs (default: shardctl's own rule, see docs/performance.md).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _fleet as f

TABLES_PER_SHARD = 3  # the example app: users, photos, likes


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--shards", type=int, default=None, help="Logical shards (default 8192, --quick 1024)."
    )
    p.add_argument("--hosts", type=int, default=4, help="PostgreSQL servers.")
    p.add_argument(
        "--batch-size", type=int, default=None, help="init's --batch-size (default: shardctl's)."
    )
    p.add_argument(
        "--skip", default="", help="Comma-separated candidates to leave out: cli, per-shard."
    )
    p.add_argument(
        "--streams", type=int, default=None, help="K of the parallel floor (default: cores)."
    )
    p.add_argument(
        "--jobs", type=int, default=None, help="init's --jobs (default: shardctl decides)."
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or 3)
    shards = args.shards or (1024 if args.quick else 8192)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    from shardctl.engine.defaults import DEFAULT_BATCH
    from shardctl.engine.executor import RunOptions
    from shardctl.ops.provision import init

    batch = args.batch_size or DEFAULT_BATCH
    streams = args.streams or f.default_streams()
    names = (
        ["floor", "floor-par", "init"]
        + ([] if "cli" in skip else ["cli"])
        + ([] if "per-shard" in skip else ["per-shard"])
    )
    labels = {
        "floor": "floor: psql -f per host, in parallel",
        "floor-par": f"parallel floor: {streams} psql -f per host",
        "init": f"shardctl init (library, batch {batch}, jobs {args.jobs or 'auto'})",
        "cli": "shardctl init (CLI process)",
        "per-shard": "per-shard txns, hosts in turn",
    }
    series = {n: c.Series(labels[n], work=shards) for n in names}
    notes: list[str] = []

    with c.sandbox(
        hosts=args.hosts,
        shards=min(shards, 8192),
        keep=args.keep,
        prefix="shardctl-bench-provision-",
        base=c.sandbox_base(args.tmp),
    ) as box:
        ports = [h.port for h in box.state.hosts]
        notes.append(f"sandbox in {box.dir} ({args.hosts} servers)")
        # The floor's SQL does not depend on the database names: render it once, outside the timings.
        dbs = ["app"] * args.hosts
        topo0 = c.load_topology(c.topology_for(box, dbs, shards, name="render"))
        started = time.perf_counter()
        floor_files = f.write_floor_files(topo0, box.dir, "floor")
        par_files = f.write_floor_files(topo0, box.dir, "par", streams=streams)
        size = sum(p.stat().st_size for files in floor_files for p in files)
        notes.append(
            f"floor SQL: {size / 1e6:.1f} MB in {len(floor_files)} files ({streams} per host for the "
            f"parallel floor), rendered in "
            f"{time.perf_counter() - started:.1f}s (not timed)"
        )

        for r in range(rounds):
            for name in c.rotated(names, r):
                dbs = c.create_databases(ports, name.replace("-", ""))
                try:
                    path = c.topology_for(box, dbs, shards, name=f"topo_{name}")
                    topo = c.load_topology(path)
                    c.checkpoint(ports)
                    if name == "floor":
                        seconds = f.run_floor(box, dbs, floor_files)
                    elif name == "floor-par":
                        seconds = f.run_floor(box, dbs, par_files)
                    elif name == "init":
                        seconds, report = c.timed(
                            functools.partial(
                                init, topo, options=RunOptions(batch_size=batch, jobs=args.jobs)
                            )
                        )
                        if not report.ok:
                            raise SystemExit(
                                f"shardctl init failed: {json.dumps(report.to_dict())[:2000]}"
                            )
                    elif name == "cli":
                        extra = ["--jobs", str(args.jobs)] if args.jobs else []
                        seconds, out = f.shardctl_cli(
                            ["init", "--json", "--batch-size", str(batch)] + extra, path
                        )
                        if out.returncode != 0:
                            raise SystemExit(
                                f"shardctl init (CLI) exited {out.returncode}: "
                                f"{out.stderr[-1500:]}{out.stdout[-1500:]}"
                            )
                    else:
                        seconds = f.per_shard_transactions(topo, create=True)
                    f.expect_fleet(box, dbs, topo, TABLES_PER_SHARD, labels[name])
                finally:
                    c.drop_databases(ports, dbs)
                series[name].add(seconds)
                c.log(f"round {r + 1}/{rounds}: {name} {seconds:.2f}s")

    floor, par = series["floor"], series["floor-par"]
    rows = []
    for name in names:
        s = series[name]
        ratio = s.ratio_to(par, faster_is_higher=False)
        rng = c.ratio_range(s.ratios_to(par, faster_is_higher=False))
        one = s.ratio_to(floor, faster_is_higher=False)
        target, ok, note = (
            "",
            None,
            f"{c.fmt_rate(s.median_rate, 'shards/s')}, {one:.2f}x the 1-stream floor",
        )
        if name == "floor-par":
            target = "baseline"
        elif name in ("init", "cli"):
            # The target is on the library call; the CLI row adds a Python start-up (~0.5 s) and is shown
            # for information.
            per = series.get("per-shard")
            target = "<= 1.1x par. floor, <= 1.25x floor" + (", >= 3x per-shard" if per else "")
            speedup = per.ratio_to(s, faster_is_higher=False) if per else None
            ok = ratio <= 1.1 and one <= 1.25 and (speedup is None or speedup >= 3.0)
            if name == "cli":
                target, ok = "(info) " + target, None
            if speedup is not None:
                note += f", {speedup:.1f}x faster than per-shard"
        rows.append(c.Row(s.name, c.fmt_s(s.median_s), c.spread_s(s), ratio, target, ok, note, rng))
    c.print_table(
        f"provision: {shards} shards over {args.hosts} hosts, fresh databases per candidate, "
        f"median of {rounds} rounds",
        rows,
        "parallel floor",
        [
            (
                "ratios are medians of per-round ratios (time / the parallel floor's time in the same round); "
                "lower is better"
            ),
            f"parallel floor: {streams} streams per host (this machine's cores)",
        ],
    )
    for n in notes + [c.machine_note()]:
        print(f"  {n}")
    c.save_run(
        args,
        {
            "shards": shards,
            "hosts": args.hosts,
            "rounds": rounds,
            "batch": batch,
            "streams": streams,
            "jobs": args.jobs,
            "seconds": {n: series[n].seconds for n in names},
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
