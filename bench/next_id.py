#!/usr/bin/env python
"""Insert throughput of identical tables whose id defaults to different ID generators.

Candidates (one table each, ``id <type> PRIMARY KEY DEFAULT <generator>, payload int``):

* ``bigserial``                    the baseline;
* ``next_id() sql``                shardctl's inlinable SQL flavour, rendered by shardctl.sql.render for a real shard;
* ``next_id() plpgsql``            shardctl's PL/pgSQL flavour, rendered the same way;
* ``seed next_id() (2012 blog)``   the 3-statement PL/pgSQL function of Instagram's 2012 post;
* ``uuidv7()``                     where the server has it (PostgreSQL 18 does);
* ``gen_random_uuid()``.

Workloads: ``bulk`` (INSERT ... SELECT of 1000 rows per statement, one connection) and
``single`` (single-row INSERTs from 4 concurrent connections, driven by pgbench).

Targets (bulk): sql >= 0.90x bigserial, plpgsql >= 0.75x bigserial, both ahead of uuidv7().
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SHARD = 4242  # a real shard of an 8192-shard instagram fleet
SHARD_COUNT = 8192
ROWS_PER_STATEMENT = 1000

SEED_FUNCTION = """
CREATE SCHEMA IF NOT EXISTS seed{shard};
CREATE SEQUENCE IF NOT EXISTS seed{shard}.table_id_seq CACHE 1;
-- Instagram's 2012 blog post, verbatim except '%%' (a Python-escaping artefact) written as '%'
-- and the epoch/shard of this benchmark's fleet.
CREATE OR REPLACE FUNCTION seed{shard}.next_id(OUT result bigint) AS $$
DECLARE
    our_epoch bigint := {epoch_ms};
    seq_id bigint;
    now_millis bigint;
    shard_id int := {shard};
BEGIN
    SELECT nextval('seed{shard}.table_id_seq') % 1024 INTO seq_id;

    SELECT FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) INTO now_millis;
    result := (now_millis - our_epoch) << 23;
    result := result | (shard_id << 10);
    result := result | (seq_id);
END;
$$ LANGUAGE PLPGSQL;
"""


class Candidate:
    def __init__(self, key: str, label: str, column: str):
        self.key = key
        self.label = label
        self.column = column  # the id column definition
        self.table = f"bench.t_{key}"


def setup(conn, box, version: int) -> tuple[list[Candidate], list[str]]:
    """Create the generators and one identical table per candidate. Returns (candidates, notes)."""
    from shardctl.sql.render import render_shard

    notes = []
    candidates = [Candidate("bigserial", "bigserial", "id bigserial PRIMARY KEY")]
    for flavour in ("sql", "plpgsql"):
        path = c.topology_for(
            box,
            ["app"],
            SHARD_COUNT,
            function=flavour,
            name=f"nid_{flavour}",
            schema=f"nid_{flavour}_{{n}}",
        )
        topo = c.load_topology(path)
        conn.execute(render_shard(topo, SHARD))
        schema = topo.schema_name(SHARD)
        candidates.append(
            Candidate(
                f"nextid_{flavour}",
                f"next_id() {flavour}",
                f"id bigint PRIMARY KEY DEFAULT {schema}.next_id()",
            )
        )
        epoch_ms = topo.layout.epoch_ms
    conn.execute(SEED_FUNCTION.format(shard=SHARD, epoch_ms=epoch_ms))
    candidates.append(
        Candidate(
            "seed",
            "seed next_id() (2012 blog)",
            f"id bigint PRIMARY KEY DEFAULT seed{SHARD}.next_id()",
        )
    )
    has_v7 = conn.execute("SELECT to_regprocedure('uuidv7()') IS NOT NULL").fetchone()[0]
    if has_v7:
        candidates.append(Candidate("uuidv7", "uuidv7()", "id uuid PRIMARY KEY DEFAULT uuidv7()"))
    else:
        notes.append(f"uuidv7() skipped: server {version} does not have it (PostgreSQL 18 does)")
    candidates.append(
        Candidate("uuidv4", "gen_random_uuid()", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()")
    )
    conn.execute("CREATE SCHEMA bench")
    for cand in candidates:
        # autovacuum off: an autovacuum/analyze of one candidate's table must not run during another's turn.
        conn.execute(
            f"CREATE TABLE {cand.table} ({cand.column}, payload int NOT NULL) "
            f"WITH (autovacuum_enabled = off)"
        )
    # Is the SQL flavour really inlined? Its call must not appear in the plan.
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            "EXPLAIN VERBOSE INSERT INTO bench.t_nextid_sql (payload) SELECT g FROM generate_series(1, 10) g"
        )
    )
    inlined = "next_id()" not in plan
    notes.append(
        "next_id() sql flavour is inlined by the planner"
        if inlined
        else "WARNING: next_id() sql flavour is NOT inlined (the plan calls the function)"
    )
    # And do the rendered functions mint IDs of this shard?
    for flavour in ("sql", "plpgsql"):
        value = conn.execute(f"SELECT nid_{flavour}_{SHARD}.next_id()").fetchone()[0]
        if (value >> 10) & 8191 != SHARD:
            raise SystemExit(
                f"next_id() {flavour} minted {value}, which is not an ID of shard {SHARD}"
            )
    return candidates, notes


def reset(conn, candidates: list[Candidate]) -> None:
    conn.execute("TRUNCATE " + ", ".join(cand.table for cand in candidates))
    conn.execute("CHECKPOINT")


def bulk_round(
    conn, candidates: list[Candidate], statements: int, chunk: int, round_no: int
) -> dict[str, float]:
    """One round of the bulk workload: seconds per candidate.

    The candidates take turns every ``chunk`` statements (the order rotates), so a burst of load from
    other programs on the machine hits every candidate alike, and all tables grow in step.
    """
    sql = {
        cand.key: f"INSERT INTO {cand.table} (payload) SELECT g FROM generate_series(1, {ROWS_PER_STATEMENT}) g"
        for cand in candidates
    }
    reset(conn, candidates)
    for cand in candidates:  # warm: plan, catalog caches, first pages (not timed)
        conn.execute(sql[cand.key])
    spent = {cand.key: 0.0 for cand in candidates}
    done = 0
    turn = round_no
    import psycopg

    while done < statements:
        k = min(chunk, statements - done)
        for cand in c.rotated(candidates, turn):
            text = sql[cand.key]
            started = time.perf_counter()
            try:
                for _ in range(k):
                    conn.execute(text)
            except psycopg.errors.UniqueViolation as exc:
                # One backend minted more than 1024 IDs of one shard within a millisecond: the layout's
                # hard limit (IDs per ms per shard), reached by a fast enough machine. Say so instead
                # of a traceback.
                raise SystemExit(
                    f"{cand.label}: duplicate id ({exc.diag.message_primary}): this machine inserts "
                    f"more than 1024 rows per ms per shard, the instagram layout's limit; use "
                    f"fewer rows per statement or a layout with more sequence bits"
                ) from None
            spent[cand.key] += time.perf_counter() - started
        done += k
        turn += 1
    for cand in candidates:
        count = conn.execute(f"SELECT count(*) FROM {cand.table}").fetchone()[0]
        if count != (statements + 1) * ROWS_PER_STATEMENT:
            raise SystemExit(
                f"{cand.label}: expected {(statements + 1) * ROWS_PER_STATEMENT} rows, found {count}"
            )
    return spent


_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_TX = re.compile(r"number of transactions actually processed: (\d+)")


def run_single_pgbench(
    bin_dir: str, port: int, cand: Candidate, clients: int, seconds: float, script_dir: Path
) -> tuple[float, int]:
    """Rows per second of single-row autocommit INSERTs from ``clients`` connections (pgbench)."""
    script = script_dir / f"{cand.key}.sql"
    script.write_text(f"INSERT INTO {cand.table} (payload) VALUES (:client_id);\n")
    args = [
        str(Path(bin_dir) / "pgbench"),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-U",
        "postgres",
        "app",
    ]
    out = subprocess.run(
        args, capture_output=True, text=True, timeout=seconds * 10 + 60, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"pgbench failed for {cand.label}: {out.stderr[-1500:]}")
    tps = float(_TPS.search(out.stdout).group(1))
    tx = int(_TX.search(out.stdout).group(1))
    return tps, tx


def run_single_threads(
    port: int, cand: Candidate, clients: int, seconds: float
) -> tuple[float, int]:
    """Fallback without pgbench: ``clients`` psycopg connections in threads (client-bound on 2 cores)."""
    import psycopg

    counts = [0] * clients
    stop = time.perf_counter() + seconds
    barrier = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        with psycopg.connect(
            c.admin_dsn(port, "app"), autocommit=True, prepare_threshold=0
        ) as conn:
            barrier.wait()
            n = 0
            while time.perf_counter() < stop:
                conn.execute(f"INSERT INTO {cand.table} (payload) VALUES (%s)", (i,))
                n += 1
            counts[i] = n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return sum(counts) / elapsed, sum(counts)


def main() -> int:
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--statements",
        type=int,
        default=None,
        help=f"bulk: INSERT ... SELECT statements of {ROWS_PER_STATEMENT} rows per candidate per round "
        "(default 200, --quick 60)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=10,
        help="bulk: statements a candidate runs before the next one takes its turn",
    )
    p.add_argument(
        "--single-seconds",
        type=float,
        default=None,
        help="single-row: seconds per candidate per round (default 1: short turns, many rounds)",
    )
    p.add_argument(
        "--single-rounds", type=int, default=None, help="single-row: rounds (default 15, --quick 5)"
    )
    p.add_argument("--clients", type=int, default=4, help="single-row: concurrent connections")
    p.add_argument("--workloads", default="bulk,single", help="comma-separated: bulk, single")
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 7))
    statements = args.statements or (60 if args.quick else 200)
    single_s = args.single_seconds or 1
    single_rounds = c.check_rounds(args.single_rounds or (5 if args.quick else 15))
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in ("bulk", "single"):
            p.error(f"unknown workload {w!r}")

    results: dict[str, dict[str, c.Series]] = {}
    notes: list[str] = []
    with c.sandbox(
        hosts=1,
        shards=8,
        keep=args.keep,
        prefix="shardctl-bench-nextid-",
        base=c.sandbox_base(args.tmp, need_gb=1),
    ) as box:
        state = box.state
        port = state.hosts[0].port
        version = c.server_version(port)
        pgbench = Path(state.bin_dir) / "pgbench"
        with c.connect(port, "app") as conn:
            candidates, setup_notes = setup(conn, box, version)
            notes += [f"PostgreSQL {version // 10000}.{version % 100}"] + setup_notes
            if "bulk" in workloads:
                series = {
                    cand.key: c.Series(cand.label, work=statements * ROWS_PER_STATEMENT)
                    for cand in candidates
                }
                for r in range(rounds):
                    spent = bulk_round(conn, candidates, statements, args.chunk, r)
                    for cand in candidates:
                        series[cand.key].add(spent[cand.key])
                    c.log(
                        f"bulk round {r + 1}/{rounds}: "
                        + ", ".join(
                            f"{cand.key} {c.fmt_rate(series[cand.key].rates[-1], 'rows/s')}"
                            for cand in candidates
                        )
                    )
                results["bulk"] = series
            if "single" in workloads:
                series = {cand.key: c.Series(cand.label) for cand in candidates}
                driver = "pgbench -M prepared" if pgbench.exists() else "psycopg threads"
                with tempfile.TemporaryDirectory() as tmp:
                    for r in range(single_rounds):
                        for cand in c.rotated(candidates, r):
                            reset(conn, [cand])
                            if pgbench.exists():
                                rate, _ = run_single_pgbench(
                                    state.bin_dir, port, cand, args.clients, single_s, Path(tmp)
                                )
                            else:
                                rate, _ = run_single_threads(port, cand, args.clients, single_s)
                            # store as seconds per row so Series.rates gives rows/s
                            series[cand.key].add(1.0 / rate)
                        c.log(
                            f"single round {r + 1}/{single_rounds}: "
                            + ", ".join(
                                f"{cand.key} {c.fmt_rate(series[cand.key].rates[-1], 'rows/s')}"
                                for cand in candidates
                            )
                        )
                results["single"] = series
                notes.append(
                    f"single-row: {args.clients} connections, {driver}, {single_s:g}s per candidate "
                    f"per round, one autocommit INSERT per transaction"
                )

    tables = []
    doc = {
        "rounds": rounds,
        "statements": statements,
        "rows_per_statement": ROWS_PER_STATEMENT,
        "results": {},
    }
    for workload, series in results.items():
        base = series["bigserial"]
        v7 = series.get("uuidv7")
        rows = []
        for key, s in series.items():
            rate = s.median_rate
            ratio = s.ratio_to(base)
            vs_v7 = s.ratio_to(v7) if v7 else None
            target, ok, note = "baseline", None, ""
            if v7:
                note = f"{vs_v7:.2f}x uuidv7()"
            if workload == "bulk" and key in ("nextid_sql", "nextid_plpgsql"):
                floor = 0.90 if key == "nextid_sql" else 0.75
                target = f">= {floor:.2f}x" + (", > uuidv7()" if v7 else "")
                ok = ratio >= floor and (v7 is None or vs_v7 > 1.0)
            elif key != "bigserial":
                target = ""
            rows.append(
                c.Row(
                    s.name,
                    c.fmt_rate(rate, "rows/s"),
                    c.spread_rate(s, "rows/s"),
                    ratio,
                    target,
                    ok,
                    note,
                    c.ratio_range(s.ratios_to(base)),
                )
            )
            doc["results"].setdefault(workload, {})[key] = {
                "median_rows_per_s": rate,
                "ratio_vs_bigserial": ratio,
                "rows_per_s": s.rates,
            }
        title = (
            f"next_id bulk: INSERT ... SELECT {ROWS_PER_STATEMENT} rows x {statements} statements, "
            f"median of {rounds} rounds"
            if workload == "bulk"
            else f"next_id single-row: {args.clients} concurrent connections, {single_s:g}s turns, median of "
            f"{single_rounds} rounds"
        )
        c.print_table(
            title,
            rows,
            "bigserial",
            ["ratios are medians of per-round ratios (each round measures every candidate)"],
        )
        tables.append(rows)
    for n in notes + [c.machine_note()]:
        print(f"  {n}")
    c.save_run(args, doc)
    return c.verdict_exit(tables)


if __name__ == "__main__":
    sys.exit(main())
