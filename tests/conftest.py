"""Fixtures: real PostgreSQL servers from the project's own sandbox (no Docker, no system install).

The servers are shardctl's pytest plugin's (``shardctl.testing``, the one users get):
``shardctl_fleet`` starts 3 for the session (``shardctl_hosts`` in pyproject.toml), and each test
fleet gets fresh databases on them, so tests are isolated without paying for new servers. An
initialised fleet (``make_fleet(init=True)``) is a copy of a template database that ``init`` built
once per fleet shape. Tests that stop or kill servers use ``private_sandbox`` instead.

Helpers live in ``tests/support/`` (``support.fleet``: ``run_cli``, ``load``, ``connect``, …); tests
import them from there, never from this file or from another test file.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

# Bytecode is written and reused, as on a user's machine, even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): the workers and the ~250 shardctl processes the suite starts would each
# compile shardctl (and rewrite the test modules) again, 0.2 CPU-s a process, a tenth of the suite.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest
from support.apps import drop_id_maps
from support.fleet import run_cli, sandbox_dir

from shardctl.dev.sandbox import Sandbox
from shardctl.dev.servers import INITDB_CACHE_ENV
from shardctl.model.topology import LayoutWarning
from shardctl.testing import FleetMaker, ShardctlFleet

# Fixtures shared by several test files live with their helpers in tests/support/.
_OWN_INITDB_CACHE = pytest.StashKey[Path]()

pytest_plugins = [
    "support.pooler",
    "support.moves",
    "support.faults",
    "support.standby",
    "support.sessions",
]


# xdist hands each worker whole files (--dist loadfile), in the order the items come. Its own order
# (which addopts turns off with --no-loadscope-reorder) puts the files with the most tests first, so
# the heaviest files with few tests (test_security.py, test_move_versions.py, 15 to 20 s each) started
# in the last half-minute and ran on while the other workers had finished. Longest first instead, by
# the seconds each file took in a measured run: SHARDCTL_FILE_SECONDS=write python -m pytest -q
# rewrites the table. A file not in it counts as DEFAULT_FILE_SECONDS.
FILE_SECONDS_PATH = Path(__file__).parent / "data" / "file_seconds.json"
FILE_SECONDS = json.loads(FILE_SECONDS_PATH.read_text())
DEFAULT_FILE_SECONDS = 2.0
_measured_seconds: collections.Counter[str] = collections.Counter()


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    # A stable sort: a file's tests keep their order, and stay together.
    items.sort(key=lambda item: -FILE_SECONDS.get(_file_of(item.nodeid), DEFAULT_FILE_SECONDS))


def pytest_runtest_logreport(report):
    if os.environ.get("SHARDCTL_FILE_SECONDS") == "write":
        _measured_seconds[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session, exitstatus):
    worker = hasattr(session.config, "workerinput")
    if os.environ.get("SHARDCTL_FILE_SECONDS") == "write" and not worker and _measured_seconds:
        table = {f: round(s, 1) for f, s in sorted(_measured_seconds.items(), key=lambda x: -x[1])}
        FILE_SECONDS_PATH.write_text(json.dumps(table, indent=0) + "\n")


def pytest_configure(config):
    warnings.filterwarnings("ignore", category=LayoutWarning)
    # The tests start some 60 private sandboxes: each new server is a copy of a cluster initdb made
    # once per build (dev/servers.LocalServers.initdb). Set here, before xdist starts its workers, so
    # they and every CLI subprocess share one cache; removed when the session ends.
    if INITDB_CACHE_ENV not in os.environ:
        cache = sandbox_dir("initdb-cache")
        os.environ[INITDB_CACHE_ENV] = str(cache)
        config.stash[_OWN_INITDB_CACHE] = cache


def pytest_unconfigure(config):
    cache = config.stash.get(_OWN_INITDB_CACHE, None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        del os.environ[INITDB_CACHE_ENV]


@pytest.fixture
def server_dir():
    """A directory for a test's own servers, outside pytest's tmp_path (``support.fleet.sandbox_dir``)."""
    path = sandbox_dir("dir")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def servers(shardctl_fleet: ShardctlFleet) -> Sandbox:
    """The session's sandbox: the plugin's servers."""
    assert isinstance(shardctl_fleet.box, Sandbox), (
        "the project's suite runs on the embedded engine"
    )
    return shardctl_fleet.box


@pytest.fixture
def make_fleet(shardctl_fleet, tmp_path) -> FleetMaker:
    """``make_fleet(hosts=2, shards=64, …, init=False)``: the path of a new topology over fresh
    databases on the session servers (``shardctl.testing.FleetMaker``); dropped after the test."""
    maker = shardctl_fleet.maker(tmp_path, hosts=2, shards=64, routing=False)
    yield maker
    if any("adoption:" in p.read_text() for p in maker.base.glob("fleet-*/shardctl.yaml")):
        drop_id_maps(maker)  # an adoption's id map database, which the maker does not know
    maker.cleanup()


@pytest.fixture
def fleet(make_fleet) -> Path:
    """A 2-host, 64-shard topology over fresh databases (not yet initialised)."""
    return make_fleet()


@pytest.fixture
def ready_fleet(make_fleet) -> Path:
    """A 2-host, 64-shard topology, initialised (as ``init`` leaves it)."""
    return make_fleet(init=True)


@pytest.fixture
def private_sandbox():
    """Servers of this test's own, for tests that stop or kill them."""
    boxes: list[Sandbox] = []

    def make(hosts: int = 2, shards: int = 64, **up) -> Sandbox:
        box = Sandbox(sandbox_dir(f"private{len(boxes)}"))
        box.up(hosts=hosts, shards=shards, **up)
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.destroy()


@pytest.fixture
def shardctl():
    return run_cli


os.environ.setdefault(
    "SHARDCTL_SANDBOX", str(Path(os.environ.get("TMPDIR", "/tmp")) / "shardctl-test-sandbox")
)
