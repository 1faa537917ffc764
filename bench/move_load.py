"""move-shard under write load: the freeze, and what writers see, while 128 shards move.

    python bench/move_load.py [--mb 700] [--scale 1] [--compare-scale] [--rounds 1] [--rate 1200]
                              [--routers 4] [--threads 2] [--pause 0.002] [--pgbench RATE]
                              [--nice 1] [--copy-workers 4]

Starts its own two sandbox servers (in /dev/shm when it has room), provisions the fleet, loads
``--mb`` MB (times ``--scale``) of photos into the 128 shards of pg1 that move, then for each move:

- starts ``--routers`` writer processes (an app server each: its own ``Router`` over its OWN copy
  of the topology file, taken before the move and never updated), each running ``--threads``
  ``tests/load.py`` ``RouterWriters`` threads over every shard (moving and not), together
  ``--rate`` writes/s, each thread on its own schedule like ``pgbench -R`` (latency is measured from
  a write's actual start; ``--rate 0``: every thread writes as fast as it can, which saturates this
  2-core machine, so latencies then measure CPU queueing more than the move);
- optionally ``--pgbench RATE`` transactions/s more on the shards that do not move (tests/load.py
  ``Pgbench``, straight to the hosts);
- runs ``move_shards(...)`` to the other host (``--nice 1`` by default: on this 2-core machine the
  hosts and the app servers share the CPU, and at full speed the copy and the checks hold it from
  the writers for 100-180 ms at a time; ``--nice 0`` measures that), stops the writers, and checks that every
  acknowledged row is on its shard's current owner exactly once (none lost, none duplicated) and
  that no write failed.

Prints rows and MB moved, the write rate, the freeze (the move report's ``freeze_seconds``, from the
locks to the topology flip, and its steps), write latency max/p99 on the shards that do not move
(the whole move, and the writes under way in the freeze window), the longest write to a moving
shard, the load average, and the slowest writes placed among the move's steps.
``--compare-scale`` loads two sets of 128 shards, one of ``--mb`` and one of twice that, moves
them in turn (alternating order per round, back and forth between the hosts), and prints
freeze(2x) / freeze(1x). Exit code 1 when a target is missed:
freeze <= 1 s, freeze(2x)/freeze(1x) <= 1.2, non-moving writes <= 100 ms, 0 lost/dup/errors,
>= 1000 writes/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import results
from _common import sandbox_base
from move import load as load_rows
from move import measure
from support.load import Pgbench, RouterWriters, written_stats

from shardctl.dev.sandbox import Sandbox
from shardctl.model.topology import Topology
from shardctl.ops.move import MoveOptions, move_shards
from shardctl.ops.provision import init
from shardctl.router import Router

MOVE = 128

# A failed move raises without its report; keep a handle on the run to read its figures anyway.
import itertools

import shardctl.ops.move.api as _move_api

_LAST_RUN: dict = {}
_run_steps = _move_api._run_steps


def _spy_run_steps(run, steps):
    _LAST_RUN["run"] = run
    return _run_steps(run, steps)


_move_api._run_steps = _spy_run_steps
TARGETS = {"freeze_s": 1.0, "scale_ratio": 1.2, "still_ms": 100.0, "rate": 1000.0}


def loadavg() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


# ---- data ----------------------------------------------------------------------------------------


def fill(topo: Topology, shards: list[int], mb: float) -> None:
    """About ``mb`` MB of photos over ``shards``: calibrate bytes per row on the first shard, then
    load the rest with two connections."""
    probe = 2000
    load_rows(topo, shards[:1], probe)
    with psycopg.connect(**topo.host_of(shards[0]).connect_kwargs()) as conn:
        _, size = measure(conn, [topo.schema_name(shards[0])])
    rows = max(1, int(mb * 1e6 / len(shards) / (size / probe)))
    halves = [shards[1::2], shards[2::2]]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda part: load_rows(topo, part, rows) if part else None, halves))
    if rows > probe:
        load_rows(topo, shards[:1], rows - probe)
    _, got = size_of(topo, shards)
    if (
        got < 0.97 * mb * 1e6
    ):  # the probe shard's fixed overhead made the estimate per row too large
        more = int(rows * (mb * 1e6 - got) / got)
        with ThreadPoolExecutor(2) as pool:
            list(
                pool.map(
                    lambda part: load_rows(topo, part, more) if part and more else None, halves
                )
            )


def size_of(topo: Topology, shards: list[int]) -> tuple[int, int]:
    """(rows of photos, bytes of the shard schemas' tables) on the shards' current owner."""
    host = topo.host_of(shards[0])
    schemas = [topo.schema_name(n) for n in shards]
    with psycopg.connect(**host.connect_kwargs()) as conn:
        _, size = measure(conn, schemas)
        rows = conn.execute(
            "SELECT sum(n_live_tup)::bigint FROM pg_stat_user_tables WHERE schemaname = ANY(%s) "
            "AND relname = 'photos'",
            (schemas,),
        ).fetchone()[0]
    return int(rows or 0), size


def writer_rows(topo: Topology, shards: list[int], captions: list[str]) -> dict[int, list[int]]:
    """shard → ids of the rows these writers inserted (by their captions), on its current owner."""
    out: dict[int, list[int]] = {}
    by_host: dict[str, list[int]] = {}
    for n in shards:
        by_host.setdefault(topo.host_of(n).name, []).append(n)
    for name, ns in by_host.items():
        with psycopg.connect(**topo.host(name).connect_kwargs()) as conn:
            for n in ns:
                out[n] = [
                    r[0]
                    for r in conn.execute(
                        f"SELECT id FROM {topo.schema_name(n)}.photos WHERE caption = ANY(%s)",
                        (captions,),
                    )
                ]
    return out


# ---- writers: one process per app server -----------------------------------------------------------


def _app_server(
    topo_path: str, shards: list[int], threads: int, pause: float, rate: float, seed: int, conn
) -> None:
    """A writer process: its own Router on its own topology copy, RouterWriters threads until told to stop."""
    import warnings

    warnings.filterwarnings("ignore")
    topo = Topology.load(Path(topo_path))
    router = Router(topo, max_size=threads + 2)
    writers = RouterWriters(
        router, shards, topo.modulus, writers=threads, pause=pause, first=seed * 100, rate=rate
    )
    with writers:
        conn.send("started")
        conn.recv()  # "stop"
    router.close()
    conn.send((writers.written, writers.errors, writers.stopped - writers.started))
    conn.close()


class AppServers:
    """``n`` writer processes, each with a private copy of the topology file taken now."""

    def __init__(
        self,
        box: Sandbox,
        shards: list[int],
        n: int,
        threads: int,
        pause: float,
        run_no: int,
        rate: float = 0.0,
    ):
        self.dir = Path(tempfile.mkdtemp(prefix="appservers-", dir=box.dir))
        ctx = mp.get_context("fork")
        self.pipes, self.procs, self.captions = [], [], []
        for i in range(n):
            copy = self.dir / f"app{i}.yaml"
            shutil.copy(box.topology_path, copy)
            parent, child = ctx.Pipe()
            seed = run_no * 50 + i + 1
            proc = ctx.Process(
                target=_app_server,
                args=(str(copy), shards, threads, pause, rate / (n * threads), seed, child),
                daemon=True,
            )
            self.captions += [
                f"writer {w}" for w in range(seed * 100, seed * 100 + threads)
            ]  # RouterWriters
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for p in self.pipes:
            p.recv()
        self.written: list[tuple[int, int, float, float]] = []
        self.errors: list[str] = []
        self.seconds = 0.0

    def stop(self) -> None:
        for p in self.pipes:
            p.send("stop")
        for p, proc in zip(self.pipes, self.procs):
            written, errors, seconds = p.recv()
            self.written += written
            self.errors += errors
            self.seconds = max(self.seconds, seconds)
            proc.join(timeout=30)


# ---- one move under load ---------------------------------------------------------------------------


def longest_gap(written: list, shards: set[int]) -> float:
    ends = sorted(r[3] for r in written if r[1] in shards)
    return max((b - a for a, b in itertools.pairwise(ends)), default=0.0)


def check_rows(topo: Topology, written: list, shards: list[int], captions: list[str]) -> dict:
    """Every acknowledged row exactly once on its shard's current owner; no writer row nobody acknowledged."""
    found = writer_rows(topo, shards, captions)
    acked: dict[int, list[int]] = {}
    for new_id, shard, _, _ in written:
        acked.setdefault(shard, []).append(new_id)
    lost = dup = unexpected = 0
    lost_ids: set[int] = set()
    for n in shards:
        have, want = found.get(n, []), set(acked.get(n, []))
        dup += len(have) - len(set(have))
        lost += len(want - set(have))
        lost_ids |= want - set(have)
        unexpected += len(set(have) - want)
    # When each lost write was under way (time.time()), to place it among the move's phases.
    sample = sorted((round(r[2], 3), round(r[3], 3), r[1]) for r in written if r[0] in lost_ids)
    return {
        "lost": lost,
        "duplicated": dup,
        "unacknowledged_rows": unexpected,
        "lost_writes": sample,
    }


class Steps:
    """The move's progress steps as they change (``time.time()``, step name): to place a slow write."""

    def __init__(self) -> None:
        self.changes: list[tuple[float, str]] = []

    def seen(self, step: str, done: int, total: int, note: str) -> None:
        label = f"{step} {note}".strip() if step == "verify" else step
        if not self.changes or self.changes[-1][1] != label:
            self.changes.append((time.time(), label))

    def at(self, when: float) -> str:
        names = [step for t, step in self.changes if t <= when]
        return names[-1] if names else "-"


def one_move(box: Sandbox, args, moving: list[int], target: str, label: str, run_no: int) -> dict:
    topo = Topology.load(box.topology_path)
    everything = sorted(n for h in topo.hosts for n in h.shards)
    still = set(everything) - set(moving)
    rows, size = size_of(topo, moving)
    bench = None
    apps = AppServers(box, everything, args.routers, args.threads, args.pause, run_no, args.rate)
    if args.pgbench:
        by_host = {h.name: sorted(still & set(h.shards)) for h in topo.hosts}
        # Pgbench draws from a contiguous range per host: keep the longest run of non-moving shards.
        bench = Pgbench(
            topo,
            rate=args.pgbench,
            clients=2,
            shards={k: _longest_run(v) for k, v in by_host.items() if v},
        ).__enter__()
    load_before = loadavg()
    w0 = time.time()
    time.sleep(args.warmup)
    t0 = time.time()
    error = None
    steps = Steps()
    try:
        report = move_shards(
            Topology.load(box.topology_path),
            moving,
            target,
            options=MoveOptions(
                max_freeze=args.max_freeze, copy_workers=args.copy_workers, nice=args.nice
            ),
            progress=steps.seen,
        )
    except Exception as exc:  # noqa: BLE001 - report it with the load figures
        run = _LAST_RUN.pop("run", None)
        report, error = (dict(run.report) if run else {}), f"{type(exc).__name__}: {exc}"
    move_s = time.time() - t0
    time.sleep(args.cooldown)
    load_during = loadavg()
    apps.stop()
    if bench is not None:
        bench.stop()
    final = Topology.load(box.topology_path)
    checked = check_rows(final, apps.written, everything, apps.captions)
    f0, f1 = report.get("freeze_started_at"), report.get("freeze_ended_at")
    st_all = written_stats(apps.written, apps.errors, apps.seconds)
    st_still = written_stats(apps.written, apps.errors, apps.seconds, still, t0, t0 + move_s)
    st_still_f = (
        written_stats(apps.written, apps.errors, apps.seconds, still, f0, f1) if f0 else None
    )
    st_moving = written_stats(apps.written, apps.errors, apps.seconds, set(moving), t0, t0 + move_s)
    doc = {
        "label": label,
        "nice": args.nice,
        "copy_workers": args.copy_workers,
        "rested_seconds": report.get("rested_seconds"),
        "target": target,
        "shards": len(moving),
        "rows": rows,
        "megabytes": round(size / 1e6, 1),
        "move_seconds": round(move_s, 2),
        "error": error,
        "write_rate": round(st_all.rate, 1),
        "write_rate_before_move": round(
            sum(1 for r in apps.written if w0 + 0.5 <= r[3] < t0) / (t0 - w0 - 0.5), 1
        ),
        "writes": st_all.ops,
        "write_errors": len(apps.errors),
        "errors_sample": apps.errors[:3],
        **checked,
        "freeze_seconds": report.get("freeze_seconds"),
        **{k: v for k, v in report.items() if k.startswith("freeze_") and k.endswith("_seconds")},
        **{
            k: report.get(k)
            for k in (
                "prepare_seconds",
                "sync_seconds",
                "verify_before_seconds",
                "verify_after_seconds",
                "messages",
            )
        },
        "still_max_ms": round(st_still.max_ms, 1),
        "still_p99_ms": round(st_still.percentile_ms(0.99), 1),
        "still_writes": st_still.ops,
        "still_freeze_max_ms": round(st_still_f.max_ms, 1) if st_still_f else None,
        "still_freeze_p99_ms": round(st_still_f.percentile_ms(0.99), 1) if st_still_f else None,
        "still_freeze_writes": st_still_f.ops if st_still_f else None,
        "moving_max_ms": round(st_moving.max_ms, 1),
        "moving_p99_ms": round(st_moving.percentile_ms(0.99), 1),
        "moving_longest_gap_ms": round(longest_gap(apps.written, set(moving)) * 1000, 1),
        "load_before": load_before,
        "load_after": load_during,
        "freeze_at": round(f0 - t0, 2) if f0 else None,  # seconds after the move started
        # When the slowest writes to non-moving shards started (seconds after the move started), and took.
        "still_slowest": [
            (round(a - t0, 2), round((b - a) * 1000), steps.at(a))
            for _, n, a, b in sorted(
                (r for r in apps.written if r[1] in still and t0 <= r[3] and r[2] <= t0 + move_s),
                key=lambda r: r[2] - r[3],
            )[:8]
        ],
        "steps": [(round(t - t0, 2), step) for t, step in steps.changes],
    }
    doc["lost_writes"] = [(round(a - t0, 3), round(b - t0, 3), n) for a, b, n in doc["lost_writes"]]
    if bench is not None:
        pst = bench.stats()
        pf = bench.stats(f0, f1) if f0 else None
        doc.update(
            {
                "pgbench_rate": round(pst.rate, 1),
                "pgbench_failed": pst.failed,
                "pgbench_errors": pst.errors[:3],
                "pgbench_max_ms": round(pst.max_ms, 1),
                "pgbench_p99_ms": round(pst.percentile_ms(0.99), 1),
                "pgbench_freeze_max_ms": round(pf.max_ms, 1) if pf else None,
                "pgbench_lag_max_ms": round(max(pst.lags, default=0) * 1000, 1),
            }
        )
    shutil.rmtree(apps.dir, ignore_errors=True)
    return doc


def _longest_run(ns: list[int]) -> list[int]:
    best, cur = [], []
    for n in ns:
        cur = cur + [n] if cur and n == cur[-1] + 1 else [n]
        if len(cur) > len(best):
            best = cur
    return best


def show(doc: dict) -> None:
    steps = ", ".join(
        f"{k[7:-8]} {doc[k]}"
        for k in sorted(doc)
        if k.startswith("freeze_")
        and k.endswith("_seconds")
        and k != "freeze_seconds"
        and doc[k] is not None
    )
    print(
        f"[{doc['label']}] --nice {doc['nice']:g} --copy-workers {doc['copy_workers']}: "
        f"{doc['shards']} shards, {doc['rows']} rows, {doc['megabytes']} MB → {doc['target']} "
        f"in {doc['move_seconds']}s (prepare {doc['prepare_seconds']}, "
        f"sync {doc['sync_seconds']}, verify before "
        f"{doc['verify_before_seconds']}, verify after {doc['verify_after_seconds']})"
        + (f"  MOVE FAILED: {doc['error']}" if doc["error"] else "")
    )
    print(f"  freeze {doc['freeze_seconds']}s  (steps from its start: {steps})")
    print(
        f"  writes {doc['writes']} at {doc['write_rate']}/s "
        f"(before the move {doc['write_rate_before_move']}/s); "
        f"lost {doc['lost']}, duplicated {doc['duplicated']}, "
        f"errors {doc['write_errors']}, unacknowledged rows {doc['unacknowledged_rows']}"
        + (f"  e.g. {doc['errors_sample']}" if doc["errors_sample"] else "")
    )
    if doc["lost_writes"]:
        print(
            f"  lost writes (started, acknowledged: seconds after the move started; shard): "
            f"{doc['lost_writes'][:10]}; the freeze started at {doc['freeze_at']}s"
        )
    print(
        f"  non-moving shards: whole move max {doc['still_max_ms']} ms p99 {doc['still_p99_ms']} ms "
        f"({doc['still_writes']} writes); in the freeze max {doc['still_freeze_max_ms']} ms p99 "
        f"{doc['still_freeze_p99_ms']} ms ({doc['still_freeze_writes']} writes)"
    )
    print(
        f"  slowest non-moving writes (started s after the move's start, ms, step): {doc['still_slowest']}"
    )
    print(f"  steps (s after the move's start): {doc['steps']}")
    print(
        f"  moving shards: longest write {doc['moving_max_ms']} ms, p99 {doc['moving_p99_ms']} ms, longest gap "
        f"between acknowledged writes {doc['moving_longest_gap_ms']} ms"
    )
    if "pgbench_rate" in doc:
        print(
            f"  pgbench (non-moving shards): {doc['pgbench_rate']}/s, failed {doc['pgbench_failed']}, max "
            f"{doc['pgbench_max_ms']} ms, p99 {doc['pgbench_p99_ms']} ms, in the freeze max "
            f"{doc['pgbench_freeze_max_ms']} ms (client schedule lag max {doc['pgbench_lag_max_ms']} ms)"
            + (f" {doc['pgbench_errors']}" if doc["pgbench_errors"] else "")
        )
    print(f"  load average before {doc['load_before']}, after {doc['load_after']}")


def verdicts(docs: list[dict], compare: bool) -> list[str]:
    missed = []
    for d in docs:
        if d["error"]:
            missed.append(f"{d['label']}: move failed")
        if (d["freeze_seconds"] or 1e9) > TARGETS["freeze_s"]:
            missed.append(f"{d['label']}: freeze {d['freeze_seconds']}s > 1 s")
        if d["lost"] or d["duplicated"] or d["write_errors"]:
            missed.append(
                f"{d['label']}: lost/dup/errors {d['lost']}/{d['duplicated']}/{d['write_errors']}"
            )
        if d["still_max_ms"] > TARGETS["still_ms"]:
            missed.append(f"{d['label']}: non-moving write max {d['still_max_ms']} ms > 100 ms")
        if d["write_rate"] < TARGETS["rate"]:
            missed.append(f"{d['label']}: write rate {d['write_rate']}/s < 1000/s")
    return missed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--mb", type=float, default=700, help="MB loaded into the 128 moving shards (at --scale 1)"
    )
    ap.add_argument("--scale", type=float, default=1, help="multiply --mb (2: the doubled run)")
    ap.add_argument(
        "--compare-scale", action="store_true", help="two shard sets, --mb and 2x, moved in turn"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="with --compare-scale: back-and-forth rounds"
    )
    ap.add_argument("--still", type=int, default=128, help="non-moving shards on the source host")
    ap.add_argument(
        "--routers", type=int, default=4, help="writer processes (app servers), one Router each"
    )
    ap.add_argument(
        "--threads", type=int, default=4, help="RouterWriters threads per writer process"
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=1200,
        help="writes/s of all writer threads together, each on a schedule (0: as fast as they can)",
    )
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="with --rate 0: sleep of a writer thread after each write",
    )
    ap.add_argument(
        "--pgbench", type=int, default=0, help="also pgbench at this rate on non-moving shards"
    )
    ap.add_argument("--max-freeze", type=float, default=5.0)
    ap.add_argument(
        "--copy-workers",
        type=int,
        default=MoveOptions.copy_workers,
        help="the move's --copy-workers",
    )
    ap.add_argument(
        "--nice",
        type=float,
        default=1.0,
        help="the move's --nice (rest per second of copy and checks; 0: full speed)",
    )
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--cooldown", type=float, default=2.0)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", metavar="FILE")
    results.add_option(ap)
    args = ap.parse_args()

    sets = 2 if args.compare_scale else 1
    source_shards = MOVE * sets + args.still
    base = sandbox_base(
        args.tmp, need_gb=args.mb * args.scale * (3 if args.compare_scale else 1) * 4 / 1000
    )
    box = Sandbox(Path(tempfile.mkdtemp(prefix="shardctl-bench-moveload-", dir=base)))
    docs: list[dict] = []
    try:
        box.up(hosts=2, shards=source_shards * 2)
        topo = Topology.load(box.topology_path)
        init(topo).raise_for_status()
        pg1 = topo.host("pg1").shards
        groups = {"1x": pg1[:MOVE]}
        if args.compare_scale:
            groups["2x"] = pg1[MOVE : 2 * MOVE]
        t = time.time()
        for label, shards in groups.items():
            fill(topo, shards, args.mb * args.scale * (2 if label == "2x" else 1))
        with psycopg.connect(**topo.host("pg1").connect_kwargs(), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        print(f"loaded in {time.time() - t:.0f}s; load average {loadavg()}", flush=True)
        where = {label: "pg1" for label in groups}
        run_no = 0
        for r in range(args.rounds):
            order = list(groups) if r % 2 == 0 else list(reversed(groups))
            for label in order:
                target = "pg2" if where[label] == "pg1" else "pg1"
                doc = one_move(
                    box,
                    args,
                    groups[label],
                    target,
                    label if args.compare_scale else f"{args.scale:g}x",
                    run_no,
                )
                doc["round"] = r + 1
                run_no += 1
                where[label] = target
                docs.append(doc)
                show(doc)
                sys.stdout.flush()
    finally:
        box.destroy()
    missed = verdicts(docs, args.compare_scale)
    summary: dict = {"moves": docs}
    if args.compare_scale:
        f1 = [d["freeze_seconds"] for d in docs if d["label"] == "1x" and d["freeze_seconds"]]
        f2 = [d["freeze_seconds"] for d in docs if d["label"] == "2x" and d["freeze_seconds"]]
        if f1 and f2:
            import statistics

            ratio = statistics.median(f2) / statistics.median(f1)
            summary["freeze_ratio_2x_1x"] = round(ratio, 2)
            print(
                f"freeze(2x)/freeze(1x) = {statistics.median(f2)}/{statistics.median(f1)} = {ratio:.2f} "
                f"(target <= {TARGETS['scale_ratio']})"
            )
            if ratio > TARGETS["scale_ratio"]:
                missed.append(f"freeze ratio {ratio:.2f} > 1.2")
    summary["missed"] = missed
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if not args.no_record:
        results.record("move_load", summary)
    print("targets missed: " + "; ".join(missed) if missed else "all targets met")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
