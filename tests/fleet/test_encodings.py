"""Every command tells the truth on SQL_ASCII and LATIN1 databases (issue #24, item 2).

shardctl's connections (its own and the Router's) talk UTF-8 whatever the server's encoding: a
LATIN1 server converts, and a SQL_ASCII one passes the bytes through, so psycopg returns str
instead of bytes there. A move copies text in the databases' own encoding, byte for byte, even
SQL_ASCII bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from support.fleet import connect, load, run_cli

from shardctl.router import Router

ENCODINGS = ["SQL_ASCII", "LATIN1"]
# Non-ASCII in a comment and in a string literal; every character of it exists in LATIN1.
NOTE = "photos: café, £5 «ok»"
V3 = (
    "-- Légende: the captions' café, £5 and «ok» are not ASCII\n"
    "COMMENT ON TABLE {{ schema|ident }}.photos IS '" + NOTE + "';\n"
)
# Stored bytes of each caption, read without any conversion.
RAW = "SELECT id, convert_to(caption, current_setting('server_encoding')) FROM {schema}.photos ORDER BY id"


def ok(*args, config):
    result = run_cli(*args, config=config)
    assert result.exit_code == 0, (args, result)
    assert "b'" not in result.stdout, (args, result)  # no bytes printed as Python literals
    return result


def raw_captions(topo, host: str, shards: list[int]) -> dict[int, list[tuple[int, bytes]]]:
    with connect(topo, host) as conn:
        return {
            n: [(i, bytes(b)) for i, b in conn.execute(RAW.format(schema=f"insta{n}")).fetchall()]
            for n in shards
        }


@pytest.mark.parametrize("encoding", ["SQL_ASCII", pytest.param("LATIN1", marks=pytest.mark.slow)])
def test_every_command_on_the_encoding(make_fleet, encoding):
    path = make_fleet(hosts=2, shards=8, encoding=encoding)
    (path.parent / "migrations" / "V0003__photo_note.sql").write_text(V3, encoding="utf-8")
    topo = load(path)
    with connect(topo, "pg1") as conn:
        assert conn.execute("SHOW server_encoding").fetchone()[0] == encoding  # str, not bytes

    ok("init", config=path)
    check = ok("migrate", "--check", config=path)  # the checksums init recorded match the files
    assert "Nothing pending" in check.stdout and "changed after it was applied" not in check.stdout
    ok("verify", config=path)
    status = json.loads(ok("status", "--json", config=path).stdout)
    assert [
        (h["host"], h["present"], h["min_version"], h["max_version"], bool(h["drift"]))
        for h in status["hosts"]
    ] == [("pg1", 4, 3, 3, False), ("pg2", 4, 3, 3, False)], status

    # Non-ASCII text: 'café' sent as UTF-8, and E'\xe9', one raw byte (LATIN1's é; on SQL_ASCII a
    # byte that is not UTF-8, as a legacy LATIN1 application would have stored it).
    with connect(topo, "pg1", autocommit=True) as conn:
        for n in (0, 1):
            conn.execute(
                f"INSERT INTO insta{n}.photos (user_id, caption) VALUES (1, %s), (2, E'caf\\xe9'), "
                f"(3, 'plain')",
                ("café ±",),
            )
        assert (
            conn.execute("SELECT caption FROM insta0.photos WHERE user_id = 1").fetchone()[0]
            == "café ±"
        )
        assert (
            conn.execute("SELECT obj_description('insta0.photos'::regclass)").fetchone()[0] == NOTE
        )
    before = raw_captions(topo, "pg1", [0, 1])
    utf8 = "café ±".encode() if encoding == "SQL_ASCII" else "café ±".encode("latin-1")
    assert [b for _, b in before[0]] == [utf8, b"caf\xe9", b"plain"]

    if (
        encoding == "SQL_ASCII"
    ):  # bytes that are not UTF-8 are not text over a UTF-8 connection: an error, not a guess
        with (
            connect(topo, "pg1") as conn,
            pytest.raises(psycopg.errors.CharacterNotInRepertoire, match="0xe9"),
        ):
            conn.execute("SELECT caption FROM insta0.photos WHERE user_id = 2").fetchone()

    ok("move-shard", "0-1", "--to", "pg2", config=path)
    topo = load(path)
    assert topo.host_of(0).name == "pg2"
    assert raw_captions(topo, "pg2", [0, 1]) == before  # byte for byte
    with connect(topo, "pg2") as conn:
        assert (
            conn.execute("SELECT obj_description('insta0.photos'::regclass)").fetchone()[0] == NOTE
        )
    ok("verify", config=path)
    check = ok("migrate", "--check", config=path)
    assert "Nothing pending" in check.stdout
    ok("status", config=path)

    # The Router's connections talk UTF-8 too: text is str, never bytes.
    with Router(topo) as router:
        rows = router.execute(0, "SELECT caption FROM photos WHERE user_id = 1")
        assert [tuple(r) for r in rows] == [("café ±",)]

    # An abort after the cutover copies the rows back to the source, byte for byte too.
    ok("move-shard", "0-1", "--abort", config=path)
    topo = load(path)
    assert topo.host_of(0).name == "pg1"
    assert raw_captions(topo, "pg1", [0, 1]) == before
    ok("verify", config=path)


def test_move_between_encodings_is_refused_up_front(make_fleet, servers):
    path = make_fleet(hosts=2, shards=8, encoding="SQL_ASCII")
    server, db = make_fleet.created[1]
    with psycopg.connect(
        server.dsn("postgres"), autocommit=True
    ) as conn:  # pg2 becomes a UTF8 database
        conn.execute(f"DROP DATABASE {db}")
        conn.execute(
            f"CREATE DATABASE {db} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        )
    ok("init", config=path)
    topo = load(path)
    with connect(topo, "pg1", autocommit=True) as conn:
        conn.execute("INSERT INTO insta0.photos (user_id, caption) VALUES (1, E'caf\\xe9')")

    started = time.perf_counter()
    result = run_cli("move-shard", "0-1", "--to", "pg2", config=path)
    seconds = time.perf_counter() - started
    assert result.exit_code == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: preflight: "), result
    assert (
        "pg1's database is SQL_ASCII and host pg2's is UTF8" in lines[0]
        and "nothing was changed" in lines[0]
    )
    assert seconds <= 2.0, seconds
    assert load(path).host_of(0).name == "pg1"
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT count(*) FROM shardctl.moves").fetchone()[0] == 0
        assert {r[0] for r in conn.execute("SELECT state FROM shardctl.shards")} == {"active"}
    with connect(topo, "pg2") as conn:
        assert (
            conn.execute("SELECT count(*) FROM shardctl.shards WHERE shard_id < 2").fetchone()[0]
            == 0
        )


# Characters LATIN1 does not have (SQL_ASCII stores their UTF-8 bytes as they are).
WIDE = "-- price in €, a ☃\nCOMMENT ON TABLE {{ schema|ident }}.users IS 'users: 5 €';\n"


def timed(*args, config):
    started = time.perf_counter()
    result = run_cli(*args, config=config)
    return result, time.perf_counter() - started


def refused_in_one_line(result, seconds: float, file: str) -> None:
    assert result.exit_code == 2, result
    lines = [
        ln
        for ln in result.stderr.strip().splitlines()
        if not ln.startswith("warning: the instagram layout")
    ]
    assert len(lines) == 1 and lines[0].startswith(f"error: {file} cannot run on host pg"), result
    assert (
        "whose database is LATIN1" in lines[0] and 'no equivalent in encoding "LATIN1"' in lines[0]
    ), result
    assert "nothing was changed" in lines[0]
    assert seconds <= 2.0, seconds


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_migration_the_encoding_cannot_hold(make_fleet, encoding):
    """LATIN1: init and migrate refuse it up front, in one line, changing nothing. SQL_ASCII: it runs,
    and its checksum stays consistent."""
    path = make_fleet(hosts=2, shards=8, encoding=encoding)
    wide = path.parent / "migrations" / "V0003__price_note.sql"
    wide.write_text(WIDE, encoding="utf-8")
    topo = load(path)
    if encoding == "SQL_ASCII":
        ok("init", config=path)
        assert "Nothing pending" in ok("migrate", "--check", config=path).stdout
        with connect(topo, "pg2") as conn:
            assert (
                conn.execute("SELECT obj_description('insta7.users'::regclass)").fetchone()[0]
                == "users: 5 €"
            )
        return

    result, seconds = timed("init", config=path)
    refused_in_one_line(result, seconds, wide.name)
    with connect(topo, "pg1") as conn:
        assert conn.execute("SELECT to_regnamespace('shardctl') IS NULL").fetchone()[
            0
        ]  # init changed nothing

    wide.unlink()
    ok("init", config=path)
    wide.write_text(WIDE, encoding="utf-8")
    result, seconds = timed("migrate", config=path)
    refused_in_one_line(result, seconds, wide.name)
    for host in ("pg1", "pg2"):
        with connect(topo, host) as conn:
            assert conn.execute("SELECT max(version) FROM shardctl.migrations").fetchone()[0] == 2
    assert run_cli("migrate", "--check", config=path).exit_code == 1  # still pending, not failed
    # add-shard brings new shards to the fleet's version (V2): the file above it is not its business.
    ok("add-shard", "--host", "pg2", "--count", "2", config=path)
    with connect(load(path), "pg2") as conn:
        assert (
            conn.execute(
                "SELECT max(version) FROM shardctl.migrations WHERE shard_id >= 8"
            ).fetchone()[0]
            == 2
        )
