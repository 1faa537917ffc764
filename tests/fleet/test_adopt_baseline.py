"""``shardctl adopt baseline``: each app schema of tests/data/apps, its plan's fixes applied, becomes
``V0001__baseline.sql``; ``init`` applies it on a 2-host fleet, ``verify`` is green, and every
shard's tables are defined as the source's (by this test's own catalog query), but for the ID
columns, which take ``next_id()`` instead of their sequence."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from support.apps import apply_fixes, definitions, load_app
from support.fleet import connect, load, run_cli

from shardctl.sql import shard_lint

ROUTING = "routing:\n  key: user_id\n"


def fleet_without_migrations(make_fleet):
    path = make_fleet(hosts=2, shards=4, extra=ROUTING)
    for f in (path.parent / "migrations").iterdir():
        f.unlink()  # the baseline is the fleet's first migration
    return path


def planned(path, dsn, app, tmp_path):
    """The app loaded, its plan's fixes run, then a plan without blockers written to plan.yaml."""
    load_app(dsn, app)
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, app, json.loads(r.stdout))
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, "--json", config=path)
    assert r.exit_code == 0, r
    return plan_file, json.loads(r.stdout)


def without_ids(items: list[str], ids: dict[str, str]) -> list[str]:
    """Definitions with each ID column's default and identity left out (the shard's is next_id())."""
    out = []
    for item in items:
        m = re.match(r"column (\S+)\.(\S+) (.*)", item)
        if m and ids.get(m.group(1).strip('"')) == m.group(2).strip('"'):
            item = re.sub(r" (default .*|identity.*)$", "", item)
        out.append(item)
    return out


@pytest.mark.parametrize(
    "app", ["tasks_prisma", pytest.param("forum_django", marks=pytest.mark.slow)]
)
def test_baseline_inits_verifies_and_matches_the_source(make_fleet, tmp_path, app):
    path = fleet_without_migrations(make_fleet)
    dsn = make_fleet.new_database(0)
    plan_file, doc = planned(path, dsn, app, tmp_path)
    r = run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, "--json", config=path)
    assert r.exit_code == 0, r
    result = json.loads(r.stdout)
    baseline = path.parent / "migrations" / "V0001__baseline.sql"
    assert result["written"] and result["file"] == str(baseline)
    text = baseline.read_text()
    history = doc["history"][0]
    assert f"{history['applied']} migration(s) applied up to {history['last']}" in text
    assert "public." not in text and "{{ next_id }}()" in text

    # squawk's style rules may flag the app's own types (timestamp, varchar); shardctl's
    # schema-per-shard rules (fixed schemas, sequences that bypass next_id()...) find nothing
    r = run_cli("lint", "--json", config=path)
    assert not [f for f in json.loads(r.stdout)["findings"] if f["rule"] in shard_lint.RULES], r
    assert run_cli("init", config=path).exit_code == 0
    r = run_cli("verify", config=path)
    assert r.exit_code == 0, r

    sharded = {t["name"]: t["id_column"] for t in doc["tables"] if t["kind"] in ("root", "column")}
    skip = tuple(t["name"] for t in doc["tables"] if t["name"] not in sharded)
    source = without_ids(definitions(dsn, skip=skip), sharded)
    topo = load(path)
    for shard in range(topo.shard_count):
        host = topo.host_of(shard)
        shard_dsn = psycopg.conninfo.make_conninfo(**topo.host(host.name).connect_kwargs())
        got = definitions(shard_dsn, topo.schema_name(shard))
        assert without_ids(got, sharded) == source, (shard, sorted(set(got) ^ set(source))[:6])
        for table, column in sharded.items():
            if column:  # the shard's ID columns take next_id(), and nothing else does
                item = f"column {table}.{column} bigint not null default S.next_id()"
                assert item in got, [g for g in got if g.startswith(f"column {table}.{column} ")]

    # a new root row on shard 3 gets an ID that names shard 3
    root = doc["root"]
    with connect(topo, topo.host_of(3).name, autocommit=True) as conn:
        conn.execute(f"SET search_path = {topo.schema_name(3)}")
        columns = {
            "tasks_prisma": "(email, plan_id) VALUES ('n@x', 1)",
            "forum_django": "(password, is_superuser, username, first_name, last_name, email, "
            "is_staff, is_active, date_joined) VALUES ('p', false, 'n', '', '', "
            "'', false, true, now())",
        }[app]
        new_id = conn.execute(f"INSERT INTO {root} {columns} RETURNING id").fetchone()[0]
    assert topo.layout.decode(new_id)["shard"] == 3


def test_baseline_refuses_blockers_stale_plans_and_a_used_folder(make_fleet, tmp_path):
    path = fleet_without_migrations(make_fleet)
    dsn = make_fleet.new_database(0)
    load_app(dsn, "tasks_prisma")
    plan_file = tmp_path / "blocked.yaml"
    assert run_cli("adopt", "plan", "--from", dsn, "--out", plan_file, config=path).exit_code == 1
    baseline = path.parent / "migrations" / "V0001__baseline.sql"
    r = run_cli("adopt", "baseline", "--from", dsn, "--plan", plan_file, config=path)
    assert r.exit_code == 1 and "the plan has 8 blocker(s)" in r.stderr, r
    assert not baseline.exists()

    plan_file, _ = planned(path, make_fleet.new_database(0), "tasks_prisma", tmp_path)
    other = dsn  # the same app without the fixes: not what the plan describes
    r = run_cli("adopt", "baseline", "--from", other, "--plan", plan_file, config=path)
    assert r.exit_code == 2 and "is stale: table task_labels is" in r.stderr, r
    assert not baseline.exists()

    (path.parent / "migrations" / "V0001__x.sql").write_text("SELECT 1;\n")
    r = run_cli("adopt", "baseline", "--from", other, "--plan", plan_file, config=path)
    assert r.exit_code == 2 and "already holds migrations (V0001__x.sql)" in r.stderr, r
    r = run_cli("adopt", "baseline", "--from", other, "--plan", tmp_path / "none.yaml", config=path)
    assert r.exit_code == 2 and "cannot read it" in r.stderr, r


@pytest.mark.slow
@pytest.mark.parametrize("app", ["tasks_prisma", "forum_django"])
def test_plan_and_baseline_at_size(make_fleet, tmp_path, app):
    """The same path on 20,000 users (the task tracker is some 390 MB, most of it TOAST): the plan and the baseline read
    the catalog only, so their time does not grow with the rows."""
    path = fleet_without_migrations(make_fleet)
    dsn = make_fleet.new_database(0)
    load_app(dsn, app, users=20_000)
    r = run_cli("adopt", "plan", "--from", dsn, "--json", config=path)
    apply_fixes(dsn, app, json.loads(r.stdout))
    r = run_cli(
        "adopt", "plan", "--from", dsn, "--out", tmp_path / "plan.yaml", "--json", config=path
    )
    assert r.exit_code == 0, r
    planned_in = json.loads(r.stdout)["seconds"]
    r = run_cli(
        "adopt", "baseline", "--from", dsn, "--plan", tmp_path / "plan.yaml", "--json", config=path
    )
    assert r.exit_code == 0, r
    with psycopg.connect(dsn) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    print(
        f"{app}: {size / 2**20:.0f} MB, plan {planned_in:.3f} s, baseline {json.loads(r.stdout)['seconds']:.3f} s"
    )
    assert planned_in < 5
