"""Router on the shared servers: execute() in autocommit without leaking session state, per-call
timeouts, stats(), and no 0A000 "cached plan must not change result type" after a migration."""

from __future__ import annotations

import threading

import psycopg
import pytest
from support.fleet import connect, load
from support.sessions import SESSION_STATEMENTS

from shardctl import Router
from shardctl.errors import HostUnreachable, SessionStateError
from shardctl.router import forget_prepared


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


def backend(router: Router, key: int) -> int:
    return router.execute(key, "SELECT pg_backend_pid()")[0][0]


def test_execute_is_autocommit_and_sets_search_path_once(topo):
    with Router(topo, max_size=1) as router:
        pid = backend(router, 3)
        assert router.execute(3, "INSERT INTO users (username) VALUES ('a')") == 1
        assert router.execute(3, "SELECT current_schema(), count(*) FROM users") == [("insta3", 1)]
        assert router.execute(4, "SELECT current_schema()") == [
            ("insta4",)
        ]  # same backend, next shard
        assert backend(router, 4) == pid
        # Committed at once (autocommit): another session sees the row.
        with connect(topo, "pg1") as check:
            assert check.execute("SELECT count(*) FROM insta3.users").fetchone()[0] == 1


@pytest.mark.parametrize("statement, probe, clean_value", SESSION_STATEMENTS)
def test_execute_leaves_nothing_for_the_next_call(shared_topo, statement, probe, clean_value):
    with Router(shared_topo, max_size=1) as router:
        pid = backend(router, 5)
        router.execute(5, statement)
        assert backend(router, 6) == pid
        assert router.execute(6, probe)[0][0] == clean_value
        assert router.execute(6, "SELECT current_schema()")[0][0] == "insta6"
        # ... and the next checkout through connection() sees a clean session too.
        with router.connection(7) as conn:
            assert conn.info.backend_pid == pid
            assert conn.execute(probe).fetchone()[0] == clean_value


@pytest.mark.parametrize("how", ["execute", "run", "connection", "cursor", "executemany"])
@pytest.mark.parametrize("statement, probe, clean_value", SESSION_STATEMENTS)
def test_behind_a_transaction_pooler_session_state_is_refused_before_it_is_sent(
    shared_topo_default, how, statement, probe, clean_value
):
    """The default host (``pooler: transaction``): a statement that would leave session state on a server
    connection other clients get raises SessionStateError, names the way out, and never reaches the server."""
    with Router(shared_topo_default, max_size=1) as router:
        pid = backend(router, 5)
        with pytest.raises(SessionStateError, match="transaction pooler") as caught:
            if how == "execute":
                router.execute(5, statement)
            elif how == "connection":
                with router.connection(5) as conn:
                    conn.execute(statement)
            else:
                router.run(
                    5,
                    lambda c: (
                        c.cursor().executemany(statement, [()])
                        if how == "executemany"
                        else c.cursor().execute(statement)
                        if how == "cursor"
                        else c.execute(statement)
                    ),
                )
        assert "pooler" in str(caught.value) and "\n" not in str(caught.value)
        assert backend(router, 6) == pid  # the connection stays usable and pooled
        assert (
            router.execute(6, probe)[0][0] == clean_value
        )  # same backend: the statement never ran


@pytest.mark.parametrize("how", ["conn.execute", "cursor.execute", "executemany"])
@pytest.mark.parametrize("statement, probe, clean_value", SESSION_STATEMENTS)
def test_a_transaction_block_leaves_nothing_for_the_next_call(
    shared_topo, how, statement, probe, clean_value
):
    """run() commits without the reset when its statements cannot leave session state; these can."""

    def work(conn):
        if how == "conn.execute":
            conn.execute(statement)
        elif how == "cursor.execute":
            conn.cursor().execute(statement)
        else:
            conn.cursor().executemany(statement, [()])

    with Router(shared_topo, max_size=1) as router:
        pid = backend(router, 5)
        router.run(
            5, lambda c: c.execute("INSERT INTO users (username) VALUES ('clean')")
        )  # no reset needed
        router.run(5, work)
        assert backend(router, 6) == pid
        assert router.run(6, lambda c: c.execute(probe).fetchone()[0]) == clean_value
        assert router.execute(6, "SELECT current_schema()")[0][0] == "insta6"


def test_a_held_named_cursor_does_not_reach_the_next_call(topo):
    with Router(topo, max_size=1) as router:
        pid = backend(router, 5)

        def hold(conn):
            with conn.cursor("kept", withhold=True) as cur:
                cur.execute("SELECT 1")
                conn.execute("DECLARE other CURSOR WITH HOLD FOR SELECT 2")

        router.run(5, hold)
        assert backend(router, 6) == pid
        # (the statement's own unnamed portal is listed too)
        assert router.execute(6, "SELECT count(*) FROM pg_cursors WHERE name <> ''")[0][0] == 0


def test_a_connection_block_always_resets_even_a_hidden_setting(topo):
    """A function's side effect behind a plain SELECT is invisible to the statement check: connection()
    blocks reset whatever they ran (docs/router.md's advice for such functions)."""
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION insta5.sneaky() RETURNS text LANGUAGE sql "
            "AS $$ SELECT set_config('work_mem', '7MB', false) $$"
        )
    with Router(topo, max_size=1) as router:
        pid = backend(router, 5)
        with router.connection(5) as conn:
            assert conn.execute("SELECT sneaky()").fetchone()[0] == "7MB"
        assert backend(router, 6) == pid
        assert router.execute(6, "SHOW work_mem")[0][0] == "4MB"


def test_a_clean_transaction_keeps_the_shards_search_path_and_backend(topo):
    with Router(topo, max_size=1) as router:
        pid = backend(router, 5)
        for n in (5, 5, 6, 5):
            assert router.run(
                n,
                lambda c: c.execute(
                    "SELECT current_schema(), pg_backend_pid(), current_setting('statement_timeout')"
                ).fetchone(),
            ) == (
                f"insta{n}",
                pid,
                router.run(n, lambda c: c.execute("SHOW statement_timeout").fetchone()[0]),
            )


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_run_takes_three_round_trips_and_execute_one_each_transaction_carrying_its_settings(
    make_fleet, tmp_path, pooler
):
    """run(): BEGIN goes with the shard's settings, local to the transaction (one simple-protocol text), then the
    work, then COMMIT; every transaction again, since a pooler may give it another server connection.
    execute(): BEGIN, settings, statement and COMMIT in one round trip. libpq's trace counts what the client
    sent."""
    path = make_fleet(hosts=1, shards=8, pooler=pooler, init=True)
    topo = load(path)
    seen: list[psycopg.Connection] = []

    def insert(c: psycopg.Connection) -> int:
        seen.append(c)
        return c.execute("INSERT INTO users (username) VALUES ('rt') RETURNING id").fetchone()[0]

    with Router(topo, max_size=1) as router:
        router.run(4, insert)
        trace = tmp_path / "trace.txt"
        with trace.open("w") as out:
            seen[0].pgconn.trace(out.fileno())
            router.run(5, insert)
            router.run(5, insert)
            router.execute(5, "INSERT INTO users (username) VALUES ('one trip')")
            seen[0].pgconn.untrace()
    sent = [
        (line.split("\t") + [""])[3:5]
        for line in trace.read_text().splitlines()
        if line.split("\t")[1:2] == ["F"]
    ]
    trips = [text for kind, text in sent if kind.strip() in ("Query", "Sync")]
    assert len(trips) == 7, trips
    begin = " \"BEGIN; SELECT set_config('search_path', 'insta5, public', true), set_config('statement_timeout'"
    assert trips[0].startswith(begin) and trips[3].startswith(begin), trips
    assert trips[2].strip() == '"COMMIT"' and trips[5].strip() == '"COMMIT"'
    assert (
        trips[6].startswith(begin)
        and "INSERT INTO users (username) VALUES ('one trip'); COMMIT" in trips[6]
    ), trips


def test_a_run_is_all_or_nothing_even_with_the_works_own_transaction_blocks(topo):
    """psycopg's conn.transaction() inside run() is a savepoint of the run's transaction: an error after it
    rolls the block back too (nothing of a failed run is left, so it can be run again)."""

    def work(c: psycopg.Connection) -> None:
        with c.transaction():
            c.execute("INSERT INTO users (username) VALUES ('inner block')")
        raise ValueError("the application changed its mind")

    with Router(topo, max_size=1) as router:
        with pytest.raises(ValueError):
            router.run(3, work)
        assert router.execute(3, "SELECT count(*) FROM users WHERE username = 'inner block'") == [
            (0,)
        ]

        def block_then_more(c: psycopg.Connection) -> None:
            with c.transaction():
                c.execute("INSERT INTO users (username) VALUES ('committed')")
            c.execute("INSERT INTO users (username) VALUES ('committed')")

        router.run(3, block_then_more)
        assert router.execute(3, "SELECT count(*) FROM users WHERE username = 'committed'") == [
            (2,)
        ]


def test_a_connection_block_that_commits_inside_keeps_its_next_statements_in_a_transaction(topo):
    """connection() blocks are psycopg's own transactions: after a commit() in the block, the next statement
    opens the next transaction, so an error after it rolls back only what came after the commit."""
    with Router(topo, max_size=1) as router:
        with pytest.raises(ValueError), router.connection(3) as conn:
            conn.execute("INSERT INTO users (username) VALUES ('first chunk')")
            conn.commit()
            conn.execute("INSERT INTO users (username) VALUES ('second chunk')")
            raise ValueError("the batch job failed")
        assert router.execute(
            3, "SELECT username FROM users WHERE username LIKE '%chunk' ORDER BY 1"
        ) == [("first chunk",)]


def test_per_call_timeout_is_the_servers_statement_timeout(topo):
    with Router(topo, max_size=1, timeout=5) as router:
        with pytest.raises(psycopg.errors.QueryCanceled):
            router.execute(3, "SELECT pg_sleep(2)", timeout=0.2)
        assert router.execute(3, "SHOW statement_timeout") == [
            ("5s",)
        ]  # back to the Router's default
        assert router.execute(3, "SHOW statement_timeout", timeout=1.5) == [("1500ms",)]
        assert router.execute(3, "SHOW statement_timeout", timeout=None) == [("0",)]
        with router.connection(3, timeout=0.2) as conn, pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(2)")
        assert router.run(3, lambda c: c.execute("SHOW statement_timeout").fetchone()[0]) == "5s"
        stats = router.stats()["pg1"]
        assert (
            stats["errors"] == {"sql": 1} and stats["breaker"]["state"] == "closed"
        )  # a slow query is no outage


def test_stats_report_pools_errors_breakers_and_latency(topo):
    with Router(topo, max_size=4) as router:
        assert router.stats()["pg1"]["size"] == 0
        for key in (0, 1, 2, 3, 8, 9, 10, 11):  # pg1: shards 0-7, pg2: 8-15
            router.execute(key, "SELECT 1")
        with pytest.raises(psycopg.errors.UndefinedTable):
            router.execute(2, "SELECT * FROM nowhere")
        inside = {}

        def hold():
            with router.connection(1):
                inside["stats"] = router.stats()["pg1"]

        t = threading.Thread(target=hold)
        t.start()
        t.join()
        stats = router.stats()
        pg1, pg2 = stats["pg1"], stats["pg2"]
        assert inside["stats"]["in_use"] == 1
        # 4 statements, the failed one, the move check it triggered (42P01: did the shard move away?), the block
        assert pg1["calls"] == 7 and pg2["calls"] == 4
        assert pg1["in_use"] == 0 and pg1["idle"] == pg1["size"] >= 1 and pg1["max_size"] == 4
        assert pg1["errors"] == {"sql": 1} and pg2["errors_total"] == 0
        assert pg1["breaker"]["state"] == "closed"
        lat = pg1["latency_ms"]
        assert lat["samples"] == 7 and 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert pg1["standby"] is None


# ---- issue 13 item 7: no 0A000 after a migration adds a column ----------------------------------


def add_column(topo, shard: int) -> None:
    with connect(topo, topo.host_of(shard).name, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE insta{shard}.users ADD COLUMN bio text")


def test_plain_psycopg_meets_0A000_after_add_column(topo):
    """The scenario is real: a prepared SELECT * breaks on a plain psycopg connection."""
    with connect(topo, "pg1", autocommit=True) as conn:
        for _ in range(6):  # psycopg prepares from the 5th execution on
            conn.execute("SELECT * FROM insta2.users WHERE id = %s", (1,))
        add_column(topo, 2)
        with pytest.raises(
            psycopg.errors.FeatureNotSupported, match="cached plan must not change result type"
        ):
            conn.execute("SELECT * FROM insta2.users WHERE id = %s", (1,))


def test_router_sees_no_0A000_after_add_column(topo):
    """Four app threads keep 4 pooled connections busy (each prepares the statement), a migration
    adds a column, the threads go on: not one error, and the rows have the new column."""
    select = "SELECT *, pg_sleep(0.01) FROM users WHERE id = %s"
    with Router(topo, max_size=4) as router:
        uid = router.execute(2, "INSERT INTO users (username) VALUES ('x') RETURNING id")[0][0]
        errors: list[BaseException] = []
        widths: set[int] = set()

        def app(rounds: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            try:
                for _ in range(rounds):
                    widths.add(len(router.execute(2, select, (uid,))[0]))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def traffic(rounds: int) -> None:
            barrier = threading.Barrier(4)
            threads = [threading.Thread(target=app, args=(rounds, barrier)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        traffic(8)
        assert router.stats()["pg1"]["size"] >= 2 and widths == {4}
        add_column(topo, 2)
        widths.clear()
        traffic(8)
        assert errors == [] and widths == {5}  # id, username, created_at, bio, pg_sleep
        assert router.run(2, lambda c: len(c.execute(select, (uid,)).fetchone())) == 5
        with router.connection(
            2
        ) as conn:  # connection() blocks do not auto-prepare: nothing to go stale
            for _ in range(6):
                assert len(conn.execute(select, (uid,)).fetchone()) == 5

        # execute() binds on the client and prepares nothing. Work that prepares on purpose (prepare=True, a
        # host that keeps sessions) meets the stale plan once, and run() calls it again on a fresh plan.
        def prepared(c) -> int:
            return len(c.execute(select, (uid,), prepare=True).fetchone())

        assert {router.run(2, prepared) for _ in range(6)} == {5}
        with connect(topo, "pg1", autocommit=True) as conn:
            conn.execute("ALTER TABLE insta2.users ADD COLUMN site text")
        assert {router.run(2, prepared) for _ in range(6)} == {6}
        for _ in range(6):
            assert len(router.execute(2, select, (uid,))[0]) == 6  # and on every pooled connection
        assert router.stats()["pg1"]["errors"].get("stale_plan", 0) >= 1


def test_forgetting_prepared_statements_twice_leaves_psycopg_in_step(topo):
    """The CI flake behind "prepared statement _pg3_1 does not exist": a connection that had prepared
    nothing when one migration bumped the plan epoch, then prepared, then met a second bump."""
    select = "SELECT * FROM insta2.users WHERE id = %s"
    with connect(topo, "pg1", autocommit=True) as conn:
        forget_prepared(conn, 1)  # nothing prepared yet
        for _ in range(6):
            conn.execute(select, (1,))
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] >= 1
        forget_prepared(conn, 2)
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
        for _ in range(6):  # psycopg must prepare afresh, not execute the dropped _pg3_0
            conn.execute(select, (1,))


def test_a_host_that_is_not_there_names_itself_and_the_cause(make_fleet, tmp_path):
    path = make_fleet(hosts=2, shards=16)
    text = path.read_text()
    port = text.split("127.0.0.1:")[1].split("/")[0]
    path.write_text(
        text.replace(f"127.0.0.1:{port}", "127.0.0.1:1", 1)
    )  # nothing listens on port 1
    with Router(load(path)) as router:
        with pytest.raises(HostUnreachable, match=r"host pg1 is unreachable: .*refused") as info:
            router.execute(1, "SELECT 1")
        assert info.value.host == "pg1"


def test_an_application_error_in_a_block_rolls_back_and_keeps_the_connection(topo):
    with Router(topo, max_size=1) as router:
        pid = backend(router, 3)
        with pytest.raises(ValueError), router.connection(3) as conn:
            conn.execute("INSERT INTO users (username) VALUES ('rolled back')")
            conn.execute("SET work_mem = '7MB'")
            raise ValueError("the application changed its mind")
        assert router.execute(3, "SELECT count(*), current_setting('work_mem') FROM users") == [
            (0, "4MB")
        ]
        assert backend(router, 3) == pid
        assert router.stats()["pg1"]["errors"] == {"other": 1}


def test_a_failing_commit_raises_at_the_end_of_the_block(topo):
    """COMMIT travels with the session reset: a deferred constraint still fails the block, as commit() would."""
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("CREATE TABLE insta3.handles (h text UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    with Router(topo, max_size=1) as router:
        pid = backend(router, 3)
        with pytest.raises(psycopg.errors.UniqueViolation), router.connection(3) as conn:
            conn.execute("SET work_mem = '7MB'")
            conn.execute("INSERT INTO handles VALUES ('same'), ('same')")  # checked at COMMIT
        assert router.execute(3, "SELECT count(*), current_setting('work_mem') FROM handles") == [
            (0, "4MB")
        ]
        assert backend(router, 3) == pid
        with router.connection(3) as conn:
            conn.execute("INSERT INTO handles VALUES ('one')")
        assert router.run(3, lambda c: c.execute("SELECT count(*) FROM handles").fetchone()[0]) == 1


def test_streams_copies_and_named_cursors_run_on_the_shard(topo_default):
    """The thread Router's cursors (generated from the asyncio ones): stream, copy and named cursors
    open the call's transaction on the shard; a WITH HOLD cursor is refused behind the pooler."""
    with Router(topo_default) as router:

        def work(conn):
            streamed = list(conn.cursor().stream("SELECT current_schema()"))
            with conn.cursor().copy("COPY users (username) FROM STDIN") as copy:
                copy.write_row(("copied",))
            named = conn.cursor(name="named")
            named.execute("SELECT current_schema()")
            return streamed, named.fetchall()

        assert router.run(5, work) == ([("insta5",)], [("insta5",)])
        assert router.execute(5, "SELECT username FROM users") == [("copied",)]
        with pytest.raises(SessionStateError, match="WITH HOLD"), router.connection(5) as conn:
            conn.cursor(name="held", withhold=True).execute("SELECT 1")
