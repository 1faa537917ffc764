"""The query files under shardctl/sql/queries run as they are in psql (their headers' ``\\set``
variables given with ``-v``), and give what shardctl reads through them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.fleet import connect, load, run_cli
from support.load import pg_bin

from shardctl.sql import fingerprint
from shardctl.sql.catalog import inspect

QUERIES = Path(__file__).resolve().parents[2] / "shardctl" / "sql" / "queries"
VARIABLES = {  # what the headers' examples set, for a fleet's first two shards
    "schemas": "{insta0,insta1}",
    "per_shard": "{next_id/0}",
    "privileges": "{INSERT,UPDATE,DELETE,TRUNCATE}",
}


def psql_file(dsn: str, path: Path) -> subprocess.CompletedProcess:
    sets = [x for name, value in VARIABLES.items() for x in ("-v", f"{name}={value}")]
    return subprocess.run(
        [
            str(pg_bin("psql")),
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            *sets,
            "-d",
            dsn,
            "-f",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def ready(fleet):
    assert run_cli("init", config=fleet).exit_code == 0
    return fleet


@pytest.mark.parametrize("name", sorted(p.stem for p in QUERIES.glob("*.sql")))
def test_a_query_file_runs_in_psql(ready, name):
    topo = load(ready)
    done = psql_file(topo.hosts[0].dsn, QUERIES / f"{name}.sql")
    assert done.returncode == 0, done.stderr


def test_psql_and_shardctl_read_the_same(ready):
    topo = load(ready)
    dsn = topo.hosts[0].dsn
    rows = psql_file(dsn, QUERIES / "fingerprint_objects.sql").stdout.strip().splitlines()
    with connect(topo, topo.hosts[0].name) as conn:
        objects = fingerprint.objects(conn, ["insta0", "insta1"])
        facts = inspect.server_facts(conn)
    assert len(rows) == sum(len(o) for o in objects.values()) > 0
    assert objects["insta0"] == objects["insta1"]  # one history: the same neutral text
    line = psql_file(dsn, QUERIES / "server_facts.sql").stdout.strip()
    assert line.split("|")[0] == str(facts["version_num"]) and facts["wal_level"] == "logical"
