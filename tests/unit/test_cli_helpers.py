"""The CLI's shared helpers: ``options.option_group`` and ``output.flagged``."""

from __future__ import annotations

import click

from shardctl.cli.options import option_group
from shardctl.cli.output import flagged, stdout


def test_option_group_lists_options_in_the_order_given():
    group = option_group(click.option("--first"), click.option("--second"), click.option("--third"))

    @click.command()
    @group
    def command(first, second, third) -> None:
        """A command."""

    assert [p.name for p in command.params] == ["first", "second", "third"]


def test_option_group_can_decorate_several_commands():
    group = option_group(click.option("--only", default=1))

    @click.command()
    @group
    def one(only) -> None:
        """One."""

    @click.command()
    @group
    def two(only) -> None:
        """Two."""

    assert one.params[0] is not two.params[0]
    assert [p.name for p in one.params] == [p.name for p in two.params] == ["only"]


def test_flagged_prints_label_and_text():
    with stdout.capture() as captured:
        flagged("pg1", "V3 is applied on shards 0-3 but its file is gone", "yellow")
        flagged("problem", "V2 was edited")
    assert captured.get().splitlines() == [
        "pg1: V3 is applied on shards 0-3 but its file is gone",
        "problem: V2 was edited",
    ]
