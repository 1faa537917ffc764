"""Session-state statements a pooled connection must not keep: (statement, probe, the probe's clean value)."""

from __future__ import annotations

import pytest

from shardctl.model.topology import Topology

SESSION_STATEMENTS = [
    ("SELECT set_config('work_mem', '7MB', false)", "SHOW work_mem", "4MB"),
    (
        "SET statement_timeout = '4321ms'",
        "SELECT current_setting('statement_timeout') <> '4321ms'",
        True,
    ),
    (
        "CREATE TEMP TABLE users (id bigint, username text)",
        "SELECT to_regclass('pg_temp.users') IS NULL",
        True,
    ),
    (
        "SELECT pg_advisory_lock(4242)",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        0,
    ),
    ("LISTEN somewhere", "SELECT count(*) FROM pg_listening_channels()", 0),
    (
        "PREPARE mine AS SELECT 1",
        "SELECT count(*) FROM pg_prepared_statements WHERE name !~ '^_pg3_'",
        0,
    ),
]


# Fleets shared by one test file's session-state tests. What those tests do to a server lives in
# their Router's connections, gone when the Router closes at the test's end (settings, temporary
# tables, advisory locks, LISTEN, prepared statements), or is never sent at all (the transaction
# pooler cases); the rows some of them insert are never counted. So each test still starts from a
# clean session, as on a fleet of its own, without paying for two databases per case.


@pytest.fixture(scope="module")
def make_module_fleet(shardctl_fleet, tmp_path_factory):
    """``make_fleet`` for a whole test file: its fleets are dropped after the file's last test."""
    maker = shardctl_fleet.maker(
        tmp_path_factory.mktemp("module-fleet"), hosts=2, shards=64, routing=False
    )
    yield maker
    maker.cleanup()


@pytest.fixture(scope="module")
def shared_topo(make_module_fleet) -> Topology:
    """As the files' ``topo`` (``pooler: none``, 2 hosts, 16 shards, initialised), for the file."""
    return Topology.load(make_module_fleet(hosts=2, shards=16, pooler="none", init=True))


@pytest.fixture(scope="module")
def shared_topo_default(make_module_fleet) -> Topology:
    """As the files' ``topo_default`` (``pooler: transaction``), for the file."""
    return Topology.load(make_module_fleet(hosts=2, shards=16, init=True))
