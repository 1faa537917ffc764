"""App servers whose topology file is a stale copy follow a move through the redirect the old host
recorded at the cutover (issue 12, item 2): no error, a short stall, every acknowledged row once."""

from __future__ import annotations

import itertools
import shutil
import time

import psycopg
import pytest
from support.fleet import connect, load, stale_copy
from support.load import RouterWriters
from support.moves import ids_on

from shardctl.errors import HostUnreachable
from shardctl.ops.move import move_shards
from shardctl.router import Router

MOVED = list(range(8, 14))  # pg1 → pg3
STILL = [0, 1, 2, 20, 21]  # shards that stay where they are (pg1, pg2)


def test_two_routers_one_with_a_stale_file_write_through_a_move(fleet3):
    topo = load(fleet3)
    before = {n: set(ids_on(topo, topo.host_of(n).name, [n])) for n in MOVED + STILL}
    stale_path = stale_copy(fleet3)
    fresh = Router(load(fleet3), move_wait=15)
    stale = Router(load(stale_path), move_wait=15)
    try:
        with (
            RouterWriters(fresh, MOVED + STILL, topo.modulus, writers=2) as w_fresh,
            RouterWriters(stale, MOVED + STILL, topo.modulus, writers=2) as w_stale,
        ):
            time.sleep(0.5)
            report = move_shards(load(fleet3), MOVED, "pg3")
            time.sleep(1.5)  # the stale Router must keep writing after the cutover
        assert load(stale_path).host_of(MOVED[0]).name == "pg1"  # its file never changed
        assert stale.topology.host_of(MOVED[0]).name == "pg1"
        assert stale.redirects() == {n: "pg3" for n in MOVED}
        # The redirect uses the stale Router's own entry for pg3 (its DSN, its password_env).
        assert stale._locate(MOVED[0]) is stale.topology.host("pg3")
    finally:
        fresh.close()
        stale.close()
    assert not w_fresh.errors, w_fresh.errors[:3]
    assert not w_stale.errors, w_stale.errors[:3]
    start, end = report["freeze_started_at"], report["freeze_ended_at"]
    after = [r for r in w_stale.written if r[1] in MOVED and r[2] > end]
    assert len(after) > 20, (
        "the stale Router did not keep writing to the moved shards after the cutover"
    )
    # The stall: the longest write of the stale Router that was under way at or after the freeze.
    stall = max(r[3] - r[2] for r in w_stale.written if r[3] >= start)
    gaps = sorted(r[3] for r in w_stale.written if r[1] in MOVED)
    longest_gap = max(b - a for a, b in itertools.pairwise(gaps))
    print(
        f"\nstale router: {len(w_stale.written)} writes ({len(after)} to moved shards after the cutover), "
        f"0 errors, longest write from the freeze on {stall * 1000:.0f} ms, longest gap between acknowledged "
        f"writes to moved shards {longest_gap * 1000:.0f} ms, freeze {report['freeze_seconds']:.3f}s; "
        f"fresh router: {len(w_fresh.written)} writes"
    )
    assert stall <= 1.0
    assert longest_gap <= 1.0
    # Every acknowledged row is where its shard lives now, exactly once; nothing else is there.
    final = load(fleet3)
    for n in MOVED + STILL:
        ids = ids_on(final, final.host_of(n).name, [n])
        assert len(ids) == len(set(ids)), f"duplicate rows in shard {n}"
        acked = [r[0] for r in w_fresh.written + w_stale.written if r[1] == n]
        assert len(acked) == len(set(acked))
        assert set(ids) == before[n] | set(acked), f"shard {n}: rows lost or unexpected"
        assert len(ids) == len(before[n]) + len(acked)


def test_redirect_cleared_when_the_file_catches_up(fleet3):
    stale_path = stale_copy(fleet3)
    with Router(load(stale_path), move_wait=0.5) as router:
        assert router.execute(9, "SELECT count(*) FROM photos")[0][0] == 150
        move_shards(load(fleet3), [9], "pg3")
        t0 = time.monotonic()
        assert router.execute(9, "INSERT INTO photos (user_id) VALUES (9)") == 1
        assert time.monotonic() - t0 < 1.0  # no wait for a file that will not change
        assert router.redirects() == {9: "pg3"} and router.host_for(9).name == "pg3"
        assert router.read(9, "SELECT count(*) FROM photos")[0][0] == 151
        shutil.copy(fleet3, stale_path)  # the app server's file is updated at last
        router.reload()
        assert router.redirects() == {}
        assert router.host_for(9).name == "pg3"
        assert router.execute(9, "SELECT count(*) FROM photos")[0][0] == 151
        # An application's own missing table is still not mistaken for a move.
        with pytest.raises(psycopg.errors.UndefinedTable):
            router.execute(3, "SELECT * FROM no_such_table")


def test_redirect_to_a_host_missing_from_the_stale_file(fleet3):
    """The stale file has no host of the redirect's name: the Router connects with the recorded DSN (no
    password) and, when that fails, says so."""
    stale_path = stale_copy(fleet3)
    stale_path.write_text(stale_path.read_text().replace("name: pg3", "name: pg3-old"))
    move_shards(load(fleet3), [10, 11], "pg3")
    with Router(load(stale_path), move_wait=0.5) as router:
        assert router.execute(10, "INSERT INTO photos (user_id) VALUES (10)") == 1
        assert router.redirects() == {10: "pg3"}
    assert len(ids_on(load(fleet3), "pg3", [10])) == 151
    # The recorded DSN does not work from this app server: the error says where it came from.
    with connect(load(fleet3), "pg1", autocommit=True) as conn:
        conn.execute(
            "UPDATE shardctl.redirects SET dsn = 'postgresql://app@127.0.0.1:1/nowhere' "
            "WHERE shard_id = 11"
        )
    with (
        Router(load(stale_path), move_wait=0.5, connect_timeout=2) as router,
        pytest.raises(HostUnreachable) as info,
    ):
        router.execute(11, "INSERT INTO photos (user_id) VALUES (11)")
    message = str(info.value)
    assert "host pg3 is unreachable" in message
    assert "not in this Router's topology file" in message and "without a password" in message
    assert "127.0.0.1:1/nowhere" in message


def test_stale_router_reads_of_a_moved_shard_return_its_rows(fleet3):
    """Filtered reads, counts, EXISTS, joins, by-ID and prepared reads of a stale Router after a move return
    the shard's rows from its new host: the old host's stub raises SCM01 for every read (issue 24, item 1),
    never an empty answer the Router would take for the truth."""
    stale_path = stale_copy(fleet3)
    topo = load(fleet3)
    with connect(topo, "pg1") as conn:
        ids7 = sorted(
            r[0] for r in conn.execute("SELECT id FROM insta9.photos WHERE user_id = 7").fetchall()
        )
        some = conn.execute("SELECT id, caption FROM insta9.photos WHERE user_id = 8").fetchone()
    assert len(ids7) == 1
    by_user = "SELECT id FROM photos WHERE user_id = %s ORDER BY id"
    warm = Router(load(stale_path), move_wait=0.5)
    for _ in range(8):  # past psycopg's prepare_threshold: a server-side prepared statement on pg1
        assert [r[0] for r in warm.read(9, by_user, (7,))] == ids7
    move_shards(load(fleet3), [9], "pg3")
    reads = {
        "filtered": (lambda r: [x[0] for x in r.read(9, by_user, (7,))], ids7),
        "count": (lambda r: r.execute(9, "SELECT count(*) FROM photos")[0][0], 150),
        "filtered count": (
            lambda r: r.read(9, "SELECT count(*) FROM photos WHERE user_id = %s", (7,))[0][0],
            1,
        ),
        "exists": (
            lambda r: r.read(9, "SELECT EXISTS (SELECT FROM photos WHERE user_id = %s)", (7,))[0][
                0
            ],
            True,
        ),
        "by id": (
            lambda r: r.read(9, "SELECT id, caption FROM photos WHERE id = %s", (some[0],)),
            [some],
        ),
        "in list": (
            lambda r: sorted(
                x[0]
                for x in r.read(
                    9, "SELECT id FROM photos WHERE id IN (%s, %s, 3)", (ids7[0], some[0])
                )
            ),
            sorted([ids7[0], some[0]]),
        ),
        "join of two stubs": (
            lambda r: r.read(
                9, "SELECT count(*) FROM photos p CROSS JOIN users u WHERE p.user_id = %s", (7,)
            )[0][0],
            3,
        ),
        "join with another schema": (
            lambda r: r.read(
                9,
                "SELECT p.id FROM photos p JOIN shardctl.shards s "
                "ON s.shard_id = 9 WHERE p.user_id = %s",
                (7,),
            ),
            [(ids7[0],)],
        ),
        "in a transaction": (
            lambda r: r.run(
                9,
                lambda c: c.execute(
                    "SELECT count(*) FROM photos WHERE user_id = %s", (7,)
                ).fetchone()[0],
            ),
            1,
        ),
        "server-side cursor": (
            lambda r: r.run(
                9,
                lambda c: (
                    c.cursor(name="c")
                    .execute("SELECT id FROM photos WHERE user_id = %s", (7,))
                    .fetchall()
                ),
            ),
            [(ids7[0],)],
        ),
    }
    got = {}
    for name, (read, expected) in reads.items():
        with Router(
            load(stale_path), move_wait=0.5
        ) as router:  # a fresh stale Router for each shape
            got[name] = (read(router), router.redirects())
    wrong = {
        name: got[name]
        for name, (_, expected) in reads.items()
        if got[name] != (expected, {9: "pg3"})
    }
    assert not wrong, (
        f"(answer, redirects) of the stale Routers that did not follow the move: {wrong}"
    )
    try:  # the Router that had prepared the read on pg1 before the move
        assert [r[0] for r in warm.read(9, by_user, (7,))] == ids7
        assert warm.redirects() == {9: "pg3"}
    finally:
        warm.close()
