#!/usr/bin/env python
"""``status`` over a provisioned fleet (default 8192 shards over 4 hosts), side by side with another
checkout (``--against DIR``, e.g. ``git worktree add /tmp/base 1c0f17c``).

Setup (not timed): a sandbox, ``shardctl init`` of the fleet (this checkout's code), ``ANALYZE`` (as
autovacuum leaves a fleet in service; ``--no-analyze`` leaves it out). Then, in rounds
(the order rotating), each candidate runs in a process of its own with its checkout first on
PYTHONPATH: ``status(topo)`` in the library (the median of ``--calls`` calls after one that warms the
server's caches and, for this checkout, the control schema's fingerprint cache), and the
``shardctl status`` command as a new process. Target: the library call <= 0.2 s at 8192 shards over 4
hosts (issue #40: 1.4 s before, 0.18 s before the schema fingerprint was added to status).

The run is recorded in ``bench/results/status-<date>-<commit>.json`` (``--no-record`` skips it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

# Runs in the candidate's process: seconds of each status(topo) call after a warm-up one.
RUNNER = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from shardctl.model.topology import Topology
from shardctl.ops.status import status
topo = Topology.load(sys.argv[1])
first = status(topo)
times = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    report = status(topo)
    times.append(time.perf_counter() - started)
doc = report.to_dict()
print(json.dumps({"times": times, "ok": report.ok, "distinct": doc["distinct_schemas"]}))
"""
TARGET_S = 0.2


def library(path: Path, calls: int, env: dict) -> float:
    # cwd: not this checkout, whose shardctl package ``python -c`` would import ahead of PYTHONPATH
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path), str(calls)],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"status (library) failed: {out.stderr[-2000:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    if not doc["ok"] or doc["distinct"] != 1:
        raise SystemExit(f"status found a problem on a fresh fleet: {doc}")
    return c.median(doc["times"])


def process(path: Path, env: dict) -> float:
    seconds, out = c.timed(
        lambda: subprocess.run(
            [sys.executable, "-m", "shardctl", "--config", str(path), "status"],
            capture_output=True,
            text=True,
            env=env,
            cwd=path.parent,  # as above: PYTHONPATH decides which checkout runs
            check=False,
        )
    )
    if out.returncode != 0:
        raise SystemExit(f"shardctl status exited {out.returncode}: {out.stderr[-1500:]}")
    return seconds


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=None, help="Shards (default 8192, --quick 1024).")
    p.add_argument("--hosts", type=int, default=4, help="PostgreSQL servers.")
    p.add_argument("--calls", type=int, default=5, help="status() calls per library round.")
    p.add_argument("--against", metavar="DIR", help="Also run the checkout in DIR (the baseline).")
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="Measure on the catalogs' statistics of before init.",
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or 3)
    shards = args.shards or (1024 if args.quick else 8192)
    against = str(Path(args.against).resolve()) if args.against else None
    here, there = c.against_env(str(c.REPO)), c.against_env(against)
    base_label = f"@{c.commit_of(against)}" if against else ""
    from shardctl.ops.provision import init

    names = ["lib", "cli"] + (["lib_base", "cli_base"] if against else [])
    labels = {
        "lib": f"status(topo), library, {c.commit_of()}",
        "cli": f"shardctl status, process, {c.commit_of()}",
        "lib_base": f"status(topo), library, {base_label}",
        "cli_base": f"shardctl status, process, {base_label}",
    }
    series = {n: c.Series(labels[n]) for n in names}
    notes: list[str] = []
    with c.sandbox(
        hosts=args.hosts,
        shards=shards,
        keep=args.keep,
        prefix="shardctl-bench-status-",
        base=c.sandbox_base(args.tmp),
    ) as box:
        ports = [h.port for h in box.state.hosts]
        dbs = c.create_databases(ports, "st")
        path = c.topology_for(box, dbs, shards, name="status")
        seconds, report = c.timed(lambda: init(c.load_topology(path)))
        if not report.ok:
            raise SystemExit("setup: init failed")
        notes.append(f"setup: init of {shards} shards over {args.hosts} hosts in {seconds:.1f}s")
        # As autovacuum leaves a fleet in service: the catalogs' statistics cover its thousands of
        # shards (a fresh database's planner sees the near-empty catalogs of before init, and the
        # fingerprint query takes other, here faster, plans).
        if not args.no_analyze:
            for port, db in zip(ports, dbs):
                with c.connect(port, db) as conn:
                    conn.execute("ANALYZE")
            notes.append("setup: ANALYZE on every host after init (as autovacuum would)")
        for r in range(rounds):
            for name in c.rotated(names, r):
                env = there if name.endswith("_base") else here
                if name.startswith("lib"):
                    series[name].add(library(path, args.calls, env))
                else:
                    series[name].add(process(path, env))
            c.log(
                f"round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {series[n].seconds[-1] * 1000:.0f}ms" for n in names)
            )
    rows = []
    for name in names:
        s = series[name]
        twin = series.get(f"{name}_base") if not name.endswith("_base") else None
        ratio = s.ratio_to(twin, faster_is_higher=False) if twin else None
        rng = c.ratio_range(s.ratios_to(twin, faster_is_higher=False)) if twin else None
        target = f"<= {TARGET_S} s" if name == "lib" else ""
        ok = (s.median_s <= TARGET_S) if name == "lib" else None
        note = f"{base_label}'s time x {ratio:.2f}" if ratio is not None else ""
        rows.append(c.Row(s.name, c.fmt_s(s.median_s), c.spread_s(s), ratio, target, ok, note, rng))
    title = (
        f"status: {shards} shards over {args.hosts} hosts, median of {rounds} rounds "
        f"(ratio: this checkout's time / {base_label or 'itself'}'s)"
    )
    notes.append(c.machine_note())
    c.print_table(title, rows, base_label or "itself", notes)
    c.save_run(
        args,
        {
            "shards": shards,
            "hosts": args.hosts,
            "rounds": rounds,
            "calls": args.calls,
            "analyze": not args.no_analyze,
            "against": base_label.lstrip("@") or None,
            "candidates": [row.figures(series[n]) for n, row in zip(names, rows)],
            "seconds": {n: series[n].seconds for n in names},
            "notes": notes,
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
