#!/usr/bin/env python
"""Cost of the Router per single-row insert, against plain psycopg on the same shard.

Candidates, each inserting ``--rows`` single rows into ``insta5.users`` (one shard of a sandbox fleet
initialised by ``shardctl init``; ids from the shard's next_id()):

* ``psycopg insert+commit``   the baseline: one connection, ``search_path`` set once, ``execute`` + ``commit``;
* ``psycopg autocommit``      the same connection settings in autocommit (informational: the floor);
* ``Router.execute``          ``router.execute(key, insert, params)``, key routing to shard 5;
* ``Router.run``              ``router.run(key, work)`` (a transaction and the session reset: informational);
* ``Router.execute, redirect check``  ``Router.execute`` whose transactions open with the fleet's
  redirect check (``shardctl.redirect_check(5)``), as on a fleet host from an adoption's copy to
  its cleanup (forced on here: the fleet has no adoption).

The asyncio comparison (``--async-tasks``, default 100 concurrent tasks sharing ``--async-connections``
connections, 16 by default, for both candidates):

* ``AsyncConnection insert+commit``  the baseline: plain psycopg ``AsyncConnection``s handed out by an
  ``asyncio.Queue``, ``search_path`` set once, ``await execute`` + ``await commit``;
* ``AsyncConnection autocommit``     the same in autocommit (informational: the floor);
* ``AsyncRouter.execute``            ``await router.execute(key, insert, params)``.

``--pooler transaction`` (or ``session``) puts PgBouncer (shardctl/dev/pooler.py, as ``shardctl sandbox
up --pooler``) in front of the host: every candidate's ``dsn`` goes through it. Behind a transaction
pooler a session's ``search_path`` would reach other clients' transactions, so the plain psycopg
baselines name the schema in the statement instead (``insta5.users``).

Every connection uses the Router's own connection settings (connect timeout, keepalives,
tcp_user_timeout, statement_timeout, application_name). Within a round the candidates take turns
every ``--chunk`` inserts (order rotated), so load from other programs hits them alike; the figure
is the median over rounds of the per-round ratio to the baseline.

Targets: ``Router.execute`` (with and without the redirect check) <= 1.15x the baseline's time;
``AsyncRouter.execute`` <= 1.15x the async baseline's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

SHARDS = 64
KEY = 5  # routes to shard 5 (integer keys: key % shard count)
INSERT = "INSERT INTO users (username) VALUES (%s)"
TARGET = 1.15


POOLED = False  # --pooler: the host's dsn goes through PgBouncer


def plain_insert(conn, schema: str) -> str:
    """The baseline's statement on ``conn``: ``search_path`` set once on a direct connection; through a
    pooler (where a session setting would leak to other clients' transactions) the schema named instead."""
    if POOLED:
        return INSERT.replace("INTO users", f"INTO {schema}.users")
    conn.execute("SELECT set_config('search_path', %s, false)", (f"{schema}, public",))
    return INSERT


class Plain:
    """Plain psycopg with the Router's connection settings; ``search_path`` set once."""

    def __init__(self, router, host, schema: str, autocommit: bool):
        import psycopg

        self.conn = router._connect(host, False)
        # plain psycopg: no Router cursor (nor its refusals)
        self.conn.cursor_factory = psycopg.Cursor
        self.conn.autocommit = autocommit
        self.insert = plain_insert(self.conn, schema)
        if not autocommit:
            self.conn.commit()
        self.autocommit = autocommit

    def chunk(self, start: int, rows: int) -> float:
        conn, insert = self.conn, self.insert
        started = time.perf_counter()
        for i in range(start, start + rows):
            conn.execute(insert, (f"u{i}",))
            if not self.autocommit:
                conn.commit()
        return time.perf_counter() - started

    def close(self) -> None:
        self.conn.close()


class ViaExecute:
    def __init__(self, router):
        self.router = router

    def chunk(self, start: int, rows: int) -> float:
        execute = self.router.execute
        started = time.perf_counter()
        for i in range(start, start + rows):
            execute(KEY, INSERT, (f"u{i}",))
        return time.perf_counter() - started

    def close(self) -> None:
        pass


class ViaRun(ViaExecute):
    def chunk(self, start: int, rows: int) -> float:
        run = self.router.run
        started = time.perf_counter()
        for i in range(start, start + rows):
            run(KEY, lambda conn, i=i: conn.execute(INSERT, (f"u{i}",)))
        return time.perf_counter() - started


CHECKED = "Router.execute, redirect check"


def one_round(
    router, checking, host, schema: str, rows: int, chunk: int, round_no: int
) -> dict[str, float]:
    """Every candidate inserts ``rows`` rows, in chunks of ``chunk`` taken in turn (the order rotating
    each chunk): a change in the machine's load hits all candidates alike."""
    runners = {
        "psycopg insert+commit": Plain(router, host, schema, False),
        "psycopg autocommit": Plain(router, host, schema, True),
        "Router.execute": ViaExecute(router),
        "Router.run": ViaRun(router),
        CHECKED: ViaExecute(checking),
    }
    seconds = dict.fromkeys(runners, 0.0)
    try:
        for n, start in enumerate(range(0, rows, chunk)):
            for name in c.rotated(list(runners), round_no + n):
                seconds[name] += runners[name].chunk(start, min(chunk, rows - start))
    finally:
        for runner in runners.values():
            runner.close()
    return seconds


# ---- asyncio: 100 tasks ------------------------------------------------------------------------

ASYNC_NAMES = ("AsyncConnection insert+commit", "AsyncConnection autocommit", "AsyncRouter.execute")


async def in_tasks(start: int, rows: int, tasks: int, insert_one) -> float:
    """Rows ``start``..``start + rows`` inserted by ``tasks`` concurrent tasks (``await insert_one(i)``)."""

    async def worker(k: int) -> None:
        for i in range(start + k, start + rows, tasks):
            await insert_one(i)

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(tasks)))
    return time.perf_counter() - started


class AsyncPlain:
    """Plain psycopg ``AsyncConnection``s with the Router's connection settings, handed out by a queue."""

    def __init__(self, conns: list, insert: str, autocommit: bool):
        self.conns, self.insert, self.autocommit = conns, insert, autocommit
        self.free: asyncio.Queue = asyncio.Queue()
        for conn in conns:
            self.free.put_nowait(conn)

    @classmethod
    async def open(cls, router, host, schema: str, autocommit: bool, n: int) -> AsyncPlain:
        import psycopg

        conns, insert = [], INSERT
        for _ in range(n):
            conn = await router._connect(host, False)
            conn.cursor_factory = psycopg.AsyncCursor  # plain psycopg: no Router cursor
            if POOLED:
                insert = INSERT.replace("INTO users", f"INTO {schema}.users")
            else:
                await conn.execute(
                    "SELECT set_config('search_path', %s, false)", (f"{schema}, public",)
                )
            await conn.set_autocommit(autocommit)
            conns.append(conn)
        return cls(conns, insert, autocommit)

    async def chunk(self, start: int, rows: int, tasks: int) -> float:
        async def one(i: int) -> None:
            conn = await self.free.get()
            try:
                await conn.execute(self.insert, (f"u{i}",))
                if not self.autocommit:
                    await conn.commit()
            finally:
                self.free.put_nowait(conn)

        return await in_tasks(start, rows, tasks, one)

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


class AsyncViaExecute:
    def __init__(self, router):
        self.router = router

    async def chunk(self, start: int, rows: int, tasks: int) -> float:
        execute = self.router.execute
        return await in_tasks(start, rows, tasks, lambda i: execute(KEY, INSERT, (f"u{i}",)))

    async def close(self) -> None:
        pass


async def async_rounds(
    topo, rows: int, chunk: int, rounds: int, tasks: int, conns: int, series: dict
) -> dict:
    """The asyncio candidates, ``rounds`` rounds of ``rows`` inserts each by ``tasks`` tasks, in turns of
    ``chunk`` rows; returns the AsyncRouter's stats of the host."""
    from shardctl.router import AsyncRouter

    host, schema = topo.host_of(KEY), topo.schema_name(KEY)
    async with AsyncRouter(topo, max_size=conns) as router:
        await router.execute(KEY, INSERT, ("warm-up",))
        for r in range(rounds):
            runners = {
                ASYNC_NAMES[0]: await AsyncPlain.open(router, host, schema, False, conns),
                ASYNC_NAMES[1]: await AsyncPlain.open(router, host, schema, True, conns),
                ASYNC_NAMES[2]: AsyncViaExecute(router),
            }
            seconds = dict.fromkeys(runners, 0.0)
            try:
                for n, start in enumerate(range(0, rows, chunk)):
                    for name in c.rotated(list(runners), r + n):
                        seconds[name] += await runners[name].chunk(
                            start, min(chunk, rows - start), tasks
                        )
            finally:
                for runner in runners.values():
                    await runner.close()
            for name, value in seconds.items():
                series[name].add(value)
                c.log(f"round {r + 1}/{rounds} {name}: {value / rows * 1e6:.0f} µs/insert")
        return router.stats()[host.name]


def table_of(series: dict, base_name: str, checked: tuple[str, ...], rows: int) -> list:
    base = series[base_name]
    table = []
    for name, s in series.items():
        ratios = s.ratios_to(base, faster_is_higher=False)
        ratio = s.ratio_to(base, faster_is_higher=False)
        target, ok = ("", None)
        if name in checked:
            target, ok = f"<= {TARGET:.2f}x baseline time", ratio <= TARGET
        table.append(
            c.Row(
                name,
                f"{s.median_s / rows * 1e6:.0f} µs/insert",
                f"{min(s.seconds) / rows * 1e6:.0f} – {max(s.seconds) / rows * 1e6:.0f} µs",
                None if s is base else ratio,
                target,
                ok,
                ratio_range=None if s is base else c.ratio_range(ratios),
            )
        )
    return table


def stats_note(what: str, stats: dict) -> str:
    lat = stats["latency_ms"]
    return (
        f"{what}.stats() of the host afterwards: {stats['calls']} calls, {stats['connects']} connects, "
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, errors {stats['errors_total']}"
    )


def main() -> int:
    global POOLED
    p = c.base_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows", type=int, default=10_000, help="Single-row inserts per candidate and round."
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=250,
        help="Inserts per turn: candidates take turns within a round.",
    )
    p.add_argument(
        "--pooler",
        choices=["none", "transaction", "session"],
        default="none",
        help="Put PgBouncer in this pool mode in front of the host (every candidate goes through it).",
    )
    p.add_argument(
        "--async-tasks",
        type=int,
        default=100,
        help="Concurrent tasks of the asyncio candidates (0: skip).",
    )
    p.add_argument(
        "--async-connections",
        type=int,
        default=16,
        help="Connections the asyncio candidates share (AsyncRouter max_size; the baseline's queue).",
    )
    p.add_argument(
        "--async-rows", type=int, default=20_000, help="Inserts per asyncio candidate and round."
    )
    p.add_argument(
        "--async-chunk", type=int, default=2_000, help="Inserts per turn of the asyncio candidates."
    )
    args = p.parse_args()
    rounds = c.check_rounds(args.rounds or (3 if args.quick else 5))
    rows = 2_000 if args.quick and args.rows == 10_000 else args.rows
    async_rows = 4_000 if args.quick and args.async_rows == 20_000 else args.async_rows
    POOLED = args.pooler != "none"

    from shardctl.router import Router

    with c.sandbox(
        hosts=1,
        shards=SHARDS,
        keep=args.keep,
        prefix="shardctl-bench-router-",
        base=c.sandbox_base(args.tmp, need_gb=1),
    ) as box:
        if POOLED:
            from shardctl.dev.pooler import front_sandbox, stop_sandbox_pooler

            info = front_sandbox(box.dir, args.pooler, max(args.async_connections, 8))
            c.log(f"PgBouncer ({args.pooler} mode) in front of the host: {info}")
        try:
            init = subprocess.run(
                [sys.executable, "-m", "shardctl", "--config", str(box.topology_path), "init"],
                check=False,
                capture_output=True,
                text=True,
            )
            if init.returncode != 0:
                raise SystemExit(f"shardctl init failed: {init.stdout}{init.stderr}")
            topo = c.load_topology(box.topology_path)
            host, schema = topo.host_of(KEY), topo.schema_name(KEY)
            series = {
                name: c.Series(name, work=rows)
                for name in (
                    "psycopg insert+commit",
                    "psycopg autocommit",
                    "Router.execute",
                    "Router.run",
                    CHECKED,
                )
            }
            with Router(topo) as router, Router(topo) as checking:
                # as on a fleet host from an adoption's copy to its cleanup
                checking.placement.redirect_check = lambda host, shard: shard
                router.execute(KEY, INSERT, ("warm-up",))
                checking.execute(KEY, INSERT, ("warm-up",))
                for r in range(rounds):
                    for name, seconds in one_round(
                        router, checking, host, schema, rows, args.chunk, r
                    ).items():
                        series[name].add(seconds)
                        c.log(
                            f"round {r + 1}/{rounds} {name}: {seconds / rows * 1e6:.0f} µs/insert"
                        )
                stats = router.stats()[host.name]
            aseries = {name: c.Series(name, work=async_rows) for name in ASYNC_NAMES}
            astats = None
            if args.async_tasks > 0:
                astats = asyncio.run(
                    async_rounds(
                        topo,
                        async_rows,
                        args.async_chunk,
                        rounds,
                        args.async_tasks,
                        args.async_connections,
                        aseries,
                    )
                )
        finally:
            if POOLED:
                stop_sandbox_pooler(box.dir)

    via = f", through PgBouncer ({args.pooler} mode)" if POOLED else ", direct"
    table = table_of(series, "psycopg insert+commit", ("Router.execute", CHECKED), rows)
    notes = [
        (
            f"{rows} single-row inserts per candidate and round (turns of {args.chunk}), {rounds} rounds, "
            f"shard {KEY} ({schema}){via}"
        ),
        stats_note("Router", stats),
        c.machine_note(),
    ]
    c.print_table(
        "Router overhead per single-row insert (time; lower is better)",
        table,
        "psycopg insert+commit",
        notes,
    )
    tables = [table]
    if astats is not None:
        atable = table_of(aseries, ASYNC_NAMES[0], ("AsyncRouter.execute",), async_rows)
        c.print_table(
            f"AsyncRouter overhead per single-row insert, {args.async_tasks} concurrent tasks on "
            f"{args.async_connections} connections (time; lower is better)",
            atable,
            ASYNC_NAMES[0],
            [
                (
                    f"{async_rows} inserts per candidate and round (turns of {args.async_chunk}), {rounds} rounds"
                    f"{via}"
                ),
                stats_note("AsyncRouter", astats),
            ],
        )
        tables.append(atable)
    c.save_run(
        args,
        {
            "rows": rows,
            "rounds": rounds,
            "pooler": args.pooler,
            "seconds": {k: v.seconds for k, v in series.items()},
            "stats": stats,
            "async": {
                "rows": async_rows,
                "tasks": args.async_tasks,
                "connections": args.async_connections,
                "seconds": {k: v.seconds for k, v in aseries.items()},
                "stats": astats,
            },
        },
    )
    return c.verdict_exit(tables)


if __name__ == "__main__":
    sys.exit(main())
