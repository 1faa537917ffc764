"""move-shard throughput against the ``pg_dump | psql`` floor between the same two hosts.

    python bench/move.py [--shards 256] [--move 64] [--rows 4000] [--subscriptions 4]

Starts its own two sandbox servers, provisions the fleet, loads ``--rows`` photos (with a ~400-byte
caption) into each of the shards that move, then measures on the same data:

- floor: ``pg_dump -n insta0 -n insta1 … | psql`` from pg1 into an empty database on pg2;
- move:  ``move_shards(..., "pg2")`` (prepare, sync, cutover; verification included).

Prints tables/s and MB/s for both, the ratio, and the move's phases (prepare, sync, freeze, verify).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import results

from shardctl.dev.sandbox import Sandbox
from shardctl.model.topology import Topology
from shardctl.ops.move import MoveOptions, move_shards
from shardctl.ops.provision import init


def load(topo: Topology, shards: list[int], rows: int) -> None:
    host = topo.host_of(shards[0])
    with psycopg.connect(**host.connect_kwargs(), autocommit=True) as conn:
        for n in shards:
            conn.execute(
                f"INSERT INTO insta{n}.photos (user_id, caption) SELECT g, repeat(md5(g::text), 12) "
                f"FROM generate_series(1, {rows}) g;"
                f"INSERT INTO insta{n}.users (username) SELECT 'user' || g FROM generate_series(1, 50) g"
            )
        conn.execute("VACUUM ANALYZE")


def measure(conn: psycopg.Connection, schemas: list[str]) -> tuple[int, int]:
    """(tables, bytes) of the shard schemas."""
    row = conn.execute(
        """SELECT count(*), coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s) AND c.relkind = 'r'""",
        (schemas,),
    ).fetchone()
    return row[0], row[1]


def floor(box: Sandbox, topo: Topology, schemas: list[str]) -> float:
    """pg_dump of the schemas from pg1 piped into psql on an empty database of pg2."""
    bin_dir = Path(box.state.bin_dir)
    src, dst = box.state.hosts[0], box.state.hosts[1]
    db = psycopg.conninfo.conninfo_to_dict(topo.host("pg1").dsn)["dbname"]
    with psycopg.connect(
        f"postgresql://postgres@127.0.0.1:{dst.port}/postgres", autocommit=True
    ) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_floor")
        conn.execute("CREATE DATABASE bench_floor")
    started = time.perf_counter()
    dump = subprocess.Popen(
        [
            str(bin_dir / "pg_dump"),
            "-h",
            "127.0.0.1",
            "-p",
            str(src.port),
            "-U",
            "postgres",
            "-d",
            db,
            *[f"--schema={s}" for s in schemas],
        ],
        stdout=subprocess.PIPE,
    )
    restore = subprocess.run(
        [
            str(bin_dir / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(dst.port),
            "-U",
            "postgres",
            "-d",
            "bench_floor",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
        ],
        stdin=dump.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    dump.stdout.close()
    if dump.wait() != 0 or restore.returncode != 0:
        raise SystemExit(f"pg_dump | psql failed: {restore.stderr[:500]}")
    seconds = time.perf_counter() - started
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{dst.port}/bench_floor") as conn:
        tables, _ = measure(conn, schemas)
    if tables == 0:
        raise SystemExit("pg_dump | psql restored no table")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shards", type=int, default=256)
    ap.add_argument("--move", type=int, default=64, help="shards to move (the first ones of pg1)")
    ap.add_argument("--rows", type=int, default=4000, help="photos per moving shard")
    ap.add_argument("--subscriptions", type=int, default=4, help="--max-subscriptions for the move")
    ap.add_argument("--json", action="store_true")
    results.add_option(ap)
    args = ap.parse_args()

    box = Sandbox(Path(tempfile.mkdtemp(prefix="shardctl-bench-move-")))
    try:
        box.up(hosts=2, shards=args.shards)
        topo = Topology.load(box.topology_path)
        init(topo).raise_for_status()
        moving = topo.host("pg1").shards[: args.move]
        schemas = [topo.schema_name(n) for n in moving]
        load(topo, moving, args.rows)
        with psycopg.connect(**topo.host("pg1").connect_kwargs()) as conn:
            tables, size = measure(conn, schemas)
        floor_s = floor(box, topo, schemas)
        started = time.perf_counter()
        report = move_shards(
            Topology.load(box.topology_path),
            moving,
            "pg2",
            options=MoveOptions(max_subscriptions=args.subscriptions),
        )
        move_s = time.perf_counter() - started
        mb = size / 1e6
        doc = {
            "shards": len(moving),
            "tables": tables,
            "megabytes": round(mb, 1),
            "floor_seconds": round(floor_s, 2),
            "move_seconds": round(move_s, 2),
            "ratio": round(move_s / floor_s, 2),
            "floor_tables_per_s": round(tables / floor_s, 1),
            "move_tables_per_s": round(tables / move_s, 1),
            "floor_mb_per_s": round(mb / floor_s, 1),
            "move_mb_per_s": round(mb / move_s, 1),
            **{
                k: report.get(k)
                for k in (
                    "prepare_seconds",
                    "sync_seconds",
                    "verify_before_seconds",
                    "freeze_seconds",
                    "verify_after_seconds",
                    "rows",
                )
            },
        }
        if not args.no_record:
            results.record("move", doc)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(f"{len(moving)} shards, {tables} tables, {mb:.1f} MB moved pg1 → pg2")
            print(
                f"  pg_dump | psql  {floor_s:7.2f}s  {doc['floor_tables_per_s']:7.1f} tables/s  "
                f"{doc['floor_mb_per_s']:6.1f} MB/s"
            )
            print(
                f"  move-shard      {move_s:7.2f}s  {doc['move_tables_per_s']:7.1f} tables/s  "
                f"{doc['move_mb_per_s']:6.1f} MB/s   ({doc['ratio']}x the floor)"
            )
            print(
                f"  move phases: prepare {doc['prepare_seconds']}s, sync {doc['sync_seconds']}s, verify before "
                f"{doc['verify_before_seconds']}s, freeze {doc['freeze_seconds']}s, verify after "
                f"{doc['verify_after_seconds']}s"
            )
    finally:
        box.destroy()


if __name__ == "__main__":
    main()
