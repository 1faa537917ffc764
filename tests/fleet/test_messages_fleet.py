"""Messages said once, and said right (issue 15), on real servers: init says what it did, a host's
failure is printed once with its host named once, a move's freeze prints each step without a
terminal, and a move to where the shards already are says so."""

from __future__ import annotations

import re

from support.fleet import run_cli

WARNING = (
    "warning: the instagram layout uses all 64 bits: its IDs turn negative on 2060-11-03T19:53:47.776Z "
    "(and overflow on 2095-09-07T15:47:35.552Z)"
)
SECONDS = r"in \d+\.\d\ds\."


def last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


def test_init_says_what_it_did(make_fleet):
    fleet = make_fleet(hosts=2, shards=16)
    created = run_cli("init", config=fleet)
    assert created.exit_code == 0, created
    assert created.stderr == WARNING + "\n", created  # the layout's warning, once
    assert re.fullmatch(
        rf"Created 16 shards at V2 \(migrations V1, V2 applied to each\), {SECONDS}",
        last_line(created.stdout),
    ), created
    (fleet.parent / "migrations" / "V0003__add_location.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"
    )
    migrated = run_cli("init", config=fleet)
    assert migrated.exit_code == 0, migrated
    assert re.fullmatch(
        rf"Migrated 16 existing shards to V3 \(applied V3\), {SECONDS}", last_line(migrated.stdout)
    ), migrated
    # Other commands do not repeat the layout's warning.
    for args in (["status"], ["migrate"], ["plan"]):
        quiet = run_cli(*args, config=fleet)
        assert quiet.exit_code == 0 and quiet.stderr == "", (args, quiet)


def test_a_host_failure_is_printed_once_naming_the_host_once(make_fleet):
    fleet = make_fleet(hosts=2, shards=16)
    assert run_cli("init", "--hosts", "pg1", config=fleet).exit_code == 0
    result = run_cli("migrate", config=fleet)  # pg2 was never initialised
    assert result.exit_code == 1, result
    # Before: "error: migrate: host pg2: host pg2 has no …", and the same again under the table.
    assert (
        result.stderr
        == "error: migrate: host pg2 has no shardctl control schema; run `shardctl init`\n"
    ), result
    assert "control schema" not in result.stdout, result


def test_move_prints_each_freeze_step_and_already_there_says_so(make_fleet):
    fleet = make_fleet(hosts=2, shards=8, init=True)  # pg1 0-3, pg2 4-7
    already = run_cli("move-shard", "4-7", "--to", "pg2", config=fleet)
    assert already.exit_code == 0, already
    assert (
        already.stdout == "Shards 4-7 are already on pg2: nothing was done.\n"
        and already.stderr == ""
    ), already
    moved = run_cli(
        "move-shard", "0-3", "--to", "pg2", config=fleet
    )  # CliRunner: stderr is no terminal
    assert moved.exit_code == 0, moved
    lines = moved.stderr.splitlines()
    assert lines.count("freeze: locking") == 1 and lines.count("freeze: waiting for lag 0") == 1, (
        moved
    )
    assert lines.index("freeze: locking") < lines.index("freeze: waiting for lag 0"), moved
