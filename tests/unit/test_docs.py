"""The README documents the CLI as it is (like sqlite-utils' test_docs.py).

* every command has a row in the README's command table, and the table has no row for a command
  that does not exist; every sub-command is named in the README;
* every command and every option has help text (``shardctl CMD --help``);
* every option group (an option several commands share, and the global options) is named in the
  README.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import click
import pytest

from shardctl.cli import cli, load_commands

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def walk(command: click.Command, path: tuple[str, ...]):
    yield " ".join(path), command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


COMMANDS = dict(item for name, command in load_commands().items() for item in walk(command, (name,)))
TOP = sorted(load_commands())


def option_name(option: click.Option) -> str:
    return max(option.opts, key=len)


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and option_name(p) != "--help"]


def shared_options() -> dict[str, list[str]]:
    """Options that two or more commands take (the option groups), with the commands taking them."""
    users = defaultdict(list)
    for path, command in COMMANDS.items():
        for option in options(command):
            users[option_name(option)].append(path)
    return {name: paths for name, paths in users.items() if len(paths) > 1}


def table_commands() -> list[str]:
    """The first word of each row of the table under "## Commands"."""
    section = README.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([a-z-]+)", section, re.MULTILINE)]


def test_command_table_lists_every_command_once():
    rows = table_commands()
    assert sorted(set(rows)) == TOP, f"README command table: missing {sorted(set(TOP) - set(rows))}, " \
                                     f"unknown {sorted(set(rows) - set(TOP))}"
    assert len(rows) == len(set(rows)), "a command has two rows"


@pytest.mark.parametrize("path", [p for p in COMMANDS if " " in p])
def test_sub_command_is_named_in_readme(path):
    assert f"`{path}" in README or f"shardctl {path}" in README, path


@pytest.mark.parametrize("path", list(COMMANDS))
def test_command_has_help(path):
    command = COMMANDS[path]
    assert (command.help or "").strip(), f"shardctl {path} has no help text"
    assert command.get_short_help_str().strip()


@pytest.mark.parametrize("path", list(COMMANDS))
def test_every_option_has_help(path):
    missing = [option_name(o) for o in options(COMMANDS[path]) if not (o.help or "").strip()]
    assert not missing, f"shardctl {path}: options without help text: {missing}"


def test_global_options_have_help_and_are_documented():
    for option in options(cli):
        assert (option.help or "").strip(), option_name(option)
        assert f"`{option_name(option)}" in README, f"global option {option_name(option)} is not in README.md"


@pytest.mark.parametrize("name", sorted(shared_options()))
def test_option_group_is_documented(name):
    assert re.search(rf"`{re.escape(name)}\b", README), \
        f"{name} (taken by {', '.join(shared_options()[name])}) is not named in README.md"


def test_the_checks_see_the_cli():
    """The lists the tests above go through are the real ones (so those tests can fail)."""
    assert {"decode-id", "move-shard", "rebalance", "sandbox", "sandbox up"} <= set(COMMANDS)
    assert {"--json", "--connect-timeout", "--batch-size"} <= set(shared_options())
    assert "init" in table_commands()
