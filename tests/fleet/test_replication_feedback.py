"""A freeze waits until the subscriptions report having applied the source's WAL as of its locks
(``replication.replayed``). With the source's writers locked out, nothing makes them report soon:
an apply worker reports only what its server has flushed, and only when its walsender pings it.
``flush_wal`` and ``FeedbackPrompt`` make both happen at once; these tests hold them to it against
the server's own flush position and its walsender's view, not against our timing of ourselves."""

from __future__ import annotations

import time

import psycopg

from shardctl.sql.catalog import replication

PROMPTED_WITHIN = 0.15  # seconds; unprompted, wal_writer_delay (200 ms) alone comes first
TRIALS = 3


def test_flush_wal_flushes_what_another_transaction_wrote(make_fleet):
    """A record of an open transaction (a LOCK's) is on disk once ``flush_wal`` returns: a commit
    that wrote no WAL of its own would not have waited for a flush."""
    dsn = make_fleet.new_database(0)
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as conn:
        holder.execute("CREATE TABLE t (i int)")
        holder.commit()
        holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        lsn = replication.wal_insert_lsn(holder)
        assert replication.flush_wal(conn)
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        assert conn.execute("SELECT %s::pg_lsn >= %s::pg_lsn", (flushed, lsn)).fetchone()[0], (
            flushed,
            lsn,
        )


def test_a_prompted_subscription_reports_while_its_source_is_locked(make_fleet):
    """The freeze's situation: rows applied just before the lock (the apply worker's asynchronous
    commits not yet flushed), the table locked, nothing more written. Prompted, the walsender's
    ``replay_lsn`` passes the lock's position within PROMPTED_WITHIN (best of TRIALS)."""
    source, target = make_fleet.new_database(0), make_fleet.new_database(1)
    with (
        psycopg.connect(source, autocommit=True) as src,
        psycopg.connect(target, autocommit=True) as tgt,
    ):
        for conn in (src, tgt):
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        src.execute("CREATE PUBLICATION feedback FOR TABLE t")
        tgt.execute(
            psycopg.sql.SQL(
                "CREATE SUBSCRIPTION feedback CONNECTION {} PUBLICATION feedback "
                "WITH (copy_data = false)"
            ).format(psycopg.sql.Literal(source))
        )
        try:
            times = []
            for trial in range(TRIALS):
                for i in range(20):
                    src.execute("INSERT INTO t VALUES (%s)", (trial * 100 + i,))
                with psycopg.connect(source) as holder:
                    holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
                    lsn = replication.wal_insert_lsn(holder)
                    prompt = replication.FeedbackPrompt(src, [tgt])
                    started = time.monotonic()
                    while not replication.replayed(src, ["feedback"], lsn):
                        assert time.monotonic() - started < 10, "never caught up"
                        prompt()
                        time.sleep(0.002)
                    times.append(time.monotonic() - started)
            assert tgt.execute("SELECT count(*) FROM t").fetchone()[0] == 20 * TRIALS
            print(f"\nprompted: replay_lsn past the lock in {[round(t, 3) for t in times]} s")
            assert min(times) < PROMPTED_WITHIN, times
        finally:
            tgt.execute("DROP SUBSCRIPTION feedback")
