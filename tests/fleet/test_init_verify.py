"""init and verify on real servers: tampering caught, hosts down, failing shards, idempotence, scale."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from support.fleet import connect, load, run_cli

from shardctl.dev.sandbox import Sandbox
from shardctl.sql.render import render_next_id


def one_error_line(result) -> str:
    """Failures print exactly one error line on stderr, and never a traceback.

    (The instagram layout's 64-bit warning may precede it: it is a warning, not part of the failure.)
    """
    lines = [
        ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("warning: ")
    ]
    assert len(lines) == 1, result
    assert "Traceback" not in result.stderr and lines[0].startswith("error: "), result
    return lines[0]


def admin(topo, host):
    return connect(topo, host, autocommit=True)


def counts(topo, host) -> dict:
    """Everything init could have touched on a host."""
    with admin(topo, host) as conn:
        return {
            "shards": conn.execute("SELECT count(*) FROM shardctl.shards").fetchone()[0],
            "migrations": conn.execute(
                "SELECT count(*), max(applied_at) FROM shardctl.migrations"
            ).fetchone(),
            "events": conn.execute("SELECT count(*) FROM shardctl.events").fetchone()[0],
            "relations": conn.execute("SELECT count(*) FROM pg_class").fetchone()[0],
            "schemas": conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0],
            "functions": conn.execute(
                "SELECT count(*), string_agg(md5(prosrc), ',' ORDER BY oid) FROM pg_proc "
                "WHERE proname = 'next_id'"
            ).fetchone(),
        }


@pytest.fixture
def ready(make_fleet):
    """A 2-host, 16-shard fleet, initialised and verified clean (pg1: 0-7, pg2: 8-15)."""
    path = make_fleet(hosts=2, shards=16, init=True)
    clean = run_cli("verify", config=path)
    assert clean.exit_code == 0, clean
    return path


def verify_fails(path, shard: int, reason: str) -> dict:
    """verify exits 1, the human output and the error line name the shard, and --json lists it."""
    human = run_cli("verify", config=path)
    assert human.exit_code == 1, human
    line = one_error_line(human)
    assert f"shard {shard}" in line, line
    assert re.search(
        rf"violation\s+pg\d shard {shard} \(insta{shard}\): .*{reason}", human.stdout
    ) or re.search(rf"first: pg\d shard {shard}: .*{reason}", line), human
    # Said once: the violation the error line names is not listed again under the table.
    first = re.search(r"first: (pg\d+) shard (\d+): (.*)$", line)
    assert (
        first
        and f"violation {first[1]} shard {first[2]} (insta{first[2]}): {first[3]}"
        not in human.stdout
    ), human
    as_json = run_cli("verify", "--json", config=path)
    assert as_json.exit_code == 1, as_json
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False
    assert shard in {v["shard"] for v in doc["violations"]}, doc["violations"]
    return doc


# ---- 1. tampering ----------------------------------------------------------------


def test_verify_catches_next_id_with_wrong_shard_number(ready):
    topo = load(ready)
    # Shard 6's function, pointed at shard 5's sequence: mints IDs for shard 6 inside insta5.
    wrong = render_next_id(topo, 6).replace("insta6", "insta5")
    assert "insta6" not in wrong
    with admin(topo, "pg1") as conn:
        conn.execute(wrong)
    doc = verify_fails(ready, 5, "")
    reasons = [v["reason"] for v in doc["violations"] if v["shard"] == 5]
    assert any("differs from the template" in r for r in reasons), reasons
    assert any("mints IDs for shard 6, not 5" in r for r in reasons), reasons
    assert {v["shard"] for v in doc["violations"]} == {5}


def test_verify_catches_an_edited_epoch(ready):
    topo = load(ready)
    epoch_ms = topo.layout.epoch_ms
    sql = render_next_id(topo, 10)
    assert str(epoch_ms) in sql
    # One day later epoch: IDs decode to a day earlier than the host clock.
    with admin(topo, "pg2") as conn:
        conn.execute(sql.replace(str(epoch_ms), str(epoch_ms + 86_400_000)))
    doc = verify_fails(ready, 10, "")
    reasons = [v["reason"] for v in doc["violations"] if v["shard"] == 10]
    assert any("differs from the template" in r for r in reasons), reasons
    assert any("wrong epoch" in r for r in reasons), reasons


def test_verify_catches_a_dropped_shard_schema(ready):
    """A shard missing is the fleet's health (ops.health): exit 4 and the fix, as status says it; the
    violation still names the shard."""
    topo = load(ready)
    with admin(topo, "pg2") as conn:
        conn.execute("DROP SCHEMA insta12 CASCADE")
    human = run_cli("verify", config=ready)
    assert human.exit_code == 4, human
    assert one_error_line(human) == "error: verify: pg2: shards 12 missing (run shardctl init)"
    assert re.search(r"violation\s+pg2 shard 12 \(insta12\): shard schema is missing", human.stdout)
    doc = json.loads(run_cli("verify", "--json", config=ready).stdout)
    assert doc["ok"] is False and doc["exit_code"] == 4
    assert [(v["host"], v["shard"]) for v in doc["violations"]] == [("pg2", 12)]


def test_init_rebuilds_a_shard_whose_schema_was_dropped(ready):
    """Before the fix, init said "Nothing to do: every shard exists" and verify kept failing."""
    topo = load(ready)
    with admin(topo, "pg2") as conn:
        conn.execute("DROP SCHEMA insta12 CASCADE")
    assert run_cli("verify", config=ready).exit_code == 4  # shards missing (ops.health)
    rebuilt = run_cli("init", config=ready)
    assert rebuilt.exit_code == 0, rebuilt
    assert "Nothing to do" not in rebuilt.stdout
    assert (
        "pg2: shards 12 were recorded but their schemas had been dropped; built them again"
        in rebuilt.stdout
    )
    assert "Created 1 shard at V2 (migrations V1, V2 applied to each), in " in rebuilt.stdout, (
        rebuilt
    )
    assert run_cli("verify", config=ready).exit_code == 0
    with admin(topo, "pg2") as conn:
        assert conn.execute(
            "SELECT array_agg(version ORDER BY version) FROM shardctl.migrations "
            "WHERE shard_id = 12"
        ).fetchone()[0] == [1, 2]
        assert (
            conn.execute(
                "SELECT detail->>'recreated' FROM shardctl.events ORDER BY id DESC LIMIT 1"
            ).fetchone()[0]
            == "12"
        )
    again = run_cli("init", "--json", config=ready)
    assert (
        json.loads(again.stdout)["changed"] is False and json.loads(again.stdout)["recreated"] == {}
    )


def test_verify_catches_a_schema_of_another_hosts_shard(ready):
    topo = load(ready)
    with admin(topo, "pg1") as conn:  # shard 13 belongs to pg2
        conn.execute("CREATE SCHEMA insta13")
    doc = verify_fails(
        ready,
        13,
        "unexpected shard schema on this host, not recorded by shardctl "
        r"\(it belongs to pg2\)",
    )
    assert [(v["host"], v["shard"]) for v in doc["violations"]] == [("pg1", 13)]


def test_verify_catches_a_schema_beyond_the_shard_count(ready):
    topo = load(ready)
    with admin(topo, "pg2") as conn:
        conn.execute("CREATE SCHEMA insta63")
    doc = verify_fails(ready, 63, r"not in the topology")
    assert [(v["host"], v["shard"]) for v in doc["violations"]] == [("pg2", 63)]


# ---- 2. a host down when init starts ---------------------------------------------


def test_init_with_a_host_down_exits_3_then_completes(private_sandbox):
    box: Sandbox = private_sandbox(hosts=2, shards=16)
    box.stop_host("pg2")
    path = box.topology_path

    down = run_cli("init", "--json", config=path)
    assert down.exit_code == 3, down
    line = one_error_line(down)
    assert "pg2" in line and "unreachable" in line, line
    doc = json.loads(down.stdout)
    assert doc["ok"] is False
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["pg2"]["reachable"] is False and hosts["pg2"]["error"]
    assert hosts["pg1"]["reachable"] is True and hosts["pg1"]["created_count"] == 8

    topo = load(path)
    with admin(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM shardctl.shards").fetchone()[0] == 8
        assert conn.execute("SELECT count(*) FROM shardctl.migrations").fetchone()[0] == 16

    human = run_cli("init", config=path)  # the human table names the host, too
    assert human.exit_code == 3 and "pg2" in human.stdout, human
    for command in ("verify", "status"):  # nor can verify or status judge a host that is down
        result = run_cli(command, config=path)
        assert result.exit_code == 3, result
        assert "host pg2 is unreachable" in one_error_line(result)

    box.start_host("pg2")
    again = run_cli("init", "--json", config=path)
    assert again.exit_code == 0, again
    hosts = {h["host"]: h for h in json.loads(again.stdout)["hosts"]}
    assert hosts["pg1"]["created_count"] == 0 and hosts["pg1"]["unchanged"] == 8
    assert hosts["pg2"]["created_count"] == 8
    checked = run_cli("verify", config=path)
    assert checked.exit_code == 0, checked


# ---- 4. a failing shard is rolled back whole; a re-run finishes ---------------------


def failing_migrations(path: Path, shard: int) -> Path:
    """Copy the fleet's migrations, making V0002 fail for one shard only."""
    migrations = path.parent / "migrations"
    v2 = next(migrations.glob("V0002__*.sql"))
    original = v2.read_text()
    v2.write_text(original + f"\n{{% if shard_id == {shard} %}}SELECT 1/0;{{% endif %}}\n")
    return v2


def shard_objects(conn, schema: str) -> dict:
    return {
        "schema": conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()[0],
        "relations": conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            (schema,),
        ).fetchone()[0],
    }


def test_a_migration_failing_for_one_shard_rolls_it_back_whole(make_fleet):
    path = make_fleet(hosts=2, shards=16)
    v2 = failing_migrations(path, 7)
    original = v2.read_text().replace("\n{% if shard_id == 7 %}SELECT 1/0;{% endif %}\n", "")

    failed = run_cli("init", "--json", config=path)
    assert failed.exit_code == 1, failed
    line = one_error_line(failed)
    assert "1 shard(s) failed (first: shard 7 on pg1 at V0002__create_likes.sql: " in line, line
    doc = json.loads(failed.stdout)
    failures = [f for h in doc["hosts"] for f in h["failed"]]
    assert len(failures) == 1, failures
    assert (
        failures[0]["shard"] == 7
        and failures[0]["schema"] == "insta7"
        and failures[0]["version"] == 2
    )
    assert "division by zero" in failures[0]["error"]

    human = run_cli(
        "init", config=path
    )  # same failure: the error line names shard, migration file and error
    assert human.exit_code == 1
    assert re.search(
        r"shard 7 on pg1 at V0002__create_likes.sql: .*division by zero", one_error_line(human)
    ), human
    assert "failed shard 7" not in human.stdout, human  # said once

    topo = load(path)
    with admin(topo, "pg1") as conn:
        # Shard 7 left no trace: no schema, no relations, no control rows.
        assert shard_objects(conn, "insta7") == {"schema": 0, "relations": 0}
        assert (
            conn.execute("SELECT count(*) FROM shardctl.shards WHERE shard_id = 7").fetchone()[0]
            == 0
        )
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE shard_id = 7").fetchone()[
                0
            ]
            == 0
        )
        # Every other shard of the host is complete.
        rows = conn.execute(
            "SELECT shard_id, array_agg(version ORDER BY version) FROM shardctl.migrations "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert rows == [(n, [1, 2]) for n in range(8) if n != 7]
        assert conn.execute("SELECT count(*) FROM insta6.likes").fetchone()[0] == 0
    with admin(topo, "pg2") as conn:
        assert conn.execute("SELECT count(*) FROM shardctl.migrations").fetchone()[0] == 16

    v2.write_text(original)
    fixed = run_cli("init", "--json", config=path)
    assert fixed.exit_code == 0, fixed
    doc = json.loads(fixed.stdout)
    assert [h["created"] for h in doc["hosts"]] == ["7", ""]
    assert run_cli("verify", config=path).exit_code == 0
    with admin(topo, "pg1") as conn:
        assert conn.execute(
            "SELECT array_agg(version ORDER BY version) FROM shardctl.migrations WHERE shard_id = 7"
        ).fetchone()[0] == [1, 2]


def test_a_hand_made_schema_fails_only_its_shard_and_is_left_alone(make_fleet):
    path = make_fleet(hosts=2, shards=16)
    topo = load(path)
    with admin(topo, "pg1") as conn:
        conn.execute("CREATE SCHEMA insta5")
        conn.execute("CREATE TABLE insta5.precious (x int)")
        conn.execute("INSERT INTO insta5.precious VALUES (42)")

    failed = run_cli("init", "--json", config=path)
    assert failed.exit_code == 1, failed
    one_error_line(failed)
    failures = [f for h in json.loads(failed.stdout)["hosts"] for f in h["failed"]]
    assert [(f["shard"], f["schema"]) for f in failures] == [(5, "insta5")]
    assert 'schema "insta5" already exists' in failures[0]["error"]

    with admin(topo, "pg1") as conn:
        # Nothing of shardctl's inside insta5 and no control rows; the user's table is untouched.
        assert conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'insta5'"
        ).fetchall() == [("precious",)]
        assert (
            conn.execute("SELECT count(*) FROM shardctl.shards WHERE shard_id = 5").fetchone()[0]
            == 0
        )
        assert (
            conn.execute("SELECT count(*) FROM shardctl.migrations WHERE shard_id = 5").fetchone()[
                0
            ]
            == 0
        )
        assert (
            conn.execute("SELECT count(DISTINCT shard_id) FROM shardctl.migrations").fetchone()[0]
            == 7
        )
    # verify names the half-made shard too.
    checked = run_cli("verify", "--json", config=path)
    assert checked.exit_code == 4  # a shard never created: missing, as status says (ops.health)
    assert {v["shard"] for v in json.loads(checked.stdout)["violations"]} == {5}

    with admin(topo, "pg1") as conn:  # the operator moves the data away
        conn.execute("DROP SCHEMA insta5 CASCADE")
    fixed = run_cli("init", config=path)
    assert fixed.exit_code == 0, fixed
    assert "Created 1 shard at V2 (migrations V1, V2 applied to each), in " in fixed.stdout, fixed
    assert run_cli("verify", config=path).exit_code == 0


def test_a_failure_in_a_later_batch_leaves_every_shard_whole_or_untouched(make_fleet):
    path = make_fleet(hosts=1, shards=40)
    v2 = failing_migrations(path, 25)
    failed = run_cli("init", "--json", "--batch-size", "10", config=path)
    assert failed.exit_code == 1, failed
    line = one_error_line(failed)
    assert "1 shard(s) failed" in line and "10 shard(s) not started" in line, line
    report = json.loads(failed.stdout)["hosts"][0]
    assert [f["shard"] for f in report["failed"]] == [25]
    assert report["not_started"] == "30-39"
    topo = load(path)
    with admin(topo, "pg1") as conn:
        versions = dict(
            conn.execute(
                "SELECT shard_id, array_agg(version ORDER BY version) "
                "FROM shardctl.migrations GROUP BY 1"
            ).fetchall()
        )
        schemas = {
            r[0]
            for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'insta%'")
        }
    # The failing batch was replayed shard by shard: its other shards are complete; later batches untouched.
    assert set(versions) == set(range(30)) - {25}
    assert all(v == [1, 2] for v in versions.values())
    assert schemas == {f"insta{n}" for n in versions}

    v2.write_text(v2.read_text().replace("{% if shard_id == 25 %}SELECT 1/0;{% endif %}", ""))
    fixed = run_cli("init", "--json", "--batch-size", "10", config=path)
    assert fixed.exit_code == 0, fixed
    assert json.loads(fixed.stdout)["hosts"][0]["created"] == "25,30-39"
    assert run_cli("verify", config=path).exit_code == 0


# ---- 5. idempotence ---------------------------------------------------------------


def test_second_init_says_nothing_to_do_and_changes_nothing(ready):
    topo = load(ready)
    before = {h: counts(topo, h) for h in ("pg1", "pg2")}
    again = run_cli("init", "--json", config=ready)
    assert again.exit_code == 0, again
    doc = json.loads(again.stdout)
    assert doc["changed"] is False and doc["ok"] is True
    assert [h["unchanged"] for h in doc["hosts"]] == [8, 8]
    assert [h["created_count"] + h["migrated_count"] for h in doc["hosts"]] == [0, 0]
    human = run_cli("init", config=ready)
    assert human.exit_code == 0 and "Nothing to do" in human.stdout, human
    assert {h: counts(topo, h) for h in ("pg1", "pg2")} == before


# ---- 9. scale ---------------------------------------------------------------------


def init_at_scale(path: Path, shards: int, *verify_args: str) -> dict:
    """init, a second init, then verify (with ``verify_args``), over a whole fleet; returns (and prints) the
    timings."""
    topo = load(path)
    assert topo.shard_count == shards and len(topo.hosts) == 4
    timings = {}

    t0 = time.perf_counter()
    first = run_cli("init", "--json", config=path)
    timings["init"] = time.perf_counter() - t0
    assert first.exit_code == 0, first
    doc = json.loads(first.stdout)
    assert sum(h["created_count"] for h in doc["hosts"]) == shards

    t0 = time.perf_counter()
    second = run_cli("init", config=path)
    timings["second init"] = time.perf_counter() - t0
    assert second.exit_code == 0, second
    assert "Nothing to do" in second.stdout, second

    t0 = time.perf_counter()
    checked = run_cli("verify", "--json", *verify_args, config=path)
    timings["verify"] = time.perf_counter() - t0
    assert checked.exit_code == 0, checked
    doc = json.loads(checked.stdout)
    assert sum(h["shards_checked"] for h in doc["hosts"]) == shards

    for h in topo.hosts:
        with admin(topo, h.name) as conn:
            assert conn.execute("SELECT count(*) FROM shardctl.shards").fetchone()[0] == len(
                h.shards
            )
            assert conn.execute("SELECT count(*) FROM shardctl.migrations").fetchone()[
                0
            ] == 2 * len(h.shards)
    print(
        f"\n{shards} shards over {len(topo.hosts)} hosts: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
    )
    return timings


def four_host_fleet(make_fleet, shards: int) -> Path:
    """Four hosts (databases) over the session's servers: two topologies of two hosts, joined."""
    quarter = shards // 4
    ranges = [f"{i * quarter}-{(i + 1) * quarter - 1}" for i in range(4)]
    first = make_fleet(hosts=2, shards=shards, ranges=ranges[:2])
    second = make_fleet(hosts=2, shards=shards, ranges=ranges[2:])
    extra = second.read_text().split("hosts:\n", 1)[1]
    extra = extra.replace("name: pg2", "name: pg4").replace("name: pg1", "name: pg3")
    first.write_text(first.read_text() + extra)
    return first


@pytest.mark.parametrize("shards", [256, pytest.param(2048, marks=pytest.mark.slow)])
def test_init_shards_over_4_hosts(make_fleet, shards):
    """2048 shards is the scale test (the slow suite); 256 runs the same init, re-init and verify checks."""
    init_at_scale(four_host_fleet(make_fleet, shards), shards)


@pytest.mark.slow
def test_init_8192_shards_over_4_sandbox_hosts(private_sandbox):
    """The layout's whole shard space over four servers of its own (~40-55 s here: run with -m slow)."""
    # verify checks the IDs of 512 shards per host by default; --full checks every shard's.
    init_at_scale(private_sandbox(hosts=4, shards=8192).topology_path, 8192, "--full")
