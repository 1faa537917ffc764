"""Every command's ``--json`` document starts with ``command`` and ``ok``: one test runs them all (a new
command fails it until it is added here)."""

from __future__ import annotations

import json

import click
import psycopg
from support.fleet import run_cli

from shardctl.cli import load_commands


def every_command_name() -> set[str]:
    names = set()
    for name, command in load_commands().items():
        if isinstance(command, click.Group):
            names |= {f"{name} {sub}" for sub in command.commands}
        else:
            names.add(name)
    return names


def document(*args, config=None, code: int = 0) -> dict:
    result = run_cli(*args, "--json", config=config)
    assert result.exit_code == code, (args, result)
    return json.loads(result.stdout)


def test_every_json_document_starts_with_command_and_ok(make_fleet, server_dir, tmp_path):
    path = make_fleet(hosts=2, shards=8, init=True, extra="routing:\n  key: user_id\n")
    app = make_fleet.new_database(1)  # a small app database for `adopt`
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE users (id bigint PRIMARY KEY, name text);"
            "CREATE TABLE photos (id bigint, PRIMARY KEY (user_id, id),"
            " user_id bigint NOT NULL REFERENCES users (id), caption text)"
        )
    source = tmp_path / "history"
    source.mkdir()
    (source / "1_create_notes.up.sql").write_text("CREATE TABLE notes (id bigint PRIMARY KEY);\n")
    (source / "1_create_notes.down.sql").write_text("DROP TABLE notes;\n")
    new_id = json.loads(
        run_cli("encode-id", "--shard", "3", "--ms", "5", "--json", config=path).stdout
    )
    box = server_dir / "json-box"
    runs: list[tuple[str, tuple, int]] = [  # (command name, arguments, exit code)
        ("info", ("info",), 0),
        ("locate", ("locate", "42"), 0),
        ("render", ("render", "--shard", "0"), 0),
        ("encode-id", ("encode-id", "--shard", "3", "--ms", "5"), 0),
        ("decode-id", ("decode-id", str(new_id["id"])), 0),
        ("decode-id", ("decode-id", "not-an-id"), 2),
        ("init", ("init",), 0),
        ("migrate", ("migrate",), 0),
        ("plan", ("plan",), 0),
        ("status", ("status",), 0),
        ("verify", ("verify",), 0),
        ("redeploy", ("redeploy",), 0),
        ("lint", ("lint",), 0),
        (
            "migrations import",
            (
                "migrations",
                "import",
                source,
                "--from",
                "golang-migrate",
                "--to",
                tmp_path / "imported",
            ),
            0,
        ),
        ("add-host", ("add-host", "pg3", "--dsn", make_fleet.new_database(2)), 0),
        ("add-shard", ("add-shard", "--host", "pg3", "--count", "1"), 0),
        ("rebalance", ("rebalance",), 0),
        ("move-shard", ("move-shard", "8", "--to", "pg1"), 0),
        ("move-shard", ("move-shard", "--status"), 0),
        ("migrate", ("migrate", "--hosts", "nope"), 2),
        ("adopt plan", ("adopt", "plan", "--from", app, "--out", tmp_path / "plan.yaml"), 0),
        (
            "adopt baseline",
            (
                "adopt",
                "baseline",
                "--from",
                app,
                "--plan",
                tmp_path / "plan.yaml",
                "--to",
                tmp_path / "baseline",
                "--dry-run",
            ),
            0,
        ),
        (  # the fleet holds the example app's rows, not this app's: a difference, exit 1
            "adopt verify",
            (
                "adopt",
                "verify",
                "--from",
                app,
                "--plan",
                tmp_path / "plan.yaml",
                "--dark-reads",
                "0",
            ),
            1,
        ),
        # the fleet holds the example app's migrations, not this app's baseline: refused, exit 2
        (
            "adopt copy",
            ("adopt", "copy", "--from", app, "--plan", tmp_path / "plan.yaml"),
            2,
        ),
        ("adopt status", ("adopt", "status", "--from", app), 0),  # no copy yet: said, not an error
        ("adopt cutover", ("adopt", "cutover"), 2),  # the topology names no adoption
    ]
    seen = set()
    for name, args, code in runs:
        doc = document(*args, config=path, code=code)
        assert list(doc)[:2] == ["command", "ok"], (args, list(doc)[:4])
        # a mode may say itself: "move-shard --status"
        assert doc["command"].split(" --")[0] == name, (args, doc["command"])
        assert doc["ok"] is (code == 0), (args, doc)
        seen.add(name)
    try:
        for name, args in [
            ("sandbox up", ("sandbox", "up", "--dir", box, "--hosts", "1", "--shards", "2")),
            ("demo", ("demo", "--dir", box, "--hosts", "1", "--shards", "2")),
            ("sandbox status", ("sandbox", "status", "--dir", box)),
            ("sandbox down", ("sandbox", "down", "--dir", box, "--destroy")),
        ]:
            doc = document(*args)
            assert list(doc)[:2] == ["command", "ok"] and doc["command"] == name, (args, doc)
            seen.add(name)
    finally:
        run_cli("sandbox", "down", "--dir", box, "--destroy")
    missing = document("status", config=tmp_path / "nowhere.yaml", code=2)
    assert list(missing)[:2] == ["command", "ok"] and missing["command"] == "status"
    assert missing["ok"] is False
    assert seen == every_command_name()
