#!/usr/bin/env python
"""Time of ``verify`` (default 8192 shards over 4 hosts) with its reference schema, side by side with
an older commit's ``verify`` (default 1c0f17c, the majority comparison) on the same fleet.

One fleet is built with ``shardctl init`` (not timed), then each round times:

* ``verify``            the library call the CLI makes (``shardctl.ops.verify.verify``): every shard's
                        catalog fingerprint compared with a reference built from the migration files in
                        a scratch database (``ops/reference.py``; after the first round, the reference
                        kept on the host for these files, as every run after init reads it);
* ``reference``         building the reference alone on one host (``reference.build``), the kept one
                        deleted first;
* ``no schemas``        the same verify with ``schemas=False`` (IDs, bodies, placement only): the
                        difference is what the schema comparison costs;
* ``1 shard differs``   verify after one shard gets an extra column and loses an index (it must name
                        exactly that shard, with what differs);
* ``process``           ``shardctl verify`` as a process, this checkout;
* ``process @ base``    the same with the base commit's package first on PYTHONPATH (extracted with
                        ``git archive`` into a temp dir, or ``--against DIR``): the ratio is this
                        commit's time over the base's, per round.

Target: verify <= 2 s at 8192 shards on 4 hosts (the library call). The sandbox's servers share this
machine's cores with everything else running on it: read the ratio, paired by round.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

TARGET_S = 2.0
BASE = "1c0f17c"


def extract(rev: str, into: Path) -> Path:
    """The ``shardctl`` package (and its templates and migrations) of ``rev``, from ``git archive``."""
    archive = into / "base.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(c.REPO), "archive", rev, "shardctl", "templates", "migrations"],
            stdout=out,
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def run_process(topology: Path, env: dict) -> float:
    """Seconds of ``shardctl verify`` as a process (exit 0 required)."""
    argv = [sys.executable, "-m", "shardctl", "--config", str(topology), "verify"]
    seconds, proc = c.timed(
        lambda: subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])} exited {proc.returncode}: {proc.stderr[-500:]}")
    return seconds


def forget_reference(topo) -> None:
    """Delete the reference a run keeps on each host (ops/reference.py), if this shardctl keeps one."""
    from shardctl.engine import connections as db
    from shardctl.ops import reference

    key = getattr(reference, "REFERENCE_KEY", None)
    if key is None:
        return
    for host in topo.hosts:
        with db.connect(host, autocommit=True) as conn:
            conn.execute("DELETE FROM shardctl.meta WHERE key = %s", (key,))


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--shards", type=int, default=None, help="Logical shards (default 8192, --quick 1024)."
    )
    p.add_argument("--hosts", type=int, default=4, help="PostgreSQL servers.")
    p.add_argument("--base", default=BASE, help=f"Commit to compare with (default {BASE}).")
    p.add_argument("--against", metavar="DIR", help="A checkout to compare with instead of --base.")
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or 3)
    shards = args.shards or (1024 if args.quick else 8192)

    from shardctl.ops import reference
    from shardctl.ops.provision import init
    from shardctl.ops.verify import per_shard_functions, verify
    from shardctl.sql.host_migrations import host_for_topology
    from shardctl.sql.migrations import for_topology

    labels = {
        "verify": "verify (library), identical shards",
        "reference": "reference alone, one host (built, not the kept one)",
        "plain": "verify without schemas (schemas=False)",
        "differs": "verify (library), 1 shard differs",
        "process": "shardctl verify (process)",
        "base": "shardctl verify (process) @ base",
    }
    names = list(labels)
    series = {n: c.Series(labels[n], work=shards) for n in names}
    notes: list[str] = []

    with tempfile.TemporaryDirectory(prefix="shardctl-bench-base-") as tmp:
        base_dir = Path(args.against).resolve() if args.against else extract(args.base, Path(tmp))
        base_name = Path(args.against).name if args.against else args.base
        env = dict(os.environ, PYTHONPATH=str(c.REPO))
        base_env = dict(os.environ, PYTHONPATH=str(base_dir))
        for checkout_env in (env, base_env):  # as pip installs it: every module has its .pyc
            c.log(f"compiled {c.compile_package(checkout_env)}")
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
                path = c.topology_for(box, dbs, shards, name="topo_verify")
                topo = c.load_topology(path)
                seconds, report = c.timed(lambda: init(topo))
                if not report.ok:
                    raise SystemExit(f"shardctl init failed: {report.problems()}")
                notes.append(
                    f"init of {shards} shards over {args.hosts} hosts: {seconds:.1f}s (not timed)"
                )
                c.checkpoint(ports)
                migrations, host_level = for_topology(topo), host_for_topology(topo)
                per_shard = per_shard_functions(topo)
                victim = shards // 2

                def tamper(undo: bool) -> None:
                    from shardctl.engine import connections as db

                    s = topo.schema_name(victim)
                    sql = (
                        f"ALTER TABLE {s}.photos DROP COLUMN note; CREATE INDEX photos_user_id_idx ON "
                        f"{s}.photos (user_id, id DESC)"
                        if undo
                        else f"ALTER TABLE {s}.photos ADD COLUMN note text; DROP INDEX {s}.photos_user_id_idx"
                    )
                    with db.connect(topo.host_of(victim), autocommit=True) as conn:
                        conn.execute(sql)

                for r in range(rounds):
                    for name in c.rotated(names, r):
                        if name == "verify":
                            seconds, rep = c.timed(lambda: verify(topo))
                            if not rep.ok:
                                raise SystemExit(
                                    f"verify failed: {rep.violations[:3]} {rep.pending}"
                                )
                        elif name == "reference":
                            forget_reference(topo)  # the build itself, not the kept one
                            seconds, ref = c.timed(
                                lambda: reference.build(
                                    topo, topo.hosts[0], migrations, host_level, per_shard
                                )
                            )
                            if ref.error or len(ref.prints) != len(migrations) + 1:
                                raise SystemExit(f"reference not built: {ref.error}")
                        elif name == "plain":
                            seconds, rep = c.timed(lambda: verify(topo, schemas=False))
                            if not rep.ok:
                                raise SystemExit(f"verify failed: {rep.violations[:3]}")
                        elif name == "differs":
                            tamper(False)
                            try:
                                seconds, rep = c.timed(lambda: verify(topo))
                            finally:
                                tamper(True)
                            if {v.shard for v in rep.violations} != {victim}:
                                raise SystemExit(
                                    f"verify did not single out shard {victim}: {rep.violations[:3]}"
                                )
                            if r == 0:
                                notes.append(f"what it said: {rep.violations[0].reason}")
                        elif name == "process":
                            seconds = run_process(path, env)
                        else:
                            seconds = run_process(path, base_env)
                        series[name].add(seconds)
                        c.log(f"round {r + 1}/{rounds}: {name} {seconds:.2f}s")
            finally:
                c.drop_databases(ports, dbs)

    rows = []
    for name in names:
        s = series[name]
        target = name in ("verify", "differs")
        paired = name == "process"
        ratios = s.ratios_to(series["base"], faster_is_higher=False) if paired else []
        rows.append(
            c.Row(
                s.name,
                c.fmt_s(s.median_s),
                c.spread_s(s),
                c.median(ratios) if paired else None,
                f"<= {TARGET_S:.0f} s" if target else "(info: ratio = time / base's)",
                s.median_s <= TARGET_S if target else None,
                c.fmt_rate(s.median_rate, "shards/s"),
                c.ratio_range(ratios) if paired else None,
            )
        )
    c.print_table(
        f"verify: {shards} shards over {args.hosts} hosts, median of {rounds} rounds "
        f"(base: {base_name})",
        rows,
        "-",
    )
    for n in notes + [c.machine_note()]:
        print(f"  {n}")
    c.save_run(
        args,
        {
            "shards": shards,
            "hosts": args.hosts,
            "rounds": rounds,
            "base": base_name,
            "seconds": {n: series[n].seconds for n in names},
        },
    )
    return c.verdict_exit([rows])


if __name__ == "__main__":
    sys.exit(main())
