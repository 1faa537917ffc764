"""The CLI's shared options, read from the Click commands themselves (no server needed).

Every command that connects to a host takes ``--connect-timeout`` from one decorator
(``shardctl.cli.options.connect_timeout_option``), so each has the same type, default and help; a new
command must be listed here as offline or take the option.
"""

from __future__ import annotations

import click

from shardctl.cli import cli
from shardctl.engine.defaults import DEFAULT_CONNECT_TIMEOUT

# Commands that never open a connection to a fleet host.
OFFLINE = {
    "decode-id",
    "encode-id",
    "locate",
    "info",
    "render",
    "lint",
    "demo",
    "migrations import",
    "sandbox up",
    "sandbox down",
    "sandbox status",
}


def commands(group: click.Group = cli, prefix: str = "") -> dict[str, click.Command]:
    ctx = click.Context(group)
    out = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        full = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            out.update(commands(command, full))
        else:
            out[full] = command
    return out


def connect_timeout(command: click.Command) -> click.Option | None:
    found = [p for p in command.params if "--connect-timeout" in getattr(p, "opts", ())]
    assert len(found) <= 1
    return found[0] if found else None


def test_the_offline_list_names_real_commands():
    assert OFFLINE <= set(commands()), OFFLINE - set(commands())


def test_every_connecting_command_has_one_connect_timeout():
    connecting = {name: c for name, c in commands().items() if name not in OFFLINE}
    assert {"init", "migrate", "verify", "add-host", "move-shard", "redeploy"} <= set(connecting)
    shapes = {}
    for name, command in connecting.items():
        option = connect_timeout(command)
        assert option is not None, f"{name} connects to hosts but has no --connect-timeout"
        shapes[name] = (
            option.default,
            option.show_default,
            option.help,
            option.type.__class__,
            (option.type.lo, option.type.hi),
        )
    assert {s[0] for s in shapes.values()} == {DEFAULT_CONNECT_TIMEOUT}, shapes
    assert len(set(shapes.values())) == 1, shapes


def test_offline_commands_take_no_connect_timeout():
    for name in OFFLINE:
        assert connect_timeout(commands()[name]) is None, name


def test_every_wait_option_is_the_shared_one():
    """``--wait`` (another run's locks) comes from one decorator too: one type, default and help."""
    shapes = {}
    for name, command in commands().items():
        found = [p for p in command.params if "--wait" in getattr(p, "opts", ())]
        if found:
            (option,) = found
            shapes[name] = (option.default, option.help, option.type.lo, option.type.hi)
    assert {"init", "migrate", "add-shard", "move-shard", "rebalance", "redeploy"} <= set(shapes)
    assert len(set(shapes.values())) == 1, shapes
    assert next(iter(shapes.values()))[0] == 0
