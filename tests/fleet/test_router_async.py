"""The asyncio Router (issue #25 item 5): the Router's guarantees with ``AsyncConnection``.

Each test drives its coroutines with ``asyncio.run`` (no pytest plugin). Ported from the Router's
tests: routing and sessions (test_router_sessions.py), pooler-safety, migrate and a 4-shard move
under 6 async writers and 2 readers checked by the history checker, directly and through PgBouncer
in transaction mode (test_router_poolers.py), and the fault tests (test_router_faults.py: a refused
host fails fast and opens the breaker, a SIGSTOPped host fails within the bound).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque

import psycopg
import pytest
from support.clients import async_history_traffic, keys_for
from support.faults import CONNECT_TIMEOUT, PG1_KEY, PG2_KEY, calling, frozen, probed
from support.fleet import load, run_cli
from support.sessions import SESSION_STATEMENTS
from support.standby import KEY as STANDBY_KEY
from support.standby import wait_replayed

from shardctl import AsyncRouter
from shardctl.errors import BadInput, HostUnreachable, SessionStateError
from shardctl.ops.move import move_shards


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def topo(make_fleet):
    """Direct hosts that say so (``pooler: none``): sessions are kept, so the Router resets them."""
    path = make_fleet(hosts=2, shards=16, pooler="none", init=True)
    return load(path)


@pytest.fixture
def topo_default(make_fleet):
    """Hosts with the default ``pooler: transaction``: nothing may outlive a transaction."""
    path = make_fleet(hosts=2, shards=16, init=True)
    return load(path)


async def backend(router: AsyncRouter, key: int) -> int:
    return (await router.execute(key, "SELECT pg_backend_pid()"))[0][0]


# ---- the API ------------------------------------------------------------------------------


def test_routes_runs_executes_and_reports(topo):
    async def main():
        async with AsyncRouter(topo) as router:
            assert router.shard_for(35) == 3 and router.host_for(35).name == "pg1"
            assert router._pools == {}  # routing alone opens nothing
            assert await router.execute(3, "INSERT INTO users (username) VALUES (%s)", ("a",)) == 1
            assert await router.execute(3, "SELECT current_schema(), count(*) FROM users") == [
                ("insta3", 1)
            ]
            assert await router.execute(shard=12, query="SELECT current_schema()") == [("insta12",)]

            async def work(conn):
                await conn.execute("INSERT INTO users (username) VALUES ('b')")
                cur = await conn.execute("SELECT current_schema(), count(*) FROM users")
                return await cur.fetchone()

            assert await router.run(3, work) == ("insta3", 2)
            async with router.connection(
                id=(await router.execute(3, "SELECT next_id()"))[0][0]
            ) as conn:
                cur = await conn.execute("SELECT current_schema()")
                assert await cur.fetchone() == ("insta3",)
            assert await router.read(3, "SELECT count(*) FROM users") == [(2,)]
            with pytest.raises(BadInput):
                await router.execute(3, None)
            with pytest.raises(BadInput):
                await router.run(3)
            with pytest.raises(
                TypeError,
                match=r"^AsyncRouter\.read\(\) got an unexpected keyword argument 'readonly'$",
            ):
                await router.read(3, "SELECT 1", readonly=True)
            stats = router.stats()
            assert stats["pg1"]["calls"] >= 6 and stats["pg1"]["errors_total"] == 0, stats["pg1"]
            assert stats["pg2"]["calls"] == 1 and stats["pg2"]["breaker"]["state"] == "closed"
        assert router._pools == {}

    run(main())


def test_a_run_is_all_or_nothing_and_a_block_commits_at_its_end(topo):
    async def main():
        async with AsyncRouter(topo) as router:

            async def failing(conn):
                await conn.execute("INSERT INTO users (username) VALUES ('lost')")
                async with conn.transaction():
                    await conn.execute("INSERT INTO users (username) VALUES ('lost too')")
                raise RuntimeError("the work fails")

            with pytest.raises(RuntimeError):
                await router.run(4, failing)
            assert await router.execute(4, "SELECT count(*) FROM users") == [(0,)]
            async with router.connection(4) as conn:
                async with conn.transaction():
                    await conn.execute("INSERT INTO users (username) VALUES ('kept')")
                await conn.execute("INSERT INTO users (username) VALUES ('kept too')")
                await conn.commit()
                cur = await conn.execute(
                    "SELECT current_schema()"
                )  # the next transaction: same shard
                assert await cur.fetchone() == ("insta4",)
            assert await router.execute(4, "SELECT count(*) FROM users") == [(2,)]

    run(main())


def test_per_call_timeout_is_the_servers_statement_timeout(topo):
    async def main():
        async with AsyncRouter(topo, timeout=5) as router:
            with pytest.raises(Exception, match="statement timeout"):
                await router.execute(3, "SELECT pg_sleep(2)", timeout=0.2)
            assert await router.execute(3, "SELECT current_setting('statement_timeout')") == [
                ("5s",)
            ]

    run(main())


def test_100_tasks_share_a_pool_of_8(topo):
    async def main():
        async with AsyncRouter(topo, max_size=8) as router:

            async def one(i):
                return await router.execute(i % 16, "SELECT current_schema(), pg_sleep(0.01)")

            results = await asyncio.gather(*[one(i) for i in range(100)])
            assert [r[0][0] for r in results] == [f"insta{i % 16}" for i in range(100)]
            stats = router.stats()
            assert stats["pg1"]["size"] <= 8 and stats["pg2"]["size"] <= 8
            assert stats["pg1"]["calls"] + stats["pg2"]["calls"] == 100

    run(main())


def test_waiters_get_connections_in_turn_and_time_out(topo):
    async def main():
        async with AsyncRouter(topo, max_size=1, pool_timeout=0.3) as router:

            async def hold(seconds):
                async with router.connection(3) as conn:
                    await conn.execute("SELECT 1")
                    await asyncio.sleep(seconds)

            holder = asyncio.ensure_future(hold(1.0))
            await asyncio.sleep(0.1)
            seconds, error = await timed(router.execute(3, "SELECT 1"))
            assert isinstance(error, HostUnreachable) and "no free connection" in str(error), error
            assert 0.2 < seconds < 0.6, seconds
            cancelled = asyncio.ensure_future(router.execute(3, "SELECT 1", timeout=5))
            await asyncio.sleep(0.05)
            cancelled.cancel()  # a waiter that gives up leaves nothing behind
            await holder
            async with AsyncRouter(topo, max_size=1, pool_timeout=5) as fifo:
                order = []

                async def one(i):
                    await fifo.execute(3, "SELECT pg_sleep(0.02)")
                    order.append(i)

                await asyncio.gather(*[one(i) for i in range(10)])
                assert order == list(range(10))  # in turn
            stats = router.stats()["pg1"]
            assert stats["size"] == 1 and stats["idle"] == 1 and stats["waiting"] == 0, stats
            assert router._pools["pg1"]._waiters == deque()
            assert await router.execute(3, "SELECT 1") == [(1,)]

    run(main())


# ---- sessions: nothing carries over ----------------------------------------------------------


@pytest.mark.parametrize("statement, probe, clean_value", SESSION_STATEMENTS)
def test_execute_and_run_leave_nothing_for_the_next_call(
    shared_topo, statement, probe, clean_value
):
    async def main():
        async with AsyncRouter(shared_topo, max_size=1) as router:
            pid = await backend(router, 5)
            await router.execute(5, statement)
            assert await backend(router, 6) == pid
            assert (await router.execute(6, probe))[0][0] == clean_value

            async def work(conn):
                await conn.execute(statement.replace("mine", "mine2").replace("4242", "4243"))

            await router.run(5, work)
            async with router.connection(7) as conn:
                assert conn.info.backend_pid == pid
                assert await (await conn.execute(probe)).fetchone() == (clean_value,)

    run(main())


@pytest.mark.parametrize("how", ["execute", "run", "connection", "cursor"])
@pytest.mark.parametrize("statement, probe, clean_value", SESSION_STATEMENTS)
def test_behind_a_transaction_pooler_session_state_is_refused_before_it_is_sent(
    shared_topo_default, how, statement, probe, clean_value
):
    async def main():
        async with AsyncRouter(shared_topo_default, max_size=1) as router:
            pid = await backend(router, 5)
            with pytest.raises(SessionStateError, match="transaction pooler") as caught:
                if how == "execute":
                    await router.execute(5, statement)
                elif how == "connection":
                    async with router.connection(5) as conn:
                        await conn.execute(statement)
                elif how == "cursor":
                    await router.run(5, lambda c: c.cursor().execute(statement))
                else:
                    await router.run(5, lambda c: c.execute(statement))
            assert "pooler" in str(caught.value)
            assert await backend(router, 6) == pid  # the connection stays usable and pooled
            assert (await router.execute(6, probe))[0][0] == clean_value  # the statement never ran
            assert router.stats()["pg1"]["errors"] == {"session_state": 1}

    run(main())


def test_streams_copies_and_named_cursors_run_on_the_shard(topo_default):
    async def main():
        async with AsyncRouter(topo_default) as router:

            async def work(conn):
                streamed = [r async for r in conn.cursor().stream("SELECT current_schema()")]
                async with conn.cursor().copy("COPY users (username) FROM STDIN") as copy:
                    await copy.write_row(("copied",))
                named = conn.cursor(name="named")
                await named.execute("SELECT current_schema()")
                return streamed, await named.fetchall()

            assert await router.run(5, work) == ([("insta5",)], [("insta5",)])
            assert await router.execute(5, "SELECT username FROM users") == [("copied",)]
            with pytest.raises(SessionStateError, match="WITH HOLD"):
                async with router.connection(5) as conn:
                    await conn.cursor(name="held", withhold=True).execute("SELECT 1")

    run(main())


# ---- poolers and moves ---------------------------------------------------------------------


@pytest.fixture(params=["direct", "transaction"])
def mode(request) -> str:
    """The modes test_router_poolers.pooled_fleet builds fleets for, here: direct and PgBouncer transaction."""
    return request.param


def test_async_clients_during_migrate(pooled_fleet, mode):
    """6 async writers and 2 async readers on every shard while ``shardctl migrate`` adds a column."""
    path = pooled_fleet(hosts=2, shards=16)
    (path.parent / "migrations" / "V0003__add_photo_filter.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN filter text NOT NULL DEFAULT 'none';\n"
    )
    topo = load(path)
    with async_history_traffic(
        path, keys_for(topo, list(range(16)), 3), writers=6, readers=2
    ) as traffic:
        result = run_cli("migrate", config=path)
    assert result.exit_code == 0, result
    report = traffic.history.check()
    assert report.ok, report
    assert report.counts["writes"] > 50 and report.counts["reads"] > 20, report


# "indexed": what an application writes (a moved shard's stub raises SCM01 for it too); "scan": the whole table.
@pytest.mark.parametrize(
    "mode, read",
    [
        ("direct", "indexed"),
        pytest.param("direct", "scan", marks=pytest.mark.slow),
        pytest.param("transaction", "indexed", marks=pytest.mark.slow),
        ("transaction", "scan"),
    ],
    indirect=["mode"],
)
def test_async_clients_during_move(pooled_fleet, mode, read):
    """6 async writers and 2 async readers while 4 shards move pg1 → pg2 (and on two shards that stay)."""
    path = pooled_fleet(hosts=2, shards=16)  # pg1 0-7, pg2 8-15
    moved = [4, 5, 6, 7]
    topo = load(path)
    with async_history_traffic(
        path, keys_for(topo, moved + [0, 9], 4), writers=6, readers=2, read=read
    ) as traffic:
        report = move_shards(load(path), moved, "pg2")
    assert report["phase"] == "cut_over" and report["verified"] is True, report
    assert all(load(path).host_of(n).name == "pg2" for n in moved)
    checked = traffic.history.check()
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked


def test_a_stale_topology_file_follows_the_old_hosts_redirect(make_fleet):
    """An app server whose copy of the topology file is never updated: its AsyncRouter follows the
    redirect the old host recorded at the cutover (no error, nothing lost, no read from a wrong shard)."""
    import shutil

    from support.history import History

    path = make_fleet(hosts=2, shards=16, pooler="none", init=True)
    stale = path.with_name("stale.yaml")
    shutil.copy(path, stale)
    moved = [4, 5, 6, 7]
    with async_history_traffic(
        stale,
        keys_for(load(path), moved + [0, 9], 4),
        writers=6,
        readers=2,
        history=History(path),
        read="scan",
    ) as traffic:
        report = move_shards(load(path), moved, "pg2")
    assert report["phase"] == "cut_over", report
    assert load(stale).host_of(moved[0]).name == "pg1"  # the copy never changed
    assert traffic.router.redirects() == {n: "pg2" for n in moved}
    checked = traffic.history.check()
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked


# ---- faults --------------------------------------------------------------------------------


async def timed(coro) -> tuple[float, object]:
    started = time.monotonic()
    try:
        result = await coro
    except Exception as exc:  # noqa: BLE001 - the caller inspects it
        result = exc
    return time.monotonic() - started, result


async def warm(router: AsyncRouter, key: int, connections: int) -> None:
    async def hold():
        async with router.connection(key) as conn:
            await conn.execute("SELECT pg_sleep(0.1)")

    await asyncio.gather(*[hold() for _ in range(connections)])
    stats = router.stats()[router.host_for(key).name]
    assert stats["idle"] == stats["size"] == connections


def test_stopped_host_fails_fast_with_the_breaker_other_hosts_unaffected(box):
    async def main():
        async with AsyncRouter(load(box.topology_path)) as router:
            await warm(router, PG1_KEY, 4)
            before = [(await timed(router.execute(PG2_KEY, "SELECT 1")))[0] for _ in range(20)]
            box.stop_host("pg1")
            pg1, pg2 = [], []
            for _ in range(30):
                pg1.append(await timed(router.execute(PG1_KEY, "SELECT 1")))
                pg2.append(await timed(router.execute(PG2_KEY, "SELECT 1")))
                await asyncio.sleep(0.05)
            for seconds, result in pg1:
                assert isinstance(result, HostUnreachable) and result.host == "pg1", result
                assert seconds <= 1.0, (seconds, result)
            causes = {str(r) for _, r in pg1}
            assert any("refused" in c for c in causes), causes
            assert any("circuit open" in c for c in causes), (
                causes
            )  # the breaker failed calls without trying
            assert all(isinstance(r, list) for _, r in pg2), pg2
            assert statistics.median(s for s, _ in pg2) <= max(0.05, 3 * statistics.median(before))
            stats = router.stats()["pg1"]
            assert (
                stats["breaker"]["state"] in ("open", "half-open")
                and "refused" in stats["breaker"]["cause"]
            )
            assert stats["replaced_idle"] == 4 and stats["errors"]["connect"] >= 1
            box.start_host("pg1")
            deadline = time.monotonic() + 6
            while isinstance(
                (await timed(router.execute(PG1_KEY, "SELECT 1")))[1], HostUnreachable
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            assert router.stats()["pg1"]["breaker"]["state"] == "closed"

    run(main())


@pytest.mark.parametrize("pool", [pytest.param("cold", marks=pytest.mark.slow), "warm"])
def test_sigstopped_server_fails_within_the_bound(box, pool):
    bound = 0.5

    async def main():
        async with AsyncRouter(
            load(box.topology_path), connect_timeout=CONNECT_TIMEOUT, timeout=bound
        ) as router:
            if pool == "warm":
                await warm(router, PG1_KEY, 4)
            await router.execute(PG2_KEY, "SELECT 1")
            with frozen(box, "pg1"):
                results, others = [], []
                started = time.monotonic()
                while calling(started, results):
                    results.append(await timed(router.execute(PG1_KEY, "SELECT 1")))
                    others.append(await timed(router.execute(PG2_KEY, "SELECT 1")))
                assert all(isinstance(r, list) for _, r in others)
                for seconds, result in results:
                    assert isinstance(result, HostUnreachable) and result.host == "pg1", result
                    assert seconds <= CONNECT_TIMEOUT + 1, (seconds, result)
                # The loop ran past a probe (a call after the first that waited for the server again).
                assert probed(results), results[:3]
                first = str(results[0][1])
                assert ("no answer within" in first) if pool == "warm" else ("timeout" in first), (
                    first
                )
                if pool == "warm":
                    assert results[0][0] <= bound + 0.5 + 0.3, results[
                        0
                    ]  # the client deadline cut it
                # Tasks on other hosts go on while one awaits the frozen host.
                slow = asyncio.ensure_future(timed(router.execute(PG1_KEY, "SELECT 1")))
                fast = await timed(router.execute(PG2_KEY, "SELECT 1"))
                assert isinstance(fast[1], list) and fast[0] < 0.3, fast
                await slow
            deadline = time.monotonic() + 8
            while not isinstance((await timed(router.execute(PG1_KEY, "SELECT 1")))[1], list):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

    run(main())


# ---- standby reads -------------------------------------------------------------------------


async def on(router: AsyncRouter, **kw) -> tuple[bool, int]:
    """(served by a server in recovery, rows in users) for a read through the router."""
    return (
        await router.read(STANDBY_KEY, "SELECT pg_is_in_recovery(), count(*) FROM users", **kw)
    )[0]


def test_reads_go_to_the_standby_fall_back_when_it_lags_or_stops(replicated):
    topo = load(replicated.topology_path)
    standby = topo.hosts[0].standby

    async def main():
        async with AsyncRouter(topo, max_lag=0.5, lag_check_interval=0.05) as router:
            await router.execute(STANDBY_KEY, "INSERT INTO users (username) VALUES ('first')")
            wait_replayed(topo)
            assert await on(router) == (True, 1)  # the replica serves reads
            async with router.connection(STANDBY_KEY, readonly=True) as conn:
                cur = await conn.execute("SELECT pg_is_in_recovery(), current_schema()")
                assert await cur.fetchone() == (True, f"insta{STANDBY_KEY}")
            assert await router.execute(STANDBY_KEY, "SELECT pg_is_in_recovery()") == [(False,)]
            with psycopg.connect(standby, autocommit=True) as conn:
                conn.execute("SELECT pg_wal_replay_pause()")
            try:
                await router.execute(STANDBY_KEY, "INSERT INTO users (username) VALUES ('second')")
                await asyncio.sleep(1.0)  # now the replica is > max_lag behind
                assert await on(router) == (False, 2)  # ... so the read went to the primary
                async with router.connection(STANDBY_KEY, readonly=True) as conn:
                    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                        await conn.execute("INSERT INTO users (username) VALUES ('not here')")
                assert await on(router, max_lag=3600) == (
                    True,
                    1,
                )  # a looser bound accepts the stale replica
                assert router.stats()["pg1"]["standby"]["fallbacks"]["lagging"] >= 2
            finally:
                with psycopg.connect(standby, autocommit=True) as conn:
                    conn.execute("SELECT pg_wal_replay_resume()")
            wait_replayed(topo)
            await asyncio.sleep(0.1)
            assert await on(router) == (True, 2)  # caught up: back on the replica
            replicated.stop_host("pg1-standby")
            for _ in range(5):
                started = time.monotonic()
                assert await on(router) == (False, 2)  # stopped: the primary answers, at once
                assert time.monotonic() - started < 1.0
            stats = router.stats()["pg1"]
            assert (
                stats["standby"]["fallbacks"]["unreachable"] == 5
                and stats["breaker"]["state"] == "closed"
            )

    run(main())


# ---- the documentation's async web app (docs/router.md) ----------------------------------------


def docs_example(name: str) -> str:
    """The python block after ``<!-- example: NAME -->`` in docs/router.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "router.md").read_text()
    after = text.split(f"<!-- example: {name} -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_async_app(make_fleet):
    path = make_fleet(hosts=2, shards=16, init=True)
    app: dict = {}
    # The docs' example is run as written, so the page cannot drift from what works.
    exec(compile(docs_example("async-app"), "docs/router.md (async-app)", "exec"), app)  # noqa: S102

    async def main():
        await app["startup"](str(path))
        try:
            users = list(range(1, 41))
            posted = await asyncio.gather(
                *[app["post_photo"](u, f"photo of {u}") for u in users for _ in range(3)]
            )
            ids = [p["id"] for p in posted]
            assert len(set(ids)) == 120
            got = await asyncio.gather(*[app["get_photo"](i) for i in ids])
            assert [g["user_id"] for g in got] == [u for u in users for _ in range(3)]
            assert (
                await app["get_photo"](max(ids) + 1) is None
            )  # the same shard (the sequence bits), no such row
            mine = await app["user_photos"](7)
            assert [p["caption"] for p in mine] == ["photo of 7"] * 3
            assert await app["health"]() == {"pg1": "closed", "pg2": "closed"}
        finally:
            await app["shutdown"]()

    run(main())
