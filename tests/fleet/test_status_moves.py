"""``shardctl status`` names the command each unfinished move needs (issue 12, item 6): a move in flight,
a cutover whose switch a crash interrupted, and a cut-over move whose source still keeps its old copies."""

from __future__ import annotations

import json

import pytest
from support.fleet import load, run_cli

from shardctl.ops.move import move_shards
from shardctl.ops.status import status


def status_doc(path) -> dict:
    result = run_cli("status", "--json", config=path)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def moving(doc: dict) -> dict[str, str]:
    return {h["host"]: h["moving"] for h in doc["hosts"]}


def test_status_names_the_command_each_move_needs(fleet3, monkeypatch):
    assert status_doc(fleet3)["pending_moves"] == []
    assert run_cli("move-shard", "0-3", "--to", "pg2", "prepare", config=fleet3).exit_code == 0
    doc = status_doc(fleet3)
    assert moving(doc) == {"pg1": "0-3 moving_out", "pg2": "0-3 moving_in", "pg3": ""}
    [line] = doc["pending_moves"]
    assert "shards 0-3 pg1 → pg2, phase prepared" in line
    assert (
        "shardctl move-shard 0-3 --to pg2" in line and "shardctl move-shard --abort --move" in line
    )
    human = run_cli("status", config=fleet3)
    assert human.exit_code == 0 and "shardctl move-shard 0-3 --to pg2" in human.stdout.replace(
        "\n", " "
    )

    # Cut over: the source keeps its old copies (moved_out) and status says --cleanup is needed.
    assert run_cli("move-shard", "0-3", "--to", "pg2", config=fleet3).exit_code == 0
    doc = status_doc(fleet3)
    assert moving(doc)["pg1"] == "0-3 moved_out" and moving(doc)["pg2"] == ""
    [line] = doc["pending_moves"]
    move_id = line.split()[1]
    assert f"shardctl move-shard --cleanup --move {move_id}" in line and "phase cut_over" in line

    # A crash after the source's commit, before the flip: the line names the command that finishes it.
    import shardctl.ops.move.cutover as mv

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(mv, "flip_topology", crash)
    with pytest.raises(KeyboardInterrupt):
        move_shards(load(fleet3), [7, 8], "pg3")
    monkeypatch.undo()
    lines = status(load(fleet3)).pending_moves
    assert len(lines) == 2
    assert (
        "the switch is unfinished" in lines[1]
        and "run shardctl move-shard 7-8 --to pg3" in lines[1]
    )

    # Finished and cleaned up: nothing left to say.
    assert run_cli("move-shard", "7-8", "--to", "pg3", config=fleet3).exit_code == 0
    assert run_cli("move-shard", "--cleanup", "--move", move_id, config=fleet3).exit_code == 0
    doc = status_doc(fleet3)
    [line] = doc["pending_moves"]
    assert "7-8" in line and "--cleanup" in line
    assert moving(doc) == {"pg1": "7-8 moved_out", "pg2": "", "pg3": ""}
