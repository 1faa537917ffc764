"""init / verify / status / migrate --check on real servers: the basic happy path."""

import json

from support.fleet import connect, load, run_cli


def test_init_then_second_init_changes_nothing(fleet):
    first = run_cli("init", "--json", config=fleet)
    assert first.exit_code == 0, first
    doc = json.loads(first.stdout)
    assert doc["changed"] is True
    assert sum(h["created_count"] for h in doc["hosts"]) == 64

    second = run_cli("init", config=fleet)
    assert second.exit_code == 0, second
    assert "Nothing to do" in second.stdout

    topo = load(fleet)
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM shardctl.shards").fetchone()[0] == 32
        assert conn.execute("SELECT count(*) FROM shardctl.migrations").fetchone()[0] == 32 * 2
        assert (
            conn.execute("SELECT count(*) FROM shardctl.events WHERE kind = 'init'").fetchone()[0]
            == 1
        )


def test_verify_and_status_pass_after_init(ready_fleet):
    fleet = ready_fleet
    result = run_cli("verify", "--json", config=fleet)
    assert result.exit_code == 0, result
    doc = json.loads(result.stdout)
    assert doc["ok"] and sum(h["shards_checked"] for h in doc["hosts"]) == 64
    status = json.loads(run_cli("status", "--json", config=fleet).stdout)
    assert [h["present"] for h in status["hosts"]] == [32, 32]
    assert all(h["min_version"] == h["max_version"] == 2 for h in status["hosts"])
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 0, check


def test_ids_decode_to_their_shard(fleet):
    run_cli("init", config=fleet)
    topo = load(fleet)
    with connect(topo, "pg2") as conn:
        ids = [r[0] for r in conn.execute("SELECT insta40.next_id() FROM generate_series(1, 50)")]
    assert ids == sorted(set(ids))
    assert {topo.layout.decode(i)["shard"] for i in ids} == {40}
