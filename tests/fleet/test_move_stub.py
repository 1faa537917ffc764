"""Direct clients (psql, without the Router) that still use a moved shard's old schema get an error that
names the shard and its new host, not a bare "relation does not exist" (issue 12, item 2): the cutover
leaves a stub under the old name until --cleanup or --abort."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest
from support.fleet import connect, load, run_cli
from support.load import pg_bin
from support.moves import ids_on

from shardctl.errors import OperationFailed
from shardctl.ops.move import MoveOptions, abort_move, move_shards


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(pg_bin("psql")), "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def schema_exists(topo, host: str, schema: str) -> bool:
    with connect(topo, host) as conn:
        return (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()[0]
            == 1
        )


def test_psql_on_the_old_host_is_told_where_the_shard_went(fleet3):
    topo = load(fleet3)
    pg1 = topo.host("pg1").dsn
    assert (
        psql(
            pg1,
            "SET search_path = insta4; INSERT INTO photos (user_id, caption) VALUES (4, 'before')",
        ).returncode
        == 0
    )
    report = move_shards(load(fleet3), [4, 5], "pg2")
    for sql in (
        "SET search_path = insta4; INSERT INTO photos (user_id, caption) VALUES (4, 'after')",
        "SET search_path = insta4; SELECT count(*) FROM photos",
        "SET search_path = insta4; UPDATE photos SET caption = 'x'",
        "DELETE FROM insta4.photos",
        "SELECT insta4.next_id()",
        "SET search_path = insta4; SELECT next_id()",
        # Writes of no row: no row trigger fires, and the planner skips the view's read.
        "INSERT INTO insta4.photos (user_id, caption) SELECT 4, 'none' WHERE false",
        "UPDATE insta4.photos SET caption = 'x' WHERE false",
        "DELETE FROM insta4.photos WHERE false",
    ):
        out = psql(pg1, sql)
        assert out.returncode != 0, (sql, out.stdout)
        assert f"shard 4 moved to pg2 (move {report['move_id']})" in out.stderr, (sql, out.stderr)
        assert "does not exist" not in out.stderr
        assert "password" not in out.stderr
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("SET search_path = insta5")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO photos (user_id, caption) VALUES (5, 'after') RETURNING id")
        assert info.value.sqlstate == "SCM01" and "shard 5 moved to pg2" in str(info.value)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT * FROM users")
        assert info.value.sqlstate == "SCM01"
    with connect(topo, "pg1") as conn:  # the stubs were made before the freeze and renamed in it
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE '%%\\_stub\\_%%'"
            ).fetchone()[0]
            == 0
        )
    # The rows are on pg2, the new writes are not anywhere else; the stub is no shard for verify/status.
    assert len(ids_on(load(fleet3), "pg2", [4])) == 151
    r = run_cli("verify", config=fleet3)
    assert r.exit_code == 0, r
    doc = json.loads(run_cli("status", "--json", config=fleet3).stdout)
    assert all(not h["drift"] for h in doc["hosts"]), doc["hosts"]
    # --cleanup removes the stubs with the old copies.
    assert schema_exists(topo, "pg1", "insta4")
    assert run_cli("move-shard", "--cleanup", config=fleet3).exit_code == 0
    assert not schema_exists(topo, "pg1", "insta4") and not schema_exists(topo, "pg1", "insta5")
    assert schema_exists(topo, "pg2", "insta4")
    assert run_cli("verify", config=fleet3).exit_code == 0


def test_abort_before_a_cutover_removes_the_stubs_it_made(fleet3):
    """A cutover that gives up leaves the stubs it made before its freeze (under other names); --abort drops them."""
    topo = load(fleet3)
    move_shards(load(fleet3), [7], "pg2", phases=["prepare", "sync"])
    with connect(topo, "pg1", autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0]
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO insta7.photos (user_id) VALUES (7)"
        )  # the freeze cannot lock the table
        with pytest.raises(OperationFailed):
            move_shards(
                load(fleet3),
                [7],
                "pg2",
                phases=["cutover"],
                options=MoveOptions(max_freeze=0.3, attempts=1),
            )
        conn.execute("ROLLBACK")
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'insta7\\_stub\\_%'"
            ).fetchone()[0]
            == 1
        )
    abort_move(load(fleet3), shards=[7])
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0] == before
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'insta7\\_%%'"
            ).fetchone()[0]
            == 0
        )
    assert run_cli("verify", config=fleet3).exit_code == 0


def test_abort_after_cutover_removes_the_stub(fleet3):
    topo = load(fleet3)
    move_shards(load(fleet3), [6], "pg2")
    out = psql(topo.host("pg1").dsn, "SELECT count(*) FROM insta6.photos")
    assert out.returncode != 0 and "shard 6 moved to pg2" in out.stderr
    abort_move(load(fleet3), shards=[6])
    assert load(fleet3).host_of(6).name == "pg1"
    out = psql(
        topo.host("pg1").dsn,
        "SET search_path = insta6; INSERT INTO photos (user_id) VALUES (6); "
        "SELECT count(*) FROM photos",
    )
    assert out.returncode == 0, out.stderr
    assert "151" in out.stdout
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_views WHERE schemaname LIKE 'insta6%%'"
            ).fetchone()[0]
            == 0
        )
    assert run_cli("verify", config=fleet3).exit_code == 0


# Every shape of read of a moved shard's old name on the old host (shard 4, moved pg1 → pg2; insta0 stays on
# pg1). With the old stub (NULL columns over a function scan) the planner folded each filter on a column into
# a constant-false one-time filter and never ran the scan: these returned no rows, or 0, or false.
STUB_READS = [
    "SELECT id FROM insta4.photos WHERE user_id = 7",
    "SET search_path = insta4; SELECT id, caption FROM photos WHERE user_id = 7",
    "SELECT count(*) FROM insta4.photos",
    "SELECT count(*) FROM insta4.photos WHERE user_id = 7",
    "SELECT count(*) FROM insta4.photos WHERE caption IS NOT NULL",
    "SELECT EXISTS (SELECT FROM insta4.photos WHERE user_id = 7)",
    "SELECT 1 WHERE NOT EXISTS (SELECT FROM insta4.users)",
    "SELECT * FROM insta4.photos WHERE id = {id}",  # by ID
    "SELECT * FROM insta4.photos WHERE id IN ({id}, {id} + 1, 3)",
    "SELECT * FROM insta4.photos WHERE id = ANY('{{{id}}}'::bigint[])",
    "SELECT p.id FROM insta4.photos p JOIN insta4.users u ON u.id = p.user_id",  # stub joined with a stub
    "SELECT p.id FROM insta4.photos p JOIN insta0.photos q ON q.user_id = p.user_id WHERE q.user_id = 7",
    "SELECT q.id, p.id FROM insta0.photos q LEFT JOIN insta4.photos p ON p.user_id = q.user_id",
    "SELECT q.id FROM insta0.photos q WHERE q.user_id IN (SELECT user_id FROM insta4.photos WHERE user_id = 7)",
    "SELECT id FROM insta0.photos WHERE false UNION ALL SELECT id FROM insta4.photos WHERE user_id = 7",
    "SELECT (SELECT max(id) FROM insta4.photos)",
    "WITH p AS MATERIALIZED (SELECT * FROM insta4.photos WHERE user_id = 7) SELECT count(*) FROM p",
    "SELECT * FROM insta4.photos WHERE false",
    "SELECT * FROM insta4.photos WHERE user_id = 7 AND user_id = 8",
    "SELECT * FROM insta4.photos LIMIT 0",
    "SELECT * FROM insta4.photos WHERE user_id = 7 FOR UPDATE",
    "TABLE insta4.users",
    "EXPLAIN SELECT id FROM insta4.photos WHERE user_id = 7",  # planning itself raises
    "BEGIN; DECLARE c CURSOR FOR SELECT id FROM insta4.photos WHERE user_id = 7; FETCH c; COMMIT",
    "PREPARE p(bigint) AS SELECT id FROM insta4.photos WHERE user_id = $1; EXECUTE p(7)",
    "COPY (SELECT id FROM insta4.photos WHERE user_id = 7) TO STDOUT",
    "CREATE TEMP TABLE t AS SELECT * FROM insta4.photos WHERE user_id = 7",
    # Reads inside functions: SQL (inlined or not) and PL/pgSQL.
    (
        "CREATE FUNCTION pg_temp.n(bigint) RETURNS bigint LANGUAGE sql STABLE "
        "AS $$SELECT count(*) FROM insta4.photos WHERE user_id = $1$$; SELECT pg_temp.n(7)"
    ),
    (
        "CREATE FUNCTION pg_temp.ids(bigint) RETURNS SETOF bigint LANGUAGE sql "
        "AS $$SELECT id FROM insta4.photos WHERE user_id = $1$$; SELECT * FROM pg_temp.ids(7)"
    ),
    (
        "DO $$BEGIN PERFORM FROM insta4.photos WHERE user_id = 7; "
        "IF NOT FOUND THEN RAISE EXCEPTION 'silently empty'; END IF; END$$"
    ),
    (
        "DO $$DECLARE n bigint; BEGIN SELECT count(*) INTO n FROM insta4.photos WHERE id = {id}; "
        "RAISE EXCEPTION 'silently % rows', n; END$$"
    ),
]


def test_every_read_of_a_moved_shard_raises_on_the_old_host(fleet3):
    """Filtered, aggregated, EXISTS, joined, by-ID, cursor, prepared and in-function reads of a moved shard's
    old name fail with SCM01 naming the new host in psql, whatever the planner could prove about the stub."""
    topo = load(fleet3)
    pg1 = topo.host("pg1").dsn
    with connect(topo, "pg1") as conn:
        some_id = conn.execute("SELECT id FROM insta4.photos WHERE user_id = 7").fetchone()[0]
    report = move_shards(load(fleet3), [4], "pg2")
    told = f"shard 4 moved to pg2 (move {report['move_id']})"
    silent = {}
    for sql in STUB_READS:
        sql = sql.format(id=some_id)
        for binary in (pg_bin("psql"), "/usr/bin/psql"):
            out = subprocess.run(
                [str(binary), "-X", "-v", "ON_ERROR_STOP=1", "-d", pg1, "-c", sql],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if out.returncode == 0 or told not in out.stderr:
                silent[sql] = (out.stdout.strip()[:200], out.stderr.strip()[:300])
    assert not silent, "reads of the moved shard that did not raise SCM01:\n" + "\n".join(
        f"  {sql!r}: {res}" for sql, res in silent.items()
    )
    # The same through psycopg: prepared on the server (extended protocol), and a server-side cursor.
    with connect(topo, "pg1", autocommit=True) as conn:
        for _ in range(3):
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT id FROM insta4.photos WHERE user_id = %s", (7,), prepare=True)
            assert info.value.sqlstate == "SCM01" and "shard 4 moved to pg2" in str(info.value)
        with pytest.raises(psycopg.Error) as info, conn.transaction(), conn.cursor(name="c") as cur:
            cur.execute("SELECT id FROM insta4.photos WHERE id = %s", (some_id,))
            cur.fetchall()
        assert info.value.sqlstate == "SCM01"
    # Other schemas on the old host are untouched.
    out = psql(pg1, "SELECT count(*) FROM insta0.photos WHERE user_id = 7")
    assert out.returncode == 0 and out.stdout.split()[2] == "1", out
