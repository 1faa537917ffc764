"""Redirects: a host a shard moved away from says where it went (name + DSN without a password), so a
reader with a stale topology file can follow the move; abort points the other way."""

from __future__ import annotations

import psycopg
import pytest
from support.fleet import connect, load

from shardctl.ops.move import abort_move, move_shards
from shardctl.sql.catalog.control import dsn_without_password, read_redirects


def test_dsn_without_password():
    assert "password" not in dsn_without_password(
        "postgresql://app:s3cret@db1:5432/app?sslmode=require"
    )
    assert "s3cret" not in dsn_without_password("host=db1 user=app password=s3cret dbname=app")
    assert "host=db1" in dsn_without_password("host=db1 user=app password=s3cret dbname=app")


def test_source_records_where_the_shards_went(fleet3):
    stale = load(fleet3)  # a Router's copy of the file, never reloaded
    report = move_shards(load(fleet3), [9, 10], "pg3")
    with connect(stale, stale.host_of(9).name) as conn:  # the host the stale file names
        found = read_redirects(conn, [9, 10, 11])
        with pytest.raises(
            psycopg.Error
        ) as info:  # a direct client writing to the old copy is told where
            conn.execute(
                f"INSERT INTO insta9_moved_{report['move_id']}.photos (user_id) VALUES (9)"
            )
    assert info.value.sqlstate == "SCM01" and "shard 9 moved to pg3" in str(info.value)
    assert set(found) == {9, 10}
    assert found[9]["host"] == "pg3" and found[9]["schema"] == "insta9"
    assert found[9]["move_id"] == report["move_id"]
    assert "password" not in found[9]["dsn"]
    # The stale reader connects with its own entry for that host (its secret, its DSN).
    with connect(stale, found[9]["host"]) as conn:
        assert conn.execute("SELECT count(*) FROM insta9.photos").fetchone()[0] == 150
    with connect(stale, "pg3") as conn:
        assert read_redirects(conn, [9, 10]) == {}

    abort_move(load(fleet3), shards=[9, 10])
    with connect(stale, "pg1") as conn:
        assert read_redirects(conn, [9, 10]) == {}  # the source holds them again
    with connect(stale, "pg3") as conn:
        back = read_redirects(conn, [9, 10])
    assert back[9]["host"] == "pg1"
