"""shardctl.django (issue #25): the example Django app (examples/django_app) on a sandbox fleet,
directly and through PgBouncer in transaction mode.

Django's settings are per process: each scenario runs in a subprocess (tests/support/django_scenarios.py)
and prints what it did; this test then checks every row directly in its shard over admin connections.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from support.fleet import load, run_cli, stale_copy
from support.history import TAG_PREFIX, Failure, History, Read, Write
from support.orm import add_filter_migration, schemas_with_column

from shardctl.ids.routing import shard_for_key

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "django_app"
SCENARIOS = ROOT / "tests" / "support" / "django_scenarios.py"


def django_env(path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        SHARDCTL_CONFIG=str(path),
        DJANGO_SETTINGS_MODULE="gramsite.settings",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(APP)]),
    )
    return env


def manage(path: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, str(APP / "manage.py"), *args],
        env=django_env(path),
        cwd=APP,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def scenario(path: Path, name: str, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(SCENARIOS), name],
        env={**django_env(path), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gram_migrations(make_module_fleet) -> Path:
    """The fleet's migrations plus the example app's Django migrations turned into a shardctl file by
    ``shardctl_makemigrations`` (run once for the file, on a fleet of its own)."""
    path = make_module_fleet(hosts=2, shards=16, pooler="none", init=True)
    out = manage(path, "shardctl_makemigrations", "gram").stdout
    assert "V0003__gram_0001_initial.sql" in out, out
    return path.parent / "migrations"


@pytest.fixture(params=["direct", "transaction"])
def django_fleet(request, make_fleet, gram_migrations):
    """A 2-host, 16-shard fleet (direct, or behind PgBouncer in transaction mode) with the example app's
    Django migrations (``gram_migrations``) applied to every shard: a clone of the template ``init``
    built with them."""
    mode = request.param
    path = make_fleet(
        hosts=2,
        shards=16,
        pooler="none" if mode == "direct" else None,
        migrations=gram_migrations,
        init=True,
    )
    if mode != "direct":
        request.getfixturevalue("pgbouncer").front(path, mode)
    check = run_cli("migrate", "--check", config=path)  # nothing pending: V0003 is on every shard
    assert check.exit_code == 0, check
    return path


def rows(path: Path, table: str) -> dict[int, list[tuple[str, str, tuple]]]:
    """id -> [(host, schema, row)] for every row of ``table`` in every shard schema of every host."""
    topo = load(path)
    out: dict[int, list] = {}
    for host in topo.hosts:
        with psycopg.connect(**host.connect_kwargs(purpose="admin")) as conn:
            for shard in range(topo.shard_count):
                schema = topo.schema_name(shard)
                if (
                    conn.execute("SELECT to_regclass(%s)", (f'"{schema}".{table}',)).fetchone()[0]
                    is None
                ):
                    continue
                for row in conn.execute(f'SELECT * FROM "{schema}".{table}').fetchall():
                    out.setdefault(row[0], []).append((host.name, schema, row))
    return out


@pytest.mark.parametrize(
    "django_fleet", ["direct", pytest.param("transaction", marks=pytest.mark.slow)], indirect=True
)
def test_makemigrations_writes_unqualified_shardctl_files(django_fleet):
    text = (django_fleet.parent / "migrations" / "V0003__gram_0001_initial.sql").read_text()
    assert 'CREATE TABLE "gram_photos"' in text and "DEFAULT next_id()" in text, text
    assert "BEGIN;" not in text and "COMMIT;" not in text and "insta" not in text, text
    again = manage(
        django_fleet, "shardctl_makemigrations", "gram"
    ).stdout  # nothing new: nothing written
    assert "wrote" not in again, again


def test_example_app_rows_live_in_their_shards(django_fleet):
    topo = load(django_fleet)
    done = scenario(django_fleet, "crud")
    layout = topo.layout
    photos = rows(django_fleet, "gram_photos")
    deleted = done["orm"]["deleted"]
    user_shard = {uid: layout.decode(uid)["shard"] for uid, _ in done["users"]}
    for pid, key, caption in done["photos"]:
        shard = user_shard[key]  # a photo lives on its owner's shard: the one inside the user's ID
        if pid == deleted:
            assert pid not in photos
            continue
        assert layout.decode(pid)["shard"] == shard  # the ID was minted on its owner's shard
        [(host, schema, _row)] = photos[pid]  # exactly one copy, in that shard, on its host
        assert (host, schema) == (topo.host_of(shard).name, topo.schema_name(shard)), (
            pid,
            host,
            schema,
        )
        got = done["got"][str(pid)]  # GET /photos/<id>: found from the ID alone
        assert got["user_id"] == key and (
            got["caption"] == caption or pid == done["photos"][0][0]
        ), got
    users = rows(django_fleet, "gram_users")
    for uid, username in done["users"]:
        [(host, schema, _row)] = users[uid]
        assert (
            schema
            == topo.schema_name(shard_for_key(username, topo.modulus))
            == topo.schema_name(layout.decode(uid)["shard"])
        )
    likes = rows(django_fleet, "gram_likes")
    for like_id, photo_id, _ in done["likes"]:
        [(host, schema, _row)] = likes[like_id]
        assert schema == topo.schema_name(layout.decode(photo_id)["shard"])  # on its photo's shard
    orm = done["orm"]
    assert orm["caption"] == "updated by id" and orm["gone"] and orm["other_block_rows"] == 0, orm
    first = done["photos"][0][0]
    assert len(photos[first]) == 1 and photos[first][0][2][2] == "updated by id"


@pytest.mark.parametrize(
    "django_fleet", ["direct", pytest.param("transaction", marks=pytest.mark.slow)], indirect=True
)
def test_nested_blocks_and_requests_never_leak_a_shard_under_16_threads(django_fleet):
    done = scenario(django_fleet, "leaks")
    assert done["error_count"] == 0, done
    assert done["requests"] == 16 * 40 and done["blocks"] == 2 * 16 * 40, done


def test_transaction_atomic_across_two_shards_of_a_host(django_fleet):
    """In transaction.atomic, each block's statements run on its shard (the setting sent again when the
    block switches shards on the same host), a rollback leaves nothing, the session keeps no shard."""
    topo = load(django_fleet)
    done = scenario(django_fleet, "atomic")
    assert done["seen"] == done["schemas"], done
    assert not done["rolled_found"] and "insta" not in done["session"], done
    photos = rows(django_fleet, "gram_photos")
    for pid, key in zip(done["ids"], (done["a"], done["b"], done["b"])):
        [(_host, schema, row)] = photos[pid]
        assert schema == topo.schema_name(topo.layout.shard_of(key)) and row[1] == key, (
            pid,
            schema,
        )
    assert done["rolled"] not in photos


@pytest.mark.parametrize(
    "django_fleet", ["direct", pytest.param("transaction", marks=pytest.mark.slow)], indirect=True
)
def test_app_servers_write_and_read_through_a_move_one_with_a_stale_topology(
    django_fleet, tmp_path
):
    """Two app servers (processes) of the example while shards 4-7 move pg1 -> pg2: one reads the
    topology file the move rewrites, the other a copy never updated (it meets the move only through
    the old host's redirect). Writers (4 live, 2 stale) post photos through the view's transaction
    on the owner's shard, readers (2 live, 1 stale) read a user's photos through the ORM. The history checker judges
    both together: nothing lost, duplicated or in a wrong shard, no read answered by a wrong shard
    or missing an acknowledged row, no error any request saw (a transaction that met the move ran
    again, a documented retry). Afterwards both find every acknowledged photo by its ID alone."""
    path = django_fleet
    stale_path = stale_copy(path)
    stop = tmp_path / "live-ids.json"
    tag = f"{TAG_PREFIX}{time.time_ns() % 10**12:x}"
    stale_env = dict(django_env(stale_path), SHARDCTL_STOP=str(stop), SHARDCTL_TAG=tag)
    stale = subprocess.Popen(
        [sys.executable, str(SCENARIOS), "stale"],
        env=stale_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    live: dict = {}
    try:
        live = scenario(path, "move", SHARDCTL_TAG=tag)
    finally:  # the stale app server stops, then gets the live one's photos and its own by ID
        stop.write_text(json.dumps([w["id"] for w in live.get("records", {}).get("writes", [])]))
        out, err = stale.communicate(timeout=300)
    assert stale.returncode == 0, (out + err)[-4000:]
    other = json.loads(out.strip().splitlines()[-1])
    assert live["phase"] == "cut_over" and live["verified"], live
    history = History(path, table="gram_photos", tag=tag, key_is_id=True)
    for records in (live["records"], other["records"]):
        history.writes += [Write(**w) for w in records["writes"]]
        history.reads += [Read(**dict(r, ids=frozenset(r["ids"]))) for r in records["reads"]]
        history.failures += [Failure(**f) for f in records["failures"]]
        history.retries += [Failure(**f) for f in records["retries"]]
    checked = history.check()
    print(checked, other["redirects"])
    assert checked.ok, checked
    assert checked.counts["writes"] > 50 and checked.counts["reads"] > 20, checked
    assert other["redirects"] == {str(n): "pg2" for n in (4, 5, 6, 7)}, other["redirects"]
    assert any(r.client.startswith("stale") for r in history.retries), history.retries
    assert other["missing"] == [], other["missing"][:5]
    ids = tmp_path / "all-ids.json"
    ids.write_text(json.dumps([w.id for w in history.writes]))
    assert scenario(path, "lookup", SHARDCTL_IDS=str(ids))["missing"] == []


@pytest.mark.parametrize(
    "django_fleet", [pytest.param("direct", marks=pytest.mark.slow), "transaction"], indirect=True
)
def test_orm_writes_and_reads_during_migrate(django_fleet):
    """6 ORM writers and 2 readers on every shard while ``shardctl migrate`` applies a migration that adds
    a column with a default, backfills it and indexes it: no application-visible error, and the history
    checker finds nothing lost, duplicated, misplaced or read from a wrong shard; every shard migrated."""
    add_filter_migration(django_fleet, "0004", "gram_photos", "w")
    done = scenario(django_fleet, "migrate")
    print(done)
    assert done["exit_code"] == 0, done["output"]
    assert done["ok"], done["report"]
    assert done["counts"]["writes"] > 50 and done["counts"]["reads"] > 20, done
    topo = load(django_fleet)
    assert len(schemas_with_column(topo, "gram_photos", "filter")) == 16


def test_async_orm_calls_and_asgi_views_stay_on_their_shards(django_fleet):
    """Django's async ORM API from 32 concurrent tasks (each in its own ``on_shard`` block across awaits)
    and the example's views through the ASGI handler: every task saw its own shard, and every row is in
    its key's shard, got by its ID alone."""
    done = scenario(django_fleet, "async_orm")
    expected = done["expected"]
    for t in done["tasks"]:
        assert t["schema"] == expected[str(t["key"])] and t["count"] == 1, t
    for a in done["asgi"]:
        assert a["got"]["user_id"] == a["key"] and a["got"]["caption"].startswith("asgi"), a
    photos = rows(django_fleet, "gram_photos")
    for item in done["tasks"] + done["asgi"]:
        [(_host, schema, row)] = photos[item["id"]]
        assert schema == expected[str(item["key"])] and row[1] == item["key"], (item, schema)
    assert sorted(row[2] for [(_h, _s, row)] in (photos[t["id"]] for t in done["tasks"])) == sorted(
        f"async {n} edited" for n in range(32)
    )


@pytest.fixture
def direct_django_fleet(make_fleet, gram_migrations) -> Path:
    """``django_fleet`` without a pooler: for cases whose behaviour does not depend on one."""
    return make_fleet(hosts=2, shards=16, pooler="none", migrations=gram_migrations, init=True)


def test_transactions_savepoints_and_lookups_write_and_read_the_named_shards(direct_django_fleet):
    """Issue 41: a savepoint rolled back after another shard's block (same host) leaves the server on
    the savepoint's shard; the next write must still go to the shard its block names. ``atomic()``
    without ``using=`` and ``atomic(using=<another host>)`` must cover the write or refuse it (one
    line): never leave it committed after the rollback. A string pk, ``__in`` on the key or the ID
    (inside another shard's block too) reach the shards they name; a key lookup that cannot be
    routed is refused instead of counting one shard's rows. Judged by the rows in the databases."""
    path = direct_django_fleet
    topo = load(path)
    done = scenario(path, "semantics")
    print(done)
    a, b, c, ids = done["a"], done["b"], done["c"], done["ids"]
    photos = rows(path, "gram_photos")

    def where(pid: int) -> tuple[str, int]:
        [(_host, schema, _row)] = photos[pid]
        return schema, topo.layout.shard_of(pid)

    sp = done["savepoint"]
    assert "refused" not in sp, sp
    assert where(sp["a_id"]) == (topo.schema_name(a), a), sp
    assert where(sp["b_id"]) == (topo.schema_name(b), b), sp  # not in a's schema with an ID of a
    assert sp["count_b"] == 1, sp
    for case, caption in (
        ("atomic_default", "atomic default"),
        ("atomic_other_host", "atomic other host"),
    ):
        seen = done[case]
        survived = [pid for pid, found in photos.items() if found[0][2][2] == caption]
        assert not survived, (case, seen, survived)  # covered (rolled back) or refused
        if "refused" in seen:
            assert "\n" not in seen["refused"] and "atomic" in seen["refused"], seen
    assert done["string_pk"] == {"got": ids[str(c)], "count": 1}, done["string_pk"]
    expected = sorted(ids.values())
    assert done["key_in"] == {"in_block": 3, "listed": expected}, done["key_in"]
    assert done["pk_in"] == {"outside": expected, "in_block": 2}, done["pk_in"]
    refused = done["unroutable"].get("refused", "")
    assert "user_id__gt" in refused and "\n" not in refused, done["unroutable"]
    fan = done["fan_out"]
    assert (fan["either"], fan["every"], fan["updated"]) == (2, 3, 3), fan
    assert all(r and "\n" not in r for r in fan["refused"]), fan
    assert fan["newest"] == expected[:-3:-1] and fan["first"] == expected[0], fan  # merged
    updated = sorted(pid for pid, found in photos.items() if found[0][2][2] == "in, updated")
    assert updated == expected, (updated, expected)
    # a view's ShardMoved, not retried by the view: 503, and the client's next try is routed right
    assert done["moved_answer"][:2] == [503, "0"] and "retry" in done["moved_answer"][2], done


def test_a_shard_moved_before_an_atomic_blocks_first_write_raises_shard_moved(
    direct_django_fleet,
):
    """Seen in CI during an adoption's cutover: a view's ``shardctl.django.atomic`` chose the old
    database, the file flipped before its first statement, and its create() met UncoveredWrite (a
    500) instead of ShardMoved, which ``retry_on_move`` reruns."""
    done = scenario(direct_django_fleet, "moved_before_the_first_write")
    assert done["raised"] and done["raised"].startswith("ShardMoved:"), done
    assert done["written"] == 0, done


def test_a_dsn_changed_under_an_atomic_block_fails_it_loudly(direct_django_fleet):
    """Seen under PgBouncer during an adoption: the host's DSN changed in the topology file while a
    view's atomic block was open; the connection was closed under it, Django skipped the commit
    without an error and the view answered 200 for a write that was rolled back. Now the block
    raises ShardMoved (retry_on_move reruns the request) and nothing of it is committed."""
    done = scenario(direct_django_fleet, "dsn_change")
    assert done["raised"] and "retry" in done["raised"], done
    assert done["kept"] is False, done
