"""The process entry point pauses the garbage collector through start-up only (``shardctl.cli.main``).

A command runs with the collector on (a long ``move-shard`` makes garbage like any program); the
objects start-up made are frozen out of its way; in-process callers (CliRunner, tests, libraries)
keep their collector exactly as it was.
"""

from __future__ import annotations

import gc
import subprocess
import sys

from click.testing import CliRunner

from shardctl.cli import cli

# Runs ``main`` as the console script does and reports, from inside the command, then at exit.
PROBE = """
import atexit, gc, sys
import click
from shardctl.cli import main
seen = {}
real = click.Command.invoke
def probe(self, ctx):
    if not isinstance(self, click.Group):
        seen["during"] = (gc.isenabled(), gc.get_freeze_count())
    return real(self, ctx)
click.Command.invoke = probe
atexit.register(lambda: print("during", *seen["during"], "exit", gc.isenabled(), gc.get_freeze_count(),
                              file=sys.stderr))
sys.argv = ["shardctl", "decode-id", "--layout", "instagram", "1"]
main()
"""


def test_a_command_runs_with_the_collector_on_and_start_up_frozen():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    words = proc.stderr.split()
    during, exit_ = words[words.index("during") + 1 :][:2], words[words.index("exit") + 1 :][:2]
    assert during[0] == "True" and int(during[1]) > 10_000  # on, with the imports frozen
    assert int(exit_[1]) >= int(during[1])  # frozen again before exit


def test_in_process_callers_keep_their_collector():
    before = (gc.isenabled(), gc.get_freeze_count())
    result = CliRunner().invoke(cli, ["decode-id", "--layout", "instagram", "1"])
    assert result.exit_code == 0, result.output
    assert (gc.isenabled(), gc.get_freeze_count()) == before
