#!/usr/bin/env python
"""Cost of the Router per single-row insert, against plain psycopg on the same shard.

Candidates, each inserting ``--rows`` single rows into ``insta5.users`` (one shard of a sandbox fleet
initialised by ``shardctl init``; ids from the shard's next_id()):

* ``psycopg insert+commit``   the baseline: one connection, ``search_path`` set once, ``execute`` + ``commit``;
* ``psycopg autocommit``      the same connection settings in autocommit (informational: the floor);
* ``Router.execute``          ``router.execute(key, insert, params)``, key routing to shard 5;
* ``Router.run``              ``router.run(key, work)`` (a transaction and the session reset: informational).

Every connection uses the Router's own connection settings (connect timeout, keepalives,
tcp_user_timeout, statement_timeout, application_name). Candidates are interleaved over rounds
(order rotated); the figure is the median per-round ratio to the baseline.

Target: ``Router.execute`` <= 1.15x the baseline's time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SHARDS = 64
KEY = 5            # routes to shard 5 (integer keys: key % shard count)
INSERT = "INSERT INTO users (username) VALUES (%s)"
TARGET = 1.15


def plain(router, host, schema: str, rows: int, autocommit: bool) -> float:
    """Plain psycopg with the Router's connection settings: the time of ``rows`` inserts."""
    conn = router._connect(host, False)
    try:
        conn.autocommit = autocommit
        conn.execute("SELECT set_config('search_path', %s, false)", (f"{schema}, public",))
        if not autocommit:
            conn.commit()
        started = time.perf_counter()
        for i in range(rows):
            conn.execute(INSERT, (f"u{i}",))
            if not autocommit:
                conn.commit()
        return time.perf_counter() - started
    finally:
        conn.close()


def via_execute(router, rows: int) -> float:
    started = time.perf_counter()
    for i in range(rows):
        router.execute(KEY, INSERT, (f"u{i}",))
    return time.perf_counter() - started


def via_run(router, rows: int) -> float:
    started = time.perf_counter()
    for i in range(rows):
        router.run(KEY, lambda conn, i=i: conn.execute(INSERT, (f"u{i}",)))
    return time.perf_counter() - started


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000, help="Single-row inserts per candidate and round.")
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 5))
    rows = 2_000 if args.quick and args.rows == 10_000 else args.rows

    from shardctl.router import Router

    with c.sandbox(hosts=1, shards=SHARDS, keep=args.keep, prefix="shardctl-bench-router-",
                   base=c.sandbox_base(args.tmp, need_gb=1)) as box:
        init = subprocess.run([sys.executable, "-m", "shardctl", "--config", str(box.topology_path), "init"], check=False,
                              capture_output=True, text=True)
        if init.returncode != 0:
            raise SystemExit(f"shardctl init failed: {init.stdout}{init.stderr}")
        topo = c.load_topology(box.topology_path)
        host, schema = topo.host_of(KEY), topo.schema_name(KEY)
        series = {name: c.Series(name, work=rows) for name in
                  ("psycopg insert+commit", "psycopg autocommit", "Router.execute", "Router.run")}
        with Router(topo) as router:
            router.execute(KEY, INSERT, ("warm-up",))
            candidates = {
                "psycopg insert+commit": lambda: plain(router, host, schema, rows, False),
                "psycopg autocommit": lambda: plain(router, host, schema, rows, True),
                "Router.execute": lambda: via_execute(router, rows),
                "Router.run": lambda: via_run(router, rows),
            }
            for r in range(rounds):
                for name in c.rotated(list(candidates), r):
                    seconds = candidates[name]()
                    series[name].add(seconds)
                    c.log(f"round {r + 1}/{rounds} {name}: {seconds / rows * 1e6:.0f} µs/insert")
            stats = router.stats()[host.name]

    base = series["psycopg insert+commit"]
    table = []
    for name, s in series.items():
        ratios = s.ratios_to(base, faster_is_higher=False)
        ratio = s.ratio_to(base, faster_is_higher=False)
        target, ok = ("", None)
        if name == "Router.execute":
            target, ok = f"<= {TARGET:.2f}x baseline time", ratio <= TARGET
        table.append(c.Row(name, f"{s.median_s / rows * 1e6:.0f} µs/insert",
                           f"{min(s.seconds) / rows * 1e6:.0f} – {max(s.seconds) / rows * 1e6:.0f} µs",
                           None if s is base else ratio, target, ok,
                           ratio_range=None if s is base else c.ratio_range(ratios)))
    lat = stats["latency_ms"]
    notes = [f"{rows} single-row inserts per candidate and round, {rounds} rounds, shard {KEY} ({schema})",
             f"Router.stats() of the host afterwards: {stats['calls']} calls, {stats['connects']} connects, "
             f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, errors {stats['errors_total']}",
             c.machine_note()]
    c.print_table("Router overhead per single-row insert (time; lower is better)", table,
                  "psycopg insert+commit", notes)
    c.write_json(args.json_path, {"rows": rows, "rounds": rounds,
                                  "seconds": {k: v.seconds for k, v in series.items()}, "stats": stats})
    return c.verdict_exit([table])


if __name__ == "__main__":
    sys.exit(main())
