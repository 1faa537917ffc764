"""PgBouncer in front of the session servers, for fleets made by ``make_fleet``.

The ``pgbouncer`` fixture (session scoped, re-exported by ``tests/conftest.py``) gives a
:class:`PoolerFronts`: ``pgbouncer.front(path, "transaction")`` adds the fleet's databases to that
mode's PgBouncer (started on first use, one per pool mode, each serving every session server),
reloads it, and rewrites the fleet's topology so every host's ``dsn`` goes through PgBouncer, its
``admin_dsn`` goes direct and its ``pooler`` names the mode (docs/topology.md, "DSNs per purpose").
The fleet's databases have unique names, so a database entry's alias is the database's own name.

Without pgbouncer installed the tests that use it skip, except in CI (``CI=true``): there they fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from shardctl.dev.pooler import Pooler, pgbouncer_binary
from shardctl.model.topology_file import TopologyFile

# Transaction mode: 3 server connections per database, so they switch between clients all the time.
# Session mode holds a server connection per client connection: it needs one per Router connection.
POOL_SIZES = {"transaction": 3, "session": 40}


def require_pgbouncer() -> str:
    binary = pgbouncer_binary()
    if binary is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + ": CI must run the pooler tests", pytrace=False)
        pytest.skip(message)
    return binary


class PoolerFronts:
    """One PgBouncer per pool mode, in front of every session server."""

    def __init__(self, base: Path):
        self.base = base
        self.poolers: dict[str, Pooler] = {}

    def pooler(self, mode: str) -> Pooler:
        require_pgbouncer()
        if mode not in self.poolers:
            pooler = Pooler(self.base / mode)
            pooler.configure(mode=mode, pool_size=POOL_SIZES.get(mode, 3))
            pooler.start()
            self.poolers[mode] = pooler
        return self.poolers[mode]

    def front(self, path: Path, mode: str = "transaction") -> Path:
        """Put ``mode``'s PgBouncer in front of every host of the topology at ``path`` (rewritten in place)."""
        pooler = self.pooler(mode)
        doc = TopologyFile(path)
        nodes = list(doc.doc.get("hosts") or [])
        for node in nodes:
            direct = str(node["dsn"])
            parts = conninfo_to_dict(direct)
            pooler.add_database(parts["dbname"], int(parts["port"]), parts["dbname"])
        pooler.reload()
        for node in nodes:
            direct = str(node["dsn"])
            node["admin_dsn"] = DoubleQuotedScalarString(direct)
            node["dsn"] = DoubleQuotedScalarString(pooler.dsn(conninfo_to_dict(direct)["dbname"]))
            node["pooler"] = mode
        doc.save()
        return path

    def transactions(self, path: Path, mode: str = "transaction") -> int:
        """Transactions ``mode``'s PgBouncer has served for the databases of the fleet at ``path``
        (``SHOW STATS``: how a test knows its clients went through it)."""
        names = {
            conninfo_to_dict(str(node["dsn"]))["dbname"]
            for node in TopologyFile(path).doc.get("hosts") or []
        }
        pooler = self.pooler(mode)
        with pooler._console() as conn:
            cur = conn.execute("SHOW STATS")
            columns = [d.name for d in cur.description]
            stats = [dict(zip(columns, row)) for row in cur.fetchall()]
        return sum(int(r["total_xact_count"]) for r in stats if r["database"] in names)

    def close(self) -> None:
        for pooler in self.poolers.values():
            pooler.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(servers):
    """PgBouncers (by pool mode) in front of the session servers: ``pgbouncer.front(path, mode)``."""
    fronts = PoolerFronts(Path(tempfile.mkdtemp(prefix="shardctl-test-pooler-")))
    yield fronts
    fronts.close()


@pytest.fixture
def pooled_fleet(make_fleet, mode, request):
    """``make_fleet(...)`` seen through the test module's ``mode`` fixture: direct DSNs (``pooler:
    none``), or PgBouncer's with direct admin DSNs (``pooler: transaction|session``), initialised."""

    def make(**kwargs):
        path = make_fleet(**kwargs, pooler="none" if mode == "direct" else None, init=True)
        if mode != "direct":
            request.getfixturevalue("pgbouncer").front(path, mode)
        return path

    return make
