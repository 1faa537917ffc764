"""Standby test support: a sandbox whose hosts have streaming replicas (``replicated``)."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from shardctl.dev.sandbox import Sandbox

from .fleet import run_cli, sandbox_dir

KEY = 3


@pytest.fixture
def replicated():
    """One host with a standby (written into the topology by the sandbox), initialised."""
    directory = sandbox_dir("standby")
    box = Sandbox(directory)
    try:
        r = run_cli(
            "sandbox",
            "up",
            "--dir",
            directory,
            "--hosts",
            "1",
            "--shards",
            "8",
            "--standby",
            "--json",
        )
        assert r.exit_code == 0, r
        doc = json.loads(r.stdout)
        assert [s["name"] for s in doc["standbys"]] == ["pg1-standby"]
        assert run_cli("init", config=box.topology_path).exit_code == 0
        yield box
    finally:
        box.destroy()


def wait_replayed(topo, timeout: float = 10) -> None:
    primary, standby = topo.hosts[0].dsn, topo.hosts[0].standby
    with psycopg.connect(primary, autocommit=True) as p:
        lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby, autocommit=True) as s:
        while not s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.05)
