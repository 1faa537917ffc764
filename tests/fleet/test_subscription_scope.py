"""pg_subscription is the cluster's: a subscription of one database must not answer for a
same-named one in another (two fleets, or an adoption's id map, on one server)."""

from __future__ import annotations

import psycopg

from shardctl.sql.catalog import replication


def test_a_same_named_subscription_in_another_database_is_not_this_ones(make_fleet):
    """Database A holds subscription ``s``, enabled and without tables (as a run killed between ENABLE
    and REFRESH leaves it). Database B's subscription ``s`` is created and started: it must be
    enabled with its own ENABLE, and no state of A's may be read as B's."""
    other, here = make_fleet.new_database(0), make_fleet.new_database(0)
    nowhere = "host=127.0.0.1 port=1 dbname=none connect_timeout=1"
    with psycopg.connect(other, autocommit=True) as a:
        replication.create_subscription(a, "s", nowhere, start=False)
        a.execute("ALTER SUBSCRIPTION s ENABLE")
        assert replication.started_without_tables(a, "s")
    try:
        with psycopg.connect(here, autocommit=True) as b:
            assert replication.subscriptions(b, ["s"]) == {}
            assert not replication.started_without_tables(b, "s")
            assert replication.sync_state(b, ["s"])["tables"] == 0
            assert replication.apply_workers(b, "s") == 0
            replication.create_subscription(b, "s", nowhere, start=False)
            assert replication.subscription_problems(b, ["s"])[0] == "subscription s is disabled"
            b.execute("ALTER SUBSCRIPTION s SET (slot_name = NONE)")
            b.execute("DROP SUBSCRIPTION s")
    finally:
        with psycopg.connect(other, autocommit=True) as a:
            a.execute("ALTER SUBSCRIPTION s DISABLE")
            a.execute("ALTER SUBSCRIPTION s SET (slot_name = NONE)")
            a.execute("DROP SUBSCRIPTION s")
