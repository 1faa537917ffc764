"""Messages said once, and said right (issue 15), for the cases that need no server: the layout
warning printed once and only by info/init/verify, a host error naming its host once, the plain
(no-terminal) progress of a move's freeze, and the "already there" answer of move-shard."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.process import run_shardctl

from shardctl.cli.move import _human_move, plain_progress
from shardctl.engine.fanout import HostResult, raise_for_status
from shardctl.errors import HostUnreachable, OperationFailed

WARNING = (
    "warning: the instagram layout uses all 64 bits: its IDs turn negative on 2060-11-03T19:53:47.776Z "
    "(and overflow on 2095-09-07T15:47:35.552Z)"
)

TOPOLOGY = """\
version: 1
id:
  layout: instagram
  epoch: "2026-01-01T00:00:00Z"
shards:
  count: 64
  schema: "insta{n}"
hosts:
  - name: pg1
    dsn: "postgresql://postgres@127.0.0.1:1/one"
    shards: "0-31"
  - name: pg2
    dsn: "postgresql://postgres@127.0.0.1:1/two"
    shards: "32-63"
"""


@pytest.fixture
def topo(tmp_path) -> Path:
    path = tmp_path / "shardctl.yaml"
    path.write_text(TOPOLOGY)
    return path


def test_layout_warning_once_in_info_only_there(topo):
    """A real process, so every warning path (the CLI's, Python's warnings module) is seen."""
    shown = run_shardctl("info", config=topo)
    assert shown.returncode == 0, shown
    assert shown.stderr.splitlines() == [WARNING]
    for args in (
        ["decode-id", "12345"],
        ["encode-id", "--shard", "5", "--sequence", "1", "--ms", "0"],
        ["locate", "5"],
        ["render"],
        ["lint"],
    ):
        quiet = run_shardctl(*args, config=topo)
        assert quiet.returncode == 0, (args, quiet)
        assert WARNING not in quiet.stderr and "warning:" not in quiet.stderr, (args, quiet)


def test_layout_warning_once_in_verify_and_init_then_one_error_line(topo):
    """verify and init show the warning once, then the one-line error; nothing is said twice, and the
    table footer does not repeat the error."""
    for command in ("verify", "init"):
        result = run_shardctl(command, config=topo)
        assert result.returncode == 3, result
        lines = result.stderr.splitlines()
        assert lines[0] == WARNING and len(lines) == 2, result
        assert lines[1].startswith("error: host pg1, pg2 is unreachable: connection failed: "), (
            result
        )
        assert lines[1].count("pg1") == 1 and lines[1].count("Connection refused") == 1, result
        assert "Connection refused" not in result.stdout, result
    status = run_shardctl("status", config=topo)
    assert status.returncode == 3 and not status.stderr.startswith("warning:"), status


def test_a_host_error_names_its_host_once():
    hosts = [
        HostResult("pg1", error="host pg1: another shardctl run holds the lock (pid 7)"),
        HostResult("pg2", error='relation "shardctl.shards" does not exist'),
    ]
    with pytest.raises(OperationFailed) as caught:
        raise_for_status("init", hosts, ["2 shard(s) failed"])
    assert str(caught.value) == (
        "init: 2 shard(s) failed; host pg1: another shardctl run holds the lock (pid 7); "
        'host pg2: relation "shardctl.shards" does not exist'
    )


def test_unreachable_hosts_each_reason_once_and_the_other_failures_too():
    hosts = [
        HostResult("pg1", reachable=False, error="timeout expired"),
        HostResult("pg2", reachable=False, error="Connection refused"),
        HostResult("pg3", error="host pg3: no control schema"),
    ]
    with pytest.raises(HostUnreachable) as caught:
        raise_for_status("verify", hosts)
    assert str(caught.value) == (
        "host pg1, pg2 is unreachable: pg1: timeout expired; pg2: Connection refused; "
        "host pg3: no control schema"
    )
    same = [
        HostResult("pg1", reachable=False, error="Connection refused"),
        HostResult("pg2", reachable=False, error="Connection refused"),
    ]
    with pytest.raises(HostUnreachable) as caught:
        raise_for_status("verify", same)
    assert str(caught.value) == "host pg1, pg2 is unreachable: Connection refused"


def test_plain_progress_prints_every_freeze_step(capsys):
    """Without a terminal: each stage of the freeze is its own line; a counted step prints when it
    starts and finishes; a shrinking lag does not flood the output."""
    tick = plain_progress()
    for args in [
        ("catch-up", 0, 0, "lag 3 MB"),
        ("catch-up", 0, 0, "lag 2 MB"),
        ("catch-up", 0, 0, "lag 1 kB"),
        ("verify", 0, 12, "before the freeze"),
        ("verify", 6, 12, "before the freeze"),
        ("verify", 12, 12, "before the freeze"),
        ("freeze", 0, 0, "locking"),
        ("freeze", 0, 0, "waiting for lag 0"),
        ("verify", 0, 0, "after the cutover"),
        ("note", 0, 0, "retrying the freeze"),
        ("freeze", 0, 0, "locking"),
        ("freeze", 0, 0, "waiting for lag 0"),
    ]:
        tick(*args)
    assert capsys.readouterr().err.splitlines() == [
        "catch-up: lag 3 MB",
        "verify: 0/12 before the freeze",
        "verify: 12/12 before the freeze",
        "freeze: locking",
        "freeze: waiting for lag 0",
        "verify: after the cutover",
        "retrying the freeze",
        "freeze: locking",
        "freeze: waiting for lag 0",
    ]


def test_move_to_where_the_shards_are_says_so(capsys):
    _human_move(
        {
            "command": "move-shard",
            "shards": "0-63",
            "source": "pg3",
            "target": "pg3",
            "phases_run": [],
            "phase": "nothing to do",
            "nothing_to_do": True,
            "messages": ["shards 0-63 are already on pg3: nothing was done"],
            "seconds": 0.0,
        }
    )
    assert capsys.readouterr().out == "Shards 0-63 are already on pg3: nothing was done.\n"


def test_lock_holder_descriptions():
    """Who holds a lock, as LockBusy says it: in full, without what another role's session hides, exiting."""
    from datetime import datetime

    from shardctl.sql.locks import LockHolder

    since = datetime(2026, 1, 2, 3, 4, 5)
    assert LockHolder(7, "shardctl migrate lock", None, since, False).describe() == (
        "pid 7, shardctl migrate lock, from local socket, connected 2026-01-02 03:04:05"
    )
    assert (
        LockHolder(7, "", "10.0.0.9/32", None, False).describe()
        == "pid 7, unnamed client, from 10.0.0.9/32"
    )
    assert LockHolder(7, None, None, None, True).describe() == "pid 7, exiting"
