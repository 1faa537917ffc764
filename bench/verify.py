#!/usr/bin/env python
"""Time of ``verify`` (default 8192 shards over 4 hosts), with its schema fingerprint.

One fleet is built with ``shardctl init`` (not timed), then each round times:

* ``fingerprint``  the fingerprint query alone (``sql/fingerprint.py``): one query per host for all its
                   shards, hosts in parallel (``for_each_host``);
* ``verify``       the library call the CLI makes (``shardctl.ops.verify.verify``) on the identical fleet;
* ``verify without fingerprints``  the same with ``schemas=False``: what verify cost before item 1 of
                   issue 26, measured in the same rounds (the difference is the fingerprint's cost);
* ``verify, 1 shard differs``  the same after one shard gets an extra column and loses an index: the
                   fingerprints differ, and verify reads that shard's objects and a majority shard's
                   to name the difference (it must find exactly that shard).

Target: verify <= 2 s at 8192 shards on 4 hosts. The sandbox's servers share this machine's cores with
everything else running on it, so the note also gives the fingerprint query's server CPU time (read from
/proc for each host's backend), which does not depend on the load.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

TARGET_S = 2.0


def backend_cpu(pid: int) -> float:
    """User + system CPU seconds a (local) server backend has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--shards", type=int, default=None, help="Logical shards (default 8192, --quick 1024)."
    )
    p.add_argument("--hosts", type=int, default=4, help="PostgreSQL servers.")
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or 3)
    shards = args.shards or (1024 if args.quick else 8192)

    from shardctl.engine import connections as db
    from shardctl.engine.fanout import for_each_host
    from shardctl.ops.provision import init
    from shardctl.ops.verify import verify
    from shardctl.sql.fingerprint import fingerprints

    names = ["fingerprint", "verify", "plain", "differs"]
    labels = {
        "fingerprint": "fingerprint query (all hosts)",
        "verify": "verify (library), identical shards",
        "plain": "verify without fingerprints (schemas=False)",
        "differs": "verify (library), 1 shard differs",
    }
    cpu: list[
        float
    ] = []  # server CPU seconds of the fingerprint query, summed over the hosts, per round
    series = {n: c.Series(labels[n], work=shards) for n in names}
    notes: list[str] = []

    with c.sandbox(
        hosts=args.hosts,
        shards=min(shards, 8192),
        keep=args.keep,
        prefix="shardctl-bench-verify-",
        base=c.sandbox_base(args.tmp),
    ) as box:
        ports = [h.port for h in box.state.hosts]
        dbs = c.create_databases(ports, "verify")
        try:
            topo = c.load_topology(c.topology_for(box, dbs, shards, name="topo_verify"))
            seconds, report = c.timed(lambda: init(topo))
            if not report.ok:
                raise SystemExit("shardctl init failed")
            notes.append(
                f"init of {shards} shards over {args.hosts} hosts: {seconds:.1f}s (not timed)"
            )
            c.checkpoint(ports)

            def prints(host) -> tuple[int, float]:
                with db.connect(host, autocommit=True, purpose="verify") as conn:
                    pid = conn.info.backend_pid
                    before = backend_cpu(pid)
                    found = len(fingerprints(conn, [topo.schema_name(n) for n in host.shards]))
                    return found, backend_cpu(pid) - before

            def tamper(undo: bool) -> None:
                victim = topo.schema_name(shards // 2)
                sql = (
                    f"ALTER TABLE {victim}.photos DROP COLUMN note; CREATE INDEX photos_user_id_idx ON "
                    f"{victim}.photos (user_id, id DESC)"
                    if undo
                    else f"ALTER TABLE {victim}.photos ADD COLUMN note text; DROP INDEX {victim}.photos_user_id_idx"
                )
                with db.connect(
                    topo.host_of(shards // 2), autocommit=True, purpose="verify"
                ) as conn:
                    conn.execute(sql)

            for r in range(rounds):
                for name in c.rotated(names, r):
                    if name == "fingerprint":
                        seconds, counts = c.timed(lambda: for_each_host(topo.hosts, prints))
                        if sum(n for n, _ in counts) != shards:
                            raise SystemExit(
                                f"fingerprints of {sum(n for n, _ in counts)} shards, expected {shards}"
                            )
                        cpu.append(sum(s for _, s in counts))
                    elif name == "verify":
                        seconds, rep = c.timed(lambda: verify(topo))
                        if not rep.ok or len(rep.schemas) != 1:
                            raise SystemExit(
                                f"verify of the identical fleet failed: {rep.violations[:3]}"
                            )
                    elif name == "plain":
                        seconds, rep = c.timed(lambda: verify(topo, schemas=False))
                        if not rep.ok or rep.schemas:
                            raise SystemExit(
                                f"verify without fingerprints failed: {rep.violations[:3]}"
                            )
                    else:
                        tamper(False)
                        try:
                            seconds, rep = c.timed(lambda: verify(topo))
                        finally:
                            tamper(True)
                        bad = {v.shard for v in rep.violations}
                        if bad != {shards // 2} or len(rep.schemas) != 2:
                            raise SystemExit(
                                f"verify did not single out shard {shards // 2}: {rep.violations[:3]}"
                            )
                        if r == 0:
                            notes.append(f"what it said: {rep.violations[0].reason}")
                    series[name].add(seconds)
                    c.log(f"round {r + 1}/{rounds}: {name} {seconds:.2f}s")
        finally:
            c.drop_databases(ports, dbs)

    rows = []
    for name in names:
        s = series[name]
        ok = s.median_s <= TARGET_S if name in ("verify", "differs") else None
        rows.append(
            c.Row(
                s.name,
                c.fmt_s(s.median_s),
                c.spread_s(s),
                None,
                f"<= {TARGET_S:.0f} s" if ok is not None else "(info)",
                ok,
                c.fmt_rate(s.median_rate, "shards/s"),
            )
        )
    c.print_table(
        f"verify: {shards} shards over {args.hosts} hosts, median of {rounds} rounds", rows, "-"
    )
    if cpu:
        notes.append(
            f"fingerprint query, server CPU summed over the {args.hosts} hosts: median "
            f"{c.median(cpu):.2f} s ({min(cpu):.2f}–{max(cpu):.2f}); on {os.cpu_count()} cores that is "
            f"{c.median(cpu) / min(args.hosts, os.cpu_count() or 1):.2f} s of wall time on an idle machine"
        )
    for n in notes + [c.machine_note()]:
        print(f"  {n}")
    c.save_run(
        args,
        {
            "shards": shards,
            "hosts": args.hosts,
            "rounds": rounds,
            "seconds": {n: series[n].seconds for n in names},
            "fingerprint_cpu": cpu,
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
