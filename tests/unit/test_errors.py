"""The one exception hierarchy: every error shardctl raises on purpose carries its exit code, and the
CLI reads --json and --debug from Click's parse, not from the raw arguments."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardctl import errors
from shardctl.cli import cli
from shardctl.engine import executor
from shardctl.model import yaml_guard
from shardctl.ops.move import cutover
from shardctl.sql import migrations


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (errors.FreezeTimeout, errors.EXIT_FAILED),
        (errors.WaitTimeout, errors.EXIT_FAILED),
        (errors.ConnectionLost, errors.EXIT_UNREACHABLE),
        (errors.LimitExceeded, errors.EXIT_BAD_INPUT),
        (errors.SqlSyntaxError, errors.EXIT_BAD_INPUT),
        (errors.MissingExtra, errors.EXIT_BAD_INPUT),
    ],
)
def test_every_error_is_a_shardctl_error_with_its_exit_code(cls: type, code: int) -> None:
    assert issubclass(cls, errors.ShardctlError)
    assert cls.exit_code == code


def test_the_modules_raise_the_hierarchys_classes() -> None:
    assert cutover.FreezeTimeout is errors.FreezeTimeout
    assert executor.ConnectionLost is errors.ConnectionLost
    assert yaml_guard.LimitExceeded is errors.LimitExceeded
    with pytest.raises(errors.SqlSyntaxError) as info:
        migrations.parse("SELECT 1;\nSELEC 2;")
    assert info.value.line == 2 and info.value.exit_code == errors.EXIT_BAD_INPUT


def test_next_step_is_shown_without_rewriting_the_message() -> None:
    exc = errors.HostUnreachable("pg2", "connection refused")
    exc.next_step = "move mv1 is in phase synced: run the command again to resume"
    assert exc.args == ("host pg2 is unreachable: connection refused",)
    assert str(exc) == (
        "host pg2 is unreachable: connection refused "
        "[move mv1 is in phase synced: run the command again to resume]"
    )


def test_json_is_the_parsed_flag_not_a_word_in_the_arguments(tmp_path) -> None:
    """A topology file named ``--json`` is a value of --config, not the flag: the error is one line."""
    run = CliRunner().invoke(cli, ["--config", "--json", "status"], catch_exceptions=False)
    assert run.exit_code == errors.EXIT_BAD_INPUT
    assert run.stdout == ""
    assert "topology file not found: --json" in run.stderr
    given = CliRunner().invoke(
        cli, ["--config", str(tmp_path / "none.yaml"), "status", "--json"], catch_exceptions=False
    )
    assert given.exit_code == errors.EXIT_BAD_INPUT
    assert json.loads(given.stdout)["exit_code"] == errors.EXIT_BAD_INPUT
