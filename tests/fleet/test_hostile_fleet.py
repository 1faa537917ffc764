"""Issue 15 on a real fleet: hostile arguments to commands that touch hosts are refused before
anything is built or connected: exit 2, one short stderr line, at most 2 s and 200 MB, and
nothing changed on any host (nor in the topology file).
"""

from __future__ import annotations

import pytest
from support.fleet import connect, load, run_cli
from support.hostile import assert_refused_cheaply, run_measured


def snapshot(path) -> dict:
    """Everything a command could have changed: the topology file, and per host its schemas,
    functions, sequences and shardctl's own tables."""
    topo = load(path)
    state: dict = {"topology": path.read_text()}
    for host in topo.hosts:
        with connect(topo, host.name, autocommit=True) as conn:
            state[host.name] = {
                "schemas": conn.execute(
                    "SELECT array_agg(nspname ORDER BY nspname) FROM pg_namespace"
                ).fetchone(),
                "relations": conn.execute("SELECT count(*) FROM pg_class").fetchone(),
                "functions": conn.execute(
                    "SELECT count(*), string_agg(md5(prosrc), ',' ORDER BY oid) FROM pg_proc "
                    "WHERE proname = 'next_id'"
                ).fetchone(),
                "sequences": conn.execute(
                    "SELECT array_agg(last_value ORDER BY schemaname) FROM pg_sequences "
                    "WHERE sequencename = 'next_id_seq'"
                ).fetchone(),
                "shards": conn.execute(
                    "SELECT array_agg(shard_id ORDER BY shard_id) FROM shardctl.shards"
                ).fetchone(),
                "migrations": conn.execute("SELECT count(*) FROM shardctl.migrations").fetchone(),
                "events": conn.execute("SELECT count(*) FROM shardctl.events").fetchone(),
            }
    return state


@pytest.fixture
def ready(make_fleet):
    """2 hosts, 16 shards (pg1: 0-7, pg2: 8-15), initialised. Custom layout: no 64-bit warning line."""
    path = make_fleet(hosts=2, shards=16)
    path.write_text(
        path.read_text().replace(
            "  layout: instagram\n",
            "  layout: custom\n  bits: {time: 41, shard: 12, sequence: 10}\n",
        )
    )
    result = run_cli("init", config=path)
    assert result.exit_code == 0, result
    return path


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["add-shard", "--host", "pg2", "--count", "100000000"],
            (
                "--count 100000000 goes beyond the custom layout's 12 shard bits "
                "(at most 4096 shards; the fleet has 16, so at most 4080 more)"
            ),
        ),
        pytest.param(
            ["add-shard", "--host", "pg2", "--ids", "16-99999999999999999999"],
            "--ids: shard 99999999999999999999 is out of range (0..4095): beyond the custom layout's 12 shard bits",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["add-shard", "--host", "pg2", "--ids", "16-999999999999999999999999999"],
            "--ids: shard number too large",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["add-shard", "--host", "pg2", "--count", "٣"],
            "--count: '٣' uses non-ASCII digits",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["add-shard", "--host", "pg2", "--ids", "١٦-١٧"],
            "digits must be ASCII 0-9",
            marks=pytest.mark.slow,
        ),
        (["migrate", "--shards", "０-３"], "digits must be ASCII 0-9"),
        pytest.param(
            ["move-shard", "٠-١", "--to", "pg2"], "digits must be ASCII 0-9", marks=pytest.mark.slow
        ),
        (["move-shard", "0-99999999999999999999", "--to", "pg2"], "is out of range (0..15)"),
    ],
)
def test_hostile_arguments_change_nothing(ready, args, needle):
    before = snapshot(ready)
    assert_refused_cheaply(run_measured("--config", ready, *args), needle)
    assert snapshot(ready) == before


def test_the_same_database_twice_is_refused_before_init(make_fleet):
    """Two hosts on one server and database, through a YAML merge key: refused at validation
    (init used to fail with "another shardctl run holds the lock", the other run being itself)."""
    path = make_fleet(hosts=1, shards=8)
    text = path.read_text().replace(
        "  layout: instagram\n", "  layout: custom\n  bits: {time: 41, shard: 12, sequence: 10}\n"
    )
    text = text.replace("  - name: pg1\n", "  - &pg1\n    name: pg1\n").replace(
        'shards: "0-7"', 'shards: "0-3"'
    )
    text += '  - <<: *pg1\n    name: pg2\n    shards: "4-7"\n'
    path.write_text(text)
    topo_dsn = next(line for line in text.splitlines() if "dsn:" in line).split('"')[1]
    import psycopg

    def schemas() -> list:
        with psycopg.connect(topo_dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT array_agg(nspname ORDER BY nspname) FROM pg_namespace"
            ).fetchone()[0]

    before = schemas()
    assert_refused_cheaply(
        run_measured("--config", path, "init"),
        "hosts pg1 and pg2 point at the same server and database",
    )
    assert schemas() == before and "shardctl" not in before
