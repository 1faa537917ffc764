"""The move's state machine and the topology file lock (no server)."""

from __future__ import annotations

import time

import pytest

from shardctl.errors import OperationFailed
from shardctl.model.topology_file import TopologyFile, flip_topology, topology_file_lock
from shardctl.ops.move.run import Pacer
from shardctl.ops.move.state import FINISHED, FORWARD, Phase, check_transition, combined_phase


def test_forward_path_and_finished_come_from_the_table():
    assert [str(p) for p in FORWARD] == [
        "preparing",
        "prepared",
        "syncing",
        "synced",
        "cut_over",
        "cleaned",
    ]
    assert set(FINISHED) == {Phase.CLEANED, Phase.ABORTED}


@pytest.mark.parametrize(
    "src,tgt,phase",
    [
        (None, None, "new"),
        ("preparing", None, "preparing"),
        ("prepared", "preparing", "preparing"),
        ("synced", "syncing", "syncing"),
        ("cut_over", "synced", "cut_over"),
        ("cleaned", "cut_over", "cut_over"),
        ("cleaned", "cleaned", "cleaned"),
        ("aborted", None, "aborted"),
        ("aborted", "synced", "aborting"),
        ("cut_over", "aborting", "aborting"),
        ("aborted", "aborted", "aborted"),
    ],
)
def test_combined_phase(src, tgt, phase):
    assert combined_phase(src, tgt) == phase
    assert isinstance(combined_phase(src, tgt), str)  # stored and compared as text


def test_transitions_refuse_going_back():
    check_transition("source", None, Phase.PREPARING)
    check_transition("source", "synced", Phase.SYNCED)  # re-recorded with more detail
    check_transition("target", "cut_over", Phase.ABORTING)
    with pytest.raises(OperationFailed, match="cannot go from cut_over to synced"):
        check_transition("source", "cut_over", Phase.SYNCED)
    with pytest.raises(OperationFailed):
        check_transition("source", "aborted", Phase.PREPARING)


def test_topology_file_lock_is_reentrant_and_save_refuses_a_file_changed_meanwhile(tmp_path):
    path = tmp_path / "shardctl.yaml"
    path.write_text(
        'version: 1\nid:\n  layout: instagram\n  epoch: "2011-01-01T00:00:00Z"\nshards:\n  count: 4\n'
        '  schema: "insta{n}"\nhosts:\n  - name: a\n    dsn: "postgresql://x@h/db"\n    shards: "0-3"\n'
        '  - name: b\n    dsn: "postgresql://x@h2/db"\n    shards: []\n'
    )
    with topology_file_lock(path), topology_file_lock(path):
        stale = TopologyFile(path)
        assert flip_topology(path, [2, 3], "a", "b") is True  # takes the lock again: no deadlock
    assert TopologyFile(path).host_shards("b") == [2, 3]
    stale.set_host_shards("a", [0, 1, 2, 3])
    with pytest.raises(OperationFailed, match="changed while this command ran"):
        stale.save()  # would have undone the flip
    assert TopologyFile(path).host_shards("b") == [2, 3]


def test_a_pacer_rests_its_ratio_of_the_work_since_it_last_rested():
    pacer = Pacer(2.0)
    time.sleep(0.05)  # a unit of work
    t0 = time.monotonic()
    pacer.rest()
    assert time.monotonic() - t0 >= 0.1 and pacer.rested >= 0.1
    pacer.rest()  # no work since: (almost) no rest
    assert pacer.rested < 0.15
