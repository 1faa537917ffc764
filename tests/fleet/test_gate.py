"""``migrate --check --base DIR``, the pull-request gate, on real servers (issue 13, item 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.fleet import run_cli

ADD_LOCATION = "ALTER TABLE {{ schema|ident }}.photos ADD COLUMN location text;\n"


@pytest.fixture
def gated(make_fleet):
    """An initialised 2-host, 8-shard fleet at V2, and the base branch's copy of its migrations."""
    fleet = make_fleet(hosts=2, shards=8, init=True)
    base = fleet.parent / "base"
    shutil.copytree(fleet.parent / "migrations", base)
    return fleet, fleet.parent / "migrations", base


def gate(fleet: Path, base: Path, *extra: str):
    return run_cli("migrate", "--check", "--base", str(base), *extra, config=fleet)


def test_passes_with_nothing_new_and_with_a_new_migration(gated):
    fleet, migrations, base = gated
    result = gate(fleet, base)
    assert result.exit_code == 0 and "Gate passed" in result.stdout, result
    (migrations / "V0003__photo_location.sql").write_text(ADD_LOCATION)
    result = gate(fleet, base, "--json")
    assert result.exit_code == 0, result
    doc = json.loads(result.stdout)
    assert (
        doc["ok"]
        and doc["new"] == ["V0003__photo_location.sql"]
        and doc["base_head"] == 2
        and doc["head"] == 3
    )
    assert doc["shards_rendered"] == 8 and doc["fleet"] == {"pg1": {"2": 4}, "pg2": {"2": 4}}
    # A plain --check still lists V3 as pending: that is the question it answers.
    assert run_cli("migrate", "--check", config=fleet).exit_code == 1


def test_fails_on_removed_renamed_or_edited_base_migrations(gated):
    fleet, migrations, base = gated
    likes = migrations / "V0002__create_likes.sql"
    original = likes.read_text()
    likes.rename(migrations / "V0002__likes.sql")
    result = gate(fleet, base)
    assert (
        result.exit_code == 1
        and "V0002__create_likes.sql was renamed to V0002__likes.sql" in result.stderr
    ), result
    (migrations / "V0002__likes.sql").unlink()
    result = gate(fleet, base)
    assert result.exit_code == 1 and "V0002__create_likes.sql was removed" in result.stderr, result
    likes.write_text(original + "\n-- a comment\n")
    result = gate(fleet, base)
    assert (
        result.exit_code == 1
        and "V0002__create_likes.sql changed after it was applied" in result.stderr
    ), result


def test_fails_when_the_fleet_is_behind_or_ahead_of_the_base(gated):
    fleet, migrations, base = gated
    (migrations / "V0003__photo_location.sql").write_text(ADD_LOCATION)
    shutil.copy(
        migrations / "V0003__photo_location.sql", base
    )  # main has V3; the fleet does not yet
    result = gate(fleet, base)
    assert result.exit_code == 1, result
    assert "pg1: the fleet is behind the base branch (V3 on 4 shards pending)" in result.stdout
    assert (
        "run migrate on the base branch first" in result.stdout
        and "gate: pg1: the fleet is behind" in result.stderr
    )
    assert run_cli("migrate", config=fleet).exit_code == 0
    (base / "V0003__photo_location.sql").unlink()  # a base branch that predates V3
    result = gate(fleet, base)
    assert result.exit_code == 1, result
    assert "pg1: 4 shards at V3, which the base branch (head V2) does not have" in result.stdout


def test_new_migration_must_render_and_parse_for_every_shard(gated):
    fleet, migrations, base = gated
    (migrations / "V0003__odd.sql").write_text(
        "{% if shard_id == 5 %}{{ nope }}{% endif %}SELECT 1;\n"
    )
    result = gate(fleet, base)
    assert result.exit_code == 1, result
    assert (
        "shard 5: migration V0003__odd.sql:1 does not render: 'nope' is undefined" in result.stderr
    )
    (migrations / "V0003__odd.sql").write_text(
        "{% if shard_id == 3 %}CREATE INDEX CONCURRENTLY i ON {{ schema|ident }}.photos (caption);"
        "{% else %}SELECT 1;{% endif %}\n"
    )
    result = gate(fleet, base)
    assert result.exit_code == 1, result
    assert (
        "V0003__odd.sql (rendered for shard 3) holds CREATE INDEX CONCURRENTLY, which cannot run inside a "
        "transaction" in result.stderr
    )
    (migrations / "V0003__odd.sql").write_text(
        "ALTER TABLE {{ schema|ident }}.photos ADD COLUM x text;\n"
    )
    result = gate(fleet, base)
    assert (
        result.exit_code == 1 and "line 1 does not parse: syntax error at or near" in result.stderr
    ), result


def test_badly_named_file_and_bad_arguments(gated):
    fleet, migrations, base = gated
    (migrations / "V0003__x.SQL").write_text(ADD_LOCATION)
    result = gate(fleet, base)
    assert result.exit_code == 2 and "V0003__x.SQL is not named" in result.stderr, result
    (migrations / "V0003__x.SQL").unlink()
    result = run_cli("migrate", "--base", str(base), config=fleet)
    assert result.exit_code == 2 and "migrate --check --base DIR" in result.stderr, result
    result = gate(fleet, fleet.parent / "nowhere")
    assert result.exit_code == 2 and "not a directory" in result.stderr, result


def test_unreachable_host_exits_3(gated):
    fleet, _, base = gated
    text = fleet.read_text()
    port = text.split("127.0.0.1:")[2].split("/")[0]
    fleet.write_text(text.replace(f"127.0.0.1:{port}", "127.0.0.1:1", 1))
    result = gate(fleet, base, "--connect-timeout", "2")
    assert result.exit_code == 3, result
