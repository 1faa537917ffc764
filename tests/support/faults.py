"""Router fault test support: servers of the test file's own (``box``), and a server frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from shardctl.dev.sandbox import Sandbox

from .fleet import run_cli, sandbox_dir

CONNECT_TIMEOUT = 2  # libpq's minimum


PG1_KEY, PG2_KEY = 3, 40  # 64 shards over 2 hosts: pg1 0-31, pg2 32-63


def probed(results: list[tuple[float, object]]) -> bool:
    """A call after the first waited for the server again: the breaker let a probe through."""
    return any(seconds >= CONNECT_TIMEOUT - 0.5 for seconds, _ in results[1:])


def calling(started: float, results: list[tuple[float, object]]) -> bool:
    """Whether a fault test keeps calling the faulty host: for CONNECT_TIMEOUT + 1 s (the first call,
    the breaker's fast failures, a probe), and past that until a probe has run, within the
    2 * CONNECT_TIMEOUT + 2 s these loops used to run in full."""
    elapsed = time.monotonic() - started
    return elapsed < CONNECT_TIMEOUT + 1 or (
        not probed(results) and elapsed < 2 * CONNECT_TIMEOUT + 2
    )


@pytest.fixture(scope="module")
def fault_box():
    """Two servers of this test file's own (never the session's), initialised once for the file."""
    sandbox = Sandbox(sandbox_dir("faults"))
    try:
        sandbox.up(hosts=2, shards=64)
        assert run_cli("init", config=sandbox.topology_path).exit_code == 0
        yield sandbox
    finally:
        sandbox.destroy()


@pytest.fixture
def box(fault_box):
    """The file's servers, both running: a test that stops or freezes a host brings it back before it
    ends (and ``frozen`` always thaws); if a failed test left one stopped, it is started here."""
    for host in fault_box.state.hosts:
        if not fault_box.running(host):
            fault_box.start_host(host.name)
    return fault_box


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
