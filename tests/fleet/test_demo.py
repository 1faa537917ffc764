"""``shardctl demo``: the newcomer's tour end to end, then its servers torn down."""

from __future__ import annotations

import json
import re

from support.fleet import run_cli


def test_demo_runs_every_step_then_sandbox_down_destroys_it(server_dir):
    box = server_dir / "demo"
    try:
        result = run_cli("demo", "--dir", box)
        assert result.exit_code == 0, result
        out = result.stdout
        steps = [int(m) for m in re.findall(r"^(\d)\. ", out, flags=re.MULTILINE)]
        assert steps == [1, 2, 3, 4, 5], out
        assert "Starting 2 PostgreSQL servers" in out
        assert "created 256 shards" in out
        assert re.search(r"user\s+31341 → shard\s+109 \(insta109\) on pg1", out), out  # 31341 % 256
        assert re.search(r"verify: .*\n\s+passed: 256 shards", out), out
        assert "violation" not in out
        assert f"shardctl sandbox down --dir {box}" in out
        assert (box / "shardctl.yaml").exists()

        # A second run reuses the sandbox: nothing to create, the tour still passes.
        again = run_cli("demo", "--dir", box, "--json")
        assert again.exit_code == 0, again
        doc = json.loads(again.stdout)
        assert doc["ok"] is True and doc["created"] == 0
        assert all(d["matches_router"] for d in doc["decoded"]) and len(doc["decoded"]) == 6
        assert doc["verify"]["ok"] is True
        assert "every shard already existed" in again.stderr  # narration goes to stderr with --json
    finally:
        down = run_cli("sandbox", "down", "--destroy", "--dir", box)
    assert down.exit_code == 0, down
    assert not box.exists()
