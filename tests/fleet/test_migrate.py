"""``migrate`` on real servers: versioned migrations over every shard, integrity, locks, timeouts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from support.fleet import connect, load, run_cli
from support.migrations import ADD_LOCATION, add_migration, ledger, migrated, shards_with_column
from support.process import run_shardctl, start_shardctl

UNIQUE_USERNAME = (
    "ALTER TABLE {{ schema|ident }}.users ADD COLUMN email text;\n"
    "ALTER TABLE {{ schema|ident }}.users ADD CONSTRAINT users_username_key UNIQUE (username);\n"
)


def as_json(result) -> dict:
    return json.loads(result.stdout)


def failed(doc: dict) -> dict[int, dict]:
    return {f["shard"]: f for h in doc["hosts"] for f in h["failed"]}


def timed(*args, config):
    started = time.perf_counter()
    result = run_cli(*args, config=config)
    return result, time.perf_counter() - started


# ---- acceptance: scale ------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [512, pytest.param(4096, marks=pytest.mark.slow)])
def test_new_migration_then_check_is_fast(make_fleet, shards):
    """4096 shards is the acceptance size, a scale test (the slow suite); 512 runs the same checks and
    time bounds at an eighth of it."""
    fleet = make_fleet(hosts=2, shards=shards)
    half = shards // 2
    result, seconds = timed("init", config=fleet)
    assert result.exit_code == 0, result
    print(f"\ninit {shards} shards on 2 hosts: {seconds:.2f}s")
    topo = load(fleet)

    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    # init recorded the checksums it verified: straight after it, --check renders nothing.
    result, seconds = timed("migrate", "--check", "--json", config=fleet)
    assert result.exit_code == 1, result
    assert sum(d["integrity"]["rendered"] for d in as_json(result)["details"].values()) == 0
    print(f"migrate --check with V3 pending, right after init: {seconds:.3f}s")
    assert seconds < 2.0
    result = run_cli("migrate", "--check", config=fleet)
    assert result.exit_code == 1, result
    assert f"pg1: V0003__photo_location.sql on {half} shards" in result.stderr
    assert f"pg2: V0003__photo_location.sql on {half} shards" in result.stderr

    result, seconds = timed("migrate", config=fleet)
    print(f"migrate V3 on {shards} shards: {seconds:.2f}s")
    assert result.exit_code == 0, result
    for host in ("pg1", "pg2"):
        assert len(ledger(topo, host, 3)) == half
        assert len(shards_with_column(topo, host, "photos", "location")) == half
        with connect(topo, host) as conn:
            assert (
                conn.execute(
                    "SELECT count(*) FROM pg_indexes WHERE indexname = 'photos_location_idx'"
                ).fetchone()[0]
                == half
            )

    times = []
    for _ in range(3):
        result, seconds = timed("migrate", "--check", "--json", config=fleet)
        assert result.exit_code == 0, result
        times.append(seconds)
    doc = as_json(result)
    print(
        f"migrate --check, nothing pending, {shards} shards: {min(times):.3f}s (runs: "
        f"{', '.join(f'{t:.3f}' for t in times)}; library {doc['seconds']:.3f}s)"
    )
    # After a migrate run, each host's ledger is vouched for without rendering anything.
    assert all(d["integrity"]["rendered"] == 0 for d in doc["details"].values()), doc["details"]
    assert min(times) < 1.0
    human = run_cli("migrate", "--check", config=fleet)
    assert (
        human.exit_code == 0 and "check took" in human.stdout and "Nothing pending" in human.stdout
    )

    plan = as_json(run_cli("plan", "--json", config=fleet))
    assert [h["versions"] for h in plan["hosts"]] == [{"3": half}, {"3": half}]


# ---- acceptance: failures on some shards ------------------------------------------------------------


def test_check_with_nothing_pending_loads_no_template_or_parser(make_fleet):
    """CI runs `migrate --check` on every push: with nothing pending it reads the ledgers and stops,
    without importing jinja2, pglast, rich or an ORM (start-up time), and still names every host and
    its shards up to date. A pending migration still gets rendered."""
    path = make_fleet(hosts=2, shards=8, init=True)
    proc = run_shardctl("migrate", "--check", config=path, python_flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "psycopg" in modules  # the list is real
    heavy = ("jinja2", "pglast", "rich", "sqlalchemy", "django")
    assert not {m for m in modules if m.split(".")[0] in heavy}
    assert "pg1: ok, 4 up to date" in proc.stdout and "pg2: ok, 4 up to date" in proc.stdout, proc
    assert "Nothing pending: every shard in scope is at V2." in proc.stdout, proc.stdout
    (path.parent / "migrations" / "V0003__x.sql").write_text(
        "ALTER TABLE {{ schema }}.photos ADD COLUMN x int;\n"
    )
    proc = run_shardctl("migrate", "--check", config=path)
    assert proc.returncode == 1 and "V3" in proc.stdout + proc.stderr, proc


def test_failure_on_some_shards_is_all_or_nothing_per_shard_and_rerun_completes(make_fleet):
    fleet = make_fleet(hosts=2, shards=64, init=True)
    topo = load(fleet)
    bad = {3: "pg1", 40: "pg2"}
    for shard, host in bad.items():
        with connect(topo, host) as conn:
            conn.execute(f"INSERT INTO insta{shard}.users (username) VALUES ('kim'), ('kim')")
            conn.commit()
    add_migration(fleet, "V0003__unique_username.sql", UNIQUE_USERNAME)

    # Default: the first failure stops new batches; shards in flight finish.
    result = run_cli("migrate", "--json", "--batch-size", "4", config=fleet)
    assert result.exit_code == 1, result
    doc = json.loads(result.stdout)
    fails = failed(doc)
    assert fails and set(fails) <= set(bad), fails
    for f in fails.values():
        assert f["version"] == 3 and "could not create unique index" in f["error"]
    assert "failed" in result.stderr and "shard" in result.stderr
    not_started = sum(len(h["not_started"]) for h in doc["hosts"])
    assert not_started, "the default must stop starting new shards after a failure"
    assert "not started" in result.stderr

    def assert_whole(topo):
        for host in ("pg1", "pg2"):
            done = ledger(topo, host, 3)
            assert done == shards_with_column(topo, host, "users", "email"), (
                "a shard is half migrated"
            )
            with connect(topo, host) as conn:
                constrained = {
                    int(r[0][len("insta") :])
                    for r in conn.execute(
                        "SELECT connamespace::regnamespace::text FROM pg_constraint "
                        "WHERE conname = 'users_username_key'"
                    )
                }
            assert constrained == done
        return ledger(topo, "pg1", 3) | ledger(topo, "pg2", 3)

    done = assert_whole(topo)
    assert done == migrated(doc)
    assert not done & set(bad)

    # --continue-on-error names every failing shard; everything else ends migrated.
    result = run_cli("migrate", "--json", "--continue-on-error", "--batch-size", "4", config=fleet)
    assert result.exit_code == 1, result
    doc = json.loads(result.stdout)
    assert set(failed(doc)) == set(bad)
    assert all(not h["not_started"] for h in doc["hosts"])
    assert assert_whole(topo) == set(range(64)) - set(bad)

    human = run_cli("migrate", "--continue-on-error", config=fleet)
    assert human.exit_code == 1
    # Each failure is said once: on stderr's one line, or (past the ones it names) under the table.
    said = human.stdout + human.stderr
    for shard, host in bad.items():
        assert (
            len(
                re.findall(rf"shard {shard}( \(insta{shard}\))? on {host} at V0003__\w+\.sql", said)
            )
            == 1
        ), human
    assert "could not create unique index" in said

    for shard, host in bad.items():
        with connect(topo, host) as conn:
            conn.execute(
                f"DELETE FROM insta{shard}.users WHERE ctid IN "
                f"(SELECT ctid FROM insta{shard}.users WHERE username = 'kim' LIMIT 1)"
            )
            conn.commit()
    result = run_cli("migrate", "--json", config=fleet)
    assert result.exit_code == 0, result
    assert migrated(json.loads(result.stdout)) == set(bad)
    assert assert_whole(topo) == set(range(64))
    assert run_cli("migrate", "--check", config=fleet).exit_code == 0


# ---- acceptance: two runs at once -------------------------------------------------------------------


def shardctl_process(fleet: Path, *args: str) -> subprocess.Popen:
    return start_shardctl(
        *args, config=fleet, command=[str(Path(sys.executable).with_name("shardctl"))]
    )


def test_two_migrate_runs_at_once_never_migrate_a_shard_twice(make_fleet):
    fleet = make_fleet(hosts=2, shards=64, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__slow.sql", "SELECT pg_sleep(0.1);\n" + ADD_LOCATION)

    runs = [shardctl_process(fleet, "migrate", "--json", "--batch-size", "4") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in runs]
    docs = [json.loads(out) for out, _ in outs]
    per_run = [migrated(d) for d in docs]
    assert not per_run[0] & per_run[1], "a shard was migrated by both runs"
    assert per_run[0] | per_run[1] == set(range(64))
    # The loser stops at the first host the winner holds, having changed nothing: exit 1, one clear line.
    losers = [i for i, r in enumerate(runs) if r.returncode != 0]
    assert len(losers) == 1, outs
    loser = losers[0]
    assert runs[loser].returncode == 1
    assert "another shardctl run holds the lock" in outs[loser][1]
    assert "another shardctl run holds the lock" in docs[loser]["error"]
    assert per_run[loser] == set()
    assert ledger(topo, "pg1", 3) | ledger(topo, "pg2", 3) == set(range(64))


def test_second_run_waits_for_the_lock_or_fails_clearly(make_fleet):
    fleet = make_fleet(hosts=2, shards=16, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    holder = connect(topo, "pg1", autocommit=True, application_name="shardctl migrate lock")
    release = threading.Timer(1.0, lambda: holder.execute("SELECT pg_advisory_unlock(21315, 1)"))
    try:
        holder.execute("SELECT pg_advisory_lock(21315, 1)")
        started = time.perf_counter()
        result = run_cli("migrate", "--wait", "1", config=fleet)
        elapsed = time.perf_counter() - started
        assert result.exit_code == 1, result
        assert "host pg1: another shardctl run holds the lock" in result.stderr
        assert "shardctl migrate lock" in result.stderr and "waited 1s" in result.stderr
        assert 1.0 <= elapsed < 10
        # Locks are taken on every host, in name order, before any work: a busy host stops the run
        # before it changes anything anywhere.
        assert ledger(topo, "pg1", 3) == set() and ledger(topo, "pg2", 3) == set()

        release.start()
        result = run_cli("migrate", "--wait", "30", "--json", config=fleet)
        assert result.exit_code == 0, result
        assert migrated(json.loads(result.stdout)) == set(range(16))
    finally:
        if release.is_alive():  # started: let it unlock before the connection closes
            release.join()
        holder.close()


# ---- acceptance: lock and statement timeouts --------------------------------------------------------


def test_open_application_transaction_makes_that_shard_time_out(make_fleet):
    fleet = make_fleet(hosts=2, shards=64, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    app = connect(topo, "pg1")
    try:
        # pg1's last shard: a failure stops the run (no --continue-on-error), so a blocked shard earlier
        # in pg1's order would leave the shards after it unstarted or applied, as the machine's speed
        # decides (a loaded run had 23 to 31 unstarted when shard 5 was the one locked). The open
        # transaction holds ACCESS SHARE.
        app.execute("SELECT count(*) FROM insta31.photos")
        started = time.perf_counter()
        # A 1 s retry budget (the default is 6 s): shard 31 stays locked throughout, so it times out
        # all the same, only sooner.
        result = run_cli(
            "migrate", "--lock-timeout", "500ms", "--retry-budget", "1", "--json", config=fleet
        )
        elapsed = time.perf_counter() - started
        print(f"\nmigrate with shard 31 locked by an open transaction: {elapsed:.2f}s")
        assert result.exit_code == 1, result
        assert elapsed < 15
        fails = failed(json.loads(result.stdout))
        assert list(fails) == [31]
        assert fails[31]["version"] == 3 and "lock timeout" in fails[31]["error"]
        assert "500ms" in fails[31]["error"]
        assert "shard 31 on pg1 at V0003__photo_location.sql: lock timeout" in result.stderr
        assert 31 not in ledger(topo, "pg1", 3) and 31 not in shards_with_column(
            topo, "pg1", "photos", "location"
        )
        assert ledger(topo, "pg1", 3) == set(range(31))
    finally:
        app.rollback()
        app.close()
    result = run_cli("migrate", "--json", config=fleet)
    assert result.exit_code == 0, result
    assert migrated(json.loads(result.stdout)) == {31}


def test_statement_timeout_names_shard_and_version(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)
    add_migration(fleet, "V0003__slow.sql", "SELECT pg_sleep(5);\n")
    result = run_cli("migrate", "--shards", "0", "--statement-timeout", "200ms", config=fleet)
    assert result.exit_code == 1, result
    assert "shard 0 on pg1 at V0003__slow.sql: statement timeout" in result.stderr
    assert "statement timeout" not in result.stdout, result  # said once, on stderr


# ---- acceptance: integrity --------------------------------------------------------------------------


def test_edited_applied_migration_is_detected_until_repaired(make_fleet):
    fleet = make_fleet(hosts=2, shards=32, init=True)
    assert (
        run_cli("migrate", config=fleet).exit_code == 0
    )  # vouches for the ledger: the cache path is on
    topo = load(fleet)
    path = fleet.parent / "migrations" / "V0002__create_likes.sql"
    path.write_text(
        path.read_text() + "CREATE INDEX likes_user_idx ON {{ schema|ident }}.likes (user_id);\n"
    )

    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 1, check
    assert "V0002__create_likes.sql changed after it was applied (shards 0-15)" in check.stderr
    assert "(shards 16-31)" in check.stderr

    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    result = run_cli("migrate", config=fleet)
    assert result.exit_code == 1, result
    # The refusal is said once: on stderr, not again under the table.
    assert "V0002__create_likes.sql was changed after it was applied (shards 0-15)" in result.stderr
    assert "was changed after it was applied" not in result.stdout, result
    assert "--repair" in result.stdout
    assert ledger(topo, "pg1", 3) == set(), "nothing may run while an applied file differs"

    assert run_cli("migrate", "--repair", config=fleet).exit_code == 2
    assert run_cli("migrate", "--repair", "--check", "--yes", config=fleet).exit_code == 2
    result = run_cli("migrate", "--repair", "--yes", "--json", config=fleet)
    # The ledger takes the edited file and V3 goes on; but no shard has the index the edited V0002
    # now defines, and the schema check after the run says so instead of reporting success.
    assert result.exit_code == 1, result
    assert "likes_user_idx" in result.stderr and "V0002__create_likes.sql" in result.stderr, result
    doc = json.loads(result.stdout)
    assert [d["repaired"] for d in doc["details"].values()] == [16, 16]
    assert len(migrated(doc)) == 32  # and the pending V3 went on
    check = run_cli("migrate", "--check", "--json", config=fleet)
    assert check.exit_code == 0, check
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.events WHERE kind = 'repair'").fetchone()[0]
            == 1
        )

    # A ledger row changed behind shardctl's back is caught too, cache or not.
    with connect(topo, "pg2") as conn:
        conn.execute(
            "UPDATE shardctl.migrations SET checksum = 'x' WHERE shard_id = 20 AND version = 1"
        )
        conn.commit()
    check = run_cli("migrate", "--check", config=fleet)
    assert check.exit_code == 1
    assert (
        "V0001__create_users_and_photos.sql changed after it was applied (shards 20)"
        in check.stderr
    )


def test_applied_migration_whose_file_is_gone_is_reported(make_fleet):
    fleet = make_fleet(hosts=2, shards=16, init=True)
    path = add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    assert run_cli("migrate", config=fleet).exit_code == 0
    path.unlink()
    status = json.loads(run_cli("status", "--json", config=fleet).stdout)
    assert [h["orphan_versions"] for h in status["hosts"]] == [[3], [3]]
    human = run_cli("status", config=fleet)
    assert "applied versions with no migration file: V3" in human.stdout
    check = run_cli("migrate", "--check", config=fleet)
    assert "V3 is applied on shards 0-7 but its file is gone" in check.stdout


# ---- files and rendering ----------------------------------------------------------------------------


def test_gap_duplicate_or_undefined_name_fails_before_anything_runs(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)
    topo = load(fleet)
    gap = add_migration(fleet, "V0004__skips_three.sql", ADD_LOCATION)
    result = run_cli("migrate", config=fleet)
    assert result.exit_code == 2 and "without gaps" in result.stderr, result
    gap.unlink()

    dup = add_migration(fleet, "V0002__again.sql", ADD_LOCATION)
    result = run_cli("migrate", "--check", config=fleet)
    assert result.exit_code == 2 and "version 2 is used twice" in result.stderr, result
    dup.unlink()

    typo = add_migration(
        fleet, "V0003__typo.sql", "ALTER TABLE {{ shcema|ident }}.photos ADD COLUMN x int;\n"
    )
    for args in (["migrate"], ["migrate", "--dry-run"], ["migrate", "--check"]):
        result = run_cli(*args, config=fleet)
        assert result.exit_code == 2, result
        assert "V0003__typo.sql" in result.stderr and "shcema" in result.stderr
    typo.unlink()

    # Several statements sent together run in one implicit transaction, where CONCURRENTLY cannot.
    add_migration(
        fleet,
        "V0003__two_indexes.sql",
        "-- shardctl:no-transaction\n"
        "CREATE INDEX CONCURRENTLY a_idx ON {{ schema|ident }}.photos (caption);\n"
        "CREATE INDEX CONCURRENTLY b_idx ON {{ schema|ident }}.photos (created_at);\n",
    )
    result = run_cli("migrate", config=fleet)
    assert result.exit_code == 2, result
    assert (
        "V0003__two_indexes.sql is marked -- shardctl:no-transaction but holds 2 statements"
        in result.stderr
    )
    assert ledger(topo, "pg1", 3) == set()


def test_split_statements():
    from shardctl.sql.migrations import split_statements

    # PostgreSQL's own parser (pglast) splits: statements come back without comments or semicolons.
    assert split_statements(
        "-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);\n-- a; b\n"
    ) == ["CREATE INDEX CONCURRENTLY i ON t (x)"]
    assert len(split_statements("SELECT 'a;''b'; SELECT E'\\';'; SELECT \"x;y\"")) == 3
    assert (
        len(split_statements("DO $f$ BEGIN PERFORM 1; END $f$; /* x; /* y; */ */ SELECT 1;")) == 2
    )
    assert split_statements("  ;; -- nothing\n") == []


def test_dry_run_shows_rendered_sql_and_touches_nothing(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    result = run_cli("migrate", "--dry-run", config=fleet)
    assert result.exit_code == 0, result
    assert "ALTER TABLE insta0.photos ADD COLUMN location text;" in result.stdout
    assert "ALTER TABLE insta4.photos ADD COLUMN location text;" in result.stdout
    assert "V3×4" in result.stdout
    assert (
        ledger(topo, "pg1", 3) == set()
        and shards_with_column(topo, "pg1", "photos", "location") == set()
    )
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.events WHERE kind = 'migrate'").fetchone()[
                0
            ]
            == 0
        )


def test_target_hosts_and_shards_limit_the_run(make_fleet):
    fleet = make_fleet(hosts=2, shards=16, init=True)
    topo = load(fleet)
    add_migration(fleet, "V0003__photo_location.sql", ADD_LOCATION)
    add_migration(
        fleet,
        "V0004__photo_width.sql",
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN width int;\n",
    )

    assert run_cli("migrate", "--target", "9", config=fleet).exit_code == 2
    result = run_cli("migrate", "--target", "3", "--shards", "0-2,9", "--json", config=fleet)
    assert result.exit_code == 0, result
    assert migrated(json.loads(result.stdout)) == {0, 1, 2, 9}
    assert ledger(topo, "pg1", 3) == {0, 1, 2} and ledger(topo, "pg1", 4) == set()

    assert (
        run_cli("migrate", "--check", "--shards", "0-2,9", "--target", "3", config=fleet).exit_code
        == 0
    )
    check = run_cli("migrate", "--check", "--shards", "0-2,9", config=fleet)
    assert check.exit_code == 1 and "pg1: V0004__photo_width.sql on 3 shards" in check.stderr
    assert "pg2: V0004__photo_width.sql on 1 shards" in check.stderr

    plan = json.loads(run_cli("plan", "--json", config=fleet).stdout)
    by_host = {h["host"]: h for h in plan["hosts"]}
    assert by_host["pg1"]["versions"] == {"2": 5, "3": 3}
    assert by_host["pg1"]["pending"] == {"3": 5, "4": 8}
    assert by_host["pg2"]["versions"] == {"2": 7, "3": 1}
    human = run_cli("plan", config=fleet)
    # versions mixed across the fleet: plan shows them, and exits 4 as status does (ops.health)
    assert (
        human.exit_code == 4 and "V2: 5, V3: 3" in human.stdout and "V4 on 8 shards" in human.stdout
    )
    assert "pg1: V0003__photo_location.sql pending on shards 3-7" in human.stderr
    from shardctl.ops.migrate import host_versions

    assert host_versions(topo.host("pg2")) == {2: 7, 3: 1}

    result = run_cli("migrate", "--hosts", "pg2", "--json", config=fleet)
    assert result.exit_code == 0
    assert migrated(json.loads(result.stdout)) == set(range(8, 16))
    assert ledger(topo, "pg1", 4) == set() and ledger(topo, "pg2", 4) == set(range(8, 16))
    assert run_cli("migrate", "--hosts", "nope", config=fleet).exit_code == 2

    result = run_cli("migrate", config=fleet)
    assert result.exit_code == 0
    assert run_cli("migrate", "--check", config=fleet).exit_code == 0


def test_no_transaction_migration_and_ledger_columns(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)
    topo = load(fleet)
    add_migration(
        fleet,
        "V0003__caption_index.sql",
        "-- shardctl:no-transaction\n"
        "CREATE INDEX CONCURRENTLY photos_caption_idx ON {{ schema|ident }}.photos (caption);\n",
    )
    result = run_cli("migrate", "--json", config=fleet)
    assert result.exit_code == 0, result
    assert migrated(json.loads(result.stdout)) == set(range(8))
    with connect(topo, "pg1") as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE indexname = 'photos_caption_idx'"
            ).fetchone()[0]
            == 4
        )
        row = conn.execute(
            "SELECT checksum, duration_ms, applied_at, applied_by FROM shardctl.migrations "
            "WHERE shard_id = 1 AND version = 3"
        ).fetchone()
    assert len(row[0]) == 64 and row[1] >= 0 and row[2] is not None and row[3] == "postgres"
    assert run_cli("migrate", "--check", config=fleet).exit_code == 0


def test_pending_is_one_query_per_host(make_fleet):
    """The pending part of --check reads the ledger in a single statement per host."""
    from shardctl.ops import migrate as mig

    fleet = make_fleet(hosts=2, shards=16, init=True)
    topo = load(fleet)
    statements: list[str] = []
    real = psycopg.Connection.execute

    def spy(self, query, *args, **kwargs):
        statements.append(str(query))
        return real(self, query, *args, **kwargs)

    psycopg.Connection.execute = spy
    try:
        report = mig.migrate(topo, check=True)
    finally:
        psycopg.Connection.execute = real
    assert report.ok
    ledger_reads = [s for s in statements if "max(m.version)" in s]
    assert len(ledger_reads) == 2  # one per host
