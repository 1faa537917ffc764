"""``shardctl redeploy`` on real servers: template functions re-deployed online, per shard, recorded,
shown by ``plan``; layout and epoch changes refused (issue 13, item 5)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from support.fleet import connect, load, run_cli

from shardctl.router import Router


def set_function(fleet: Path, old: str, new: str) -> None:
    text = fleet.read_text()
    assert f"  function: {old}\n" in text
    fleet.write_text(text.replace(f"  function: {old}\n", f"  function: {new}\n"))


def languages(topo, host: str) -> dict[str, int]:
    with connect(topo, host) as conn:
        return dict(
            conn.execute(
                """SELECT l.lanname, count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                 JOIN shardctl.shards s ON s.schema_name = p.pronamespace::regnamespace::text
                WHERE p.proname = 'next_id' GROUP BY 1"""
            ).fetchall()
        )


def test_switching_id_function_redeploys_online_while_router_writes(make_fleet):
    fleet = make_fleet(hosts=2, shards=64, function="plpgsql", init=True)
    set_function(fleet, "plpgsql", "sql")

    stale = run_cli("verify", config=fleet)
    assert stale.exit_code == 1 and "differs from the template's rendering" in stale.stderr, stale
    plan = run_cli("plan", "--json", config=fleet)
    assert plan.exit_code == 0, plan
    assert json.loads(plan.stdout)["templates"]["stale"] == {
        "pg1": {"next_id/0": "0-31"},
        "pg2": {"next_id/0": "32-63"},
    }
    assert (
        "template next_id/0 differs on shards 0-31 (run shardctl redeploy)"
        in run_cli("plan", config=fleet).stdout
    )

    # Writers through the Router, on every shard, for the whole re-deploy.
    topo = load(fleet)
    stop = threading.Event()
    acked: list[int] = [0] * 4
    errors: list[BaseException] = []
    ids: list[list[int]] = [[] for _ in range(4)]

    def writer(index: int) -> None:
        with Router(topo, max_size=2) as router:
            key = index
            try:
                while not stop.is_set():
                    (row,) = router.execute(
                        key, "INSERT INTO photos (user_id) VALUES (%s) RETURNING id", (key,)
                    )
                    acked[index] += 1
                    ids[index].append(row[0])
                    key += 4
            except BaseException as exc:  # noqa: BLE001 - checked in the test thread
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    before = sum(acked)
    result = run_cli("redeploy", "--json", config=fleet)
    during = sum(acked) - before
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(30)
    assert result.exit_code == 0, result
    doc = json.loads(result.stdout)
    assert {h["host"]: h["deployed_count"] for h in doc["hosts"]} == {"pg1": 32, "pg2": 32}
    assert errors == [], errors[:3]
    assert during > 0 and before > 0, (before, during)  # writes went on through the re-deploy
    print(
        f"redeploy {doc['seconds']}s for 64 shards; rows acknowledged: {before} before, {during} during, "
        f"{sum(acked)} in all; errors {len(errors)}"
    )

    # Every acknowledged row is there, with an ID that decodes to its shard.
    total = 0
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            for (schema,) in conn.execute("SELECT schema_name FROM shardctl.shards").fetchall():
                total += conn.execute(f"SELECT count(*) FROM {schema}.photos").fetchone()[0]
    assert total == sum(acked)
    for index, minted in enumerate(ids):
        assert len(set(minted)) == len(minted)
        for k, value in enumerate(minted):
            assert topo.layout.decode(value)["shard"] == (index + 4 * k) % 64

    verified = run_cli("verify", "--json", config=fleet)
    assert verified.exit_code == 0, verified
    assert json.loads(verified.stdout)["violations"] == []
    assert languages(topo, "pg1") == {"sql": 32} and languages(topo, "pg2") == {"sql": 32}

    # Recorded: a ledger row per shard and object, an event per host; a second run has nothing to do.
    with connect(topo, "pg1") as conn:
        rows = conn.execute(
            "SELECT shard_id, object, length(checksum) FROM shardctl.templates ORDER BY 1"
        ).fetchall()
        assert rows == [(n, "next_id/0", 64) for n in range(32)]
        assert (
            conn.execute("SELECT count(*) FROM shardctl.events WHERE kind = 'redeploy'").fetchone()[
                0
            ]
            == 1
        )
    again = run_cli("redeploy", config=fleet)
    assert again.exit_code == 0 and "Nothing to re-deploy" in again.stdout, again
    assert json.loads(run_cli("plan", "--json", config=fleet).stdout)["templates"]["stale"] == {
        "pg1": {},
        "pg2": {},
    }


def test_own_template_function_is_deployed_and_updated(make_fleet, tmp_path):
    fleet = make_fleet(hosts=1, shards=4)
    templates = fleet.parent / "templates"
    templates.mkdir()
    base = (Path(__file__).resolve().parents[2] / "templates" / "shard.sql.j2").read_text()
    (templates / "shard.sql.j2").write_text(base)
    fleet.write_text(fleet.read_text() + "templates: templates/\n")
    assert run_cli("init", config=fleet).exit_code == 0
    helper = (
        "\nCREATE OR REPLACE FUNCTION {{ schema|ident }}.shard_label() RETURNS text LANGUAGE sql "
        "IMMUTABLE AS $f$ SELECT '{{ version }}-' || {{ shard_id }} $f$;\n"
    )
    (templates / "shard.sql.j2").write_text(base + helper.replace("{{ version }}", "v1"))
    dry = run_cli("redeploy", "--dry-run", "--json", config=fleet)
    assert dry.exit_code == 0, dry
    assert json.loads(dry.stdout)["hosts"][0]["stale"] == {"shard_label/0": "0-3"}
    assert run_cli("redeploy", config=fleet).exit_code == 0
    topo = load(fleet)
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT insta2.shard_label()").fetchone()[0] == "v1-2"
    (templates / "shard.sql.j2").write_text(base + helper.replace("{{ version }}", "v2"))
    result = run_cli("redeploy", "--json", config=fleet)
    assert result.exit_code == 0 and json.loads(result.stdout)["hosts"][0]["deployed_count"] == 4, (
        result
    )
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT insta3.shard_label()").fetchone()[0] == "v2-3"
        assert (
            conn.execute(
                "SELECT count(*) FROM shardctl.templates WHERE object = 'shard_label/0'"
            ).fetchone()[0]
            == 4
        )
    assert run_cli("verify", config=fleet).exit_code == 0


def test_layout_or_epoch_change_is_refused_and_changes_nothing(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)
    topo = load(fleet)
    with connect(topo, "pg1") as conn:
        before = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'next_id' "
            "AND pronamespace = 'insta1'::regnamespace"
        ).fetchone()[0]
    fleet.write_text(
        fleet.read_text().replace('epoch: "2026-01-01T00:00:00Z"', 'epoch: "2025-06-01T00:00:00Z"')
    )
    result = run_cli("redeploy", config=fleet)
    assert result.exit_code == 2, result
    assert "redeploy refused, nothing changed: shard 0: its next_id() mints IDs" in result.stderr
    assert (
        "the layout or epoch changed" in result.stderr
        and "would break existing IDs" in result.stderr
    )
    with connect(topo, "pg1") as conn:
        after = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'next_id' "
            "AND pronamespace = 'insta1'::regnamespace"
        ).fetchone()[0]
        assert after == before
        assert conn.execute("SELECT to_regclass('shardctl.templates')").fetchone()[0] is None
    plan = run_cli("plan", config=fleet)
    assert "templates: redeploy refused" in plan.stdout, plan
    # A layout change (fewer shard bits) is refused too.
    text = fleet.read_text().replace(
        'epoch: "2025-06-01T00:00:00Z"', 'epoch: "2026-01-01T00:00:00Z"'
    )
    fleet.write_text(
        text.replace(
            "  layout: instagram\n",
            "  layout: custom\n  bits: {time: 42, shard: 11, sequence: 10}\n",
        )
    )
    result = run_cli("redeploy", config=fleet)
    assert result.exit_code == 2 and "the layout or epoch changed" in result.stderr, result
