"""Router fault test support: servers of the test's own (``box``), and a server frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from .fleet import run_cli

CONNECT_TIMEOUT = 2  # libpq's minimum


PG1_KEY, PG2_KEY = 3, 40  # 64 shards over 2 hosts: pg1 0-31, pg2 32-63


@pytest.fixture
def box(private_sandbox):
    sandbox = private_sandbox(hosts=2, shards=64)
    assert run_cli("init", config=sandbox.topology_path).exit_code == 0
    return sandbox


def server_processes(box, name: str) -> list[int]:
    """The postmaster of sandbox host ``name`` and all its children (backends, workers)."""
    host = next(h for h in box.state.hosts if h.name == name)
    root = box.pid(host)
    pids = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == root:
                pids.append(int(entry.name))
    return pids


@contextmanager
def frozen(box, name: str):
    """SIGSTOP the whole server (postmaster and backends): it accepts TCP but answers nothing."""
    pids = server_processes(box, name)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
