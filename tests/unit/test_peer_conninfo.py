"""The connection string a move's subscription gets when the source has no peer_dsn: the client's own
DSN without the settings that name the client's files (the target's server opens it, not shardctl)."""

from __future__ import annotations

import pytest
from psycopg import conninfo

from shardctl.ops.move.run import server_side


@pytest.mark.parametrize(
    "dsn, kept, dropped",
    [
        (
            "postgresql://app@db1:5432/app?sslmode=verify-full&sslrootcert=/home/me/ca.crt",
            {
                "host": "db1",
                "port": "5432",
                "dbname": "app",
                "user": "app",
                "sslmode": "verify-full",
            },
            {"sslrootcert"},
        ),
        (
            (
                "host=db1 dbname=app sslmode=verify-ca sslcert=/home/me/c.crt sslkey=/home/me/c.key sslpassword=x "
                "sslcrl=/home/me/crl sslcrldir=/home/me/crls passfile=/home/me/.pgpass connect_timeout=5"
            ),
            {"host": "db1", "dbname": "app", "sslmode": "verify-ca", "connect_timeout": "5"},
            {"sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir", "passfile"},
        ),
        (
            "host=db1 dbname=app sslmode=verify-full sslrootcert=system",
            {"host": "db1", "dbname": "app", "sslmode": "verify-full", "sslrootcert": "system"},
            set(),
        ),
    ],
)
def test_the_client_files_are_left_out_and_everything_else_stays(dsn, kept, dropped):
    out = conninfo.conninfo_to_dict(server_side(dsn))
    assert out == kept and not dropped & set(out)


def test_a_dsn_without_client_files_is_passed_as_it_is():
    dsn = "postgresql://app@db1/app?sslmode=require"
    assert server_side(dsn) is dsn
