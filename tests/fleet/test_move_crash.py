"""SIGKILL of move-shard at each phase boundary and inside the freeze, under write load: the move says it
needs finishing, one re-run finishes it, and every acknowledged row is on the new host exactly once."""

from __future__ import annotations

import json
import signal
import time

import pytest
from support import crash_at
from support.fleet import load, run_cli
from support.moves import ids_on, replication_leftovers, router_traffic

POINTS = [
    "after-prepare",
    "after-sync",
    "in-freeze",
    "after-source-commit",
    "after-activate",
    "after-flip",
]


@pytest.mark.parametrize(
    "point", [p if p == "in-freeze" else pytest.param(p, marks=pytest.mark.slow) for p in POINTS]
)
def test_sigkill_then_one_rerun_finishes(fleet3, point):
    topo = load(fleet3)
    moving = [0, 1, 2, 3]
    before = ids_on(topo, "pg1", moving)
    with router_traffic(fleet3, moving, move_wait=30) as traffic:
        killed = crash_at.run(point, "--config", str(fleet3), "move-shard", "0-3", "--to", "pg2")
        assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
        status = json.loads(run_cli("move-shard", "--status", "--json", config=fleet3).stdout)
        [move] = status["moves"]
        assert (
            status["needs_finishing"] and "move-shard 0-3 --to pg2" in status["needs_finishing"][0]
        ), status
        again = run_cli("move-shard", "0-3", "--to", "pg2", "--json", config=fleet3)
        assert again.exit_code == 0, again
        time.sleep(0.5)
    report = json.loads(again.stdout)
    assert report["phase"] == "cut_over" and report["move_id"] == move["move_id"]
    assert not traffic.errors, traffic.errors[:3]
    written = [w[0] for w in traffic.written]
    assert len(written) > 20
    on_target = ids_on(load(fleet3), "pg2", moving)
    assert sorted(on_target) == sorted(before + written), "rows lost or duplicated"
    assert all(load(fleet3).host_of(n).name == "pg2" for n in moving)
    assert replication_leftovers(topo) == {}
    status = json.loads(run_cli("move-shard", "--status", "--json", config=fleet3).stdout)
    assert status["needs_finishing"] == []
