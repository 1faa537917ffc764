"""The history checker (tests/support/history.py) finds each kind of violation in real databases,
and passes a history that has none: the acceptance tests that use it can fail."""

from __future__ import annotations

import psycopg
from support.fleet import load
from support.history import History, now


def insert(topo, shard: int, user_id: int, caption: str, *, host: str | None = None) -> int:
    """A row into ``insta<shard>.photos`` on ``host`` (default: the shard's host), directly."""
    target = topo.host(host) if host else topo.host_of(shard)
    with psycopg.connect(**target.connect_kwargs(purpose="admin"), autocommit=True) as conn:
        return conn.execute(
            f"INSERT INTO insta{shard}.photos (user_id, caption) VALUES (%s, %s) RETURNING id",
            (user_id, caption),
        ).fetchone()[0]


def test_checker_passes_a_clean_history_and_finds_every_violation(make_fleet):
    path = make_fleet(hosts=2, shards=8, init=True)  # pg1 0-3, pg2 4-7
    topo = load(path)

    clean = History(path)
    t = now()
    a = insert(topo, 1, 9, clean.caption("w"))
    clean.acked("w", 9, a, t, now(), schema="insta1")
    b = insert(topo, 5, 13, clean.caption("w"))
    clean.acked("w", 13, b, t, now())
    clean.read("r", 9, "insta1", [a], now(), now())
    clean.read("r", 13, "insta5", [b], now(), now())
    clean.batch("bench", clean.caption("bench-1"), acked=1)
    insert(topo, 2, 10, clean.caption("bench-1"))
    clean.retried("psql", "write", 9, "SCM01: shard 1 moved to pg2")
    report = clean.check()
    assert report.ok, report
    assert (
        report.counts["writes"] == 2
        and report.counts["rows"] == 3
        and report.counts["retries"] == 1
    )

    bad = History(path)
    t = now()
    bad.acked("w", 9, 123456789, t, now())  # lost: no such row
    c = insert(topo, 1, 17, bad.caption("w"))
    insert(topo, 5, 17, "copy")  # (not tagged: not this history's row)
    with psycopg.connect(
        **topo.host("pg2").connect_kwargs(purpose="admin"), autocommit=True
    ) as conn:
        conn.execute(
            "INSERT INTO insta5.photos (id, user_id, caption) VALUES (%s, 17, %s)",
            (c, bad.caption("x")),
        )
    bad.acked("w", 17, c, t, now())  # duplicated (pg1:insta1 and pg2:insta5)
    d = insert(topo, 2, 9, bad.caption("w"))  # wrong shard: key 9 is shard 1
    bad.acked("w", 9, d, t, now(), schema="insta2")
    bad.read("r", 17, "insta2", [c], now(), now())  # answered by a wrong shard
    bad.read("r", 17, "insta1", [], now(), now())  # missed c, acked before it began
    bad.batch("bench", bad.caption("bench-1"), acked=2)  # 0 rows for 2 acknowledged
    bad.failed("w", "write", 9, RuntimeError("boom"), now(), now())
    report = bad.check()
    assert not report.ok
    assert set(report.violations) == {
        "lost",
        "duplicated",
        "wrong_shard",
        "read_wrong_shard",
        "stale_read",
        "batch",
        "error",
    }, report
    assert any(
        f"id {d}: the insert ran in insta2" in v for v in report.violations["wrong_shard"]
    ), report
    assert any(
        f"row {c} (user_id 17, shard 1 on pg1) found in pg2:insta5" in v
        for v in report.violations["wrong_shard"]
    ), report
    assert "stale_read: 1" in str(report) and "boom" in str(report)
