"""The ``shardctl`` command: option parsing and rendering over the library.

Every error is one line on stderr (``--debug`` adds the traceback) and maps to
an exit code: 0 ok, 1 failed / work pending, 2 bad input, 3 host unreachable, 4 fleet incomplete.

Each command lives in the module named in ``COMMAND_MODULES`` and is imported on first use:
an offline command (decode-id, encode-id, locate, info, render) never imports psycopg.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from ..errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    ConfigErrors,
    OperationFailed,
    ShardctlError,
)
from ..model.dsn import mask
from ..model.topology import LayoutWarning, Topology
from ..version import __version__
from .output import headed, stderr, warn
from .params import flag_option

# The commands that print the topology's warnings (the layout's sign-bit and overflow dates): the ones
# that show or set up the layout. Every other command stays quiet about them.
WARNING_COMMANDS = frozenset({"info", "init", "verify"})


@dataclass
class Settings:
    config: str | None
    allow_inline_password: bool
    debug: bool
    _topology: Topology | None = None

    def topology(self) -> Topology:
        """The validated topology, loaded once; its warnings are printed once, and only by the
        commands in ``WARNING_COMMANDS``."""
        if self._topology is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LayoutWarning)
                self._topology = Topology.load(
                    self.config, allow_inline_password=self.allow_inline_password
                )
            ctx = click.get_current_context(silent=True)
            if ctx is not None and ctx.info_name in WARNING_COMMANDS:
                for message in self._topology.warnings:
                    warn(message)
        return self._topology


def settings() -> Settings:
    return click.get_current_context().find_object(Settings)


def _json_given(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """Remember ``--json`` and the command's name (``init``, ``sandbox up``) where an error's report
    finds them (ShardctlGroup.invoke)."""
    root = ctx.find_root()
    root.meta[COMMAND_NAME] = ctx.command_path.split(" ", 1)[-1]
    if value:
        root.meta[JSON_GIVEN] = True
    return value


JSON_GIVEN = "shardctl.json"
COMMAND_NAME = "shardctl.command"


def json_option(func: Callable) -> Callable:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=_json_given,
        help="Print one JSON document instead of tables.",
    )(func)


# The module (in this package) that defines each top-level command.
COMMAND_MODULES = {
    "decode-id": "offline",
    "encode-id": "offline",
    "info": "offline",
    "locate": "offline",
    "render": "offline",
    "init": "fleet",
    "migrate": "fleet",
    "plan": "fleet",
    "status": "fleet",
    "verify": "fleet",
    "add-host": "grow",
    "add-shard": "grow",
    "move-shard": "move",
    "rebalance": "move",
    "lint": "lint",
    "migrations": "migrations",
    "adopt": "adopt",
    "redeploy": "redeploy",
    "sandbox": "sandbox",
    "demo": "sandbox",
}


class ShardctlGroup(click.Group):
    """Loads each command's module on first use; maps shardctl errors, and click's own usage errors,
    to one line and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            # adds its commands to ``cli``
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[cmd_name]}")
        _imports_done()
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a shardctl error is reported here, where Click's parse of ``--json``
        and ``--debug`` is at hand, and ends the process with its exit code."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            error = exc if isinstance(exc, ShardctlError) else _server_error(exc, ctx)
            if error is None:
                raise
            report_error(
                error,
                ctx.meta.get(JSON_GIVEN, False),
                debug=ctx.params.get("debug", False),
                command=ctx.meta.get(COMMAND_NAME),
            )
            raise click.exceptions.Exit(error.exit_code) from exc

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort as exc:
            if isinstance(exc.__context__, KeyboardInterrupt):  # click's word for Ctrl-C
                stderr.print("interrupted")
                sys.exit(EXIT_INTERRUPTED)
            stderr.print("aborted")
            sys.exit(EXIT_FAILED)
        except click.ClickException as exc:
            exc.show()
            sys.exit(EXIT_BAD_INPUT if isinstance(exc, click.UsageError) else exc.exit_code)
        except ShardctlError as exc:  # raised before the command ran (none today)
            report_error(exc, False)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            stderr.print("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(result, int):
            sys.exit(result)
        return result


def _server_error(exc: Exception, ctx: click.Context) -> ShardctlError | None:
    """A server's error no library function turned into ours (a bug of ours, or a limit nobody
    foresaw) as OperationFailed: one line with the server's own first line, exit 1 (``--debug``
    prints the traceback), never a traceback alone. None for anything else. psycopg is looked up,
    not imported: a command that never connected cannot have raised its errors."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    command = ctx.meta.get(COMMAND_NAME) or "shardctl"
    state = f" (SQLSTATE {exc.sqlstate})" if getattr(exc, "sqlstate", None) else ""
    return OperationFailed(
        f"{command}: stopped by a server's error: {first}{state} (--debug: where)"
    )


def report_error(
    exc: ShardctlError, as_json: bool, debug: bool = False, command: str | None = None
) -> None:
    lines = exc.all_messages() if isinstance(exc, ConfigErrors) else [str(exc)]
    for line in lines:
        stderr.print(f"error: {mask(line)}", markup=False, highlight=False)
    if debug:
        import traceback  # only for --debug

        stderr.print(mask("".join(traceback.format_exception(exc))), markup=False)
    if as_json:
        doc: dict[str, Any] = {
            "ok": False,
            "error": mask(lines[0]),
            "errors": [mask(x) for x in lines],
            "exit_code": exc.exit_code,
        }
        report = getattr(exc, "report", None)
        if report is not None:
            doc["report"] = report
        sys.stdout.write(mask(json.dumps(headed(doc, command), indent=2, default=str)) + "\n")


@click.group(
    cls=ShardctlGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--config",
    "-c",
    envvar="SHARDCTL_CONFIG",
    metavar="FILE",
    help="Topology file (default: $SHARDCTL_CONFIG, else ./shardctl.yaml).",
)
@flag_option("--allow-inline-password", help="Accept a literal password inside a DSN.")
@flag_option("--debug", help="Show tracebacks on errors.")
@click.version_option(__version__, prog_name="shardctl")
@click.pass_context
def cli(ctx: click.Context, config: str | None, allow_inline_password: bool, debug: bool) -> None:
    """Provision and operate Instagram-style sharded PostgreSQL fleets.

    Exit codes: 0 ok; 1 the operation failed (or --check found work pending);
    2 bad input (config, arguments, IDs); 3 a host could not be reached or logged into;
    4 the fleet is incomplete (shards missing, failed, or behind the others); 130 interrupted
    (Ctrl-C stops at a shard boundary).
    """
    # The CLI prints a topology's warnings itself, once (Settings.topology).
    warnings.simplefilter("ignore", LayoutWarning)
    ctx.obj = Settings(config=config, allow_inline_password=allow_inline_password, debug=debug)


# The garbage collector and a shardctl process. Start-up makes ~40,000 objects that live as long as the
# process (modules, classes, functions: psycopg alone is most of them), and the collector would walk
# them over and over while they are made, then again at exit, for nothing: 50-100 ms of a short
# command on a small VM. So ``main`` pauses it until the command's module is imported, freezes what
# the imports made (no collection walks it again, in a long command either) and resumes it; and it
# freezes everything before exit, when the interpreter's last collections would only free memory
# the OS takes back anyway (only cyclic garbage goes unfinalized; shardctl closes its connections
# and files itself). In-process callers (tests, CliRunner) go through ``cli.main`` and keep theirs.
_gc_paused = False


def _imports_done() -> None:
    """Resume the collector ``main`` paused, the start-up's objects frozen out of its way."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()


def _psycopg_versions_from_dist_info() -> None:
    """Spare the process ``importlib.metadata``: ``import psycopg`` reads its own and
    psycopg_binary's version with it (which loads email, zipfile, csv...: about a sixth of the
    import). The same versions are in their ``*.dist-info`` directories' names, next to the packages:
    their ``version`` modules are given those. Where a name is not found exactly once (another
    installer, a source checkout) nothing is given, and psycopg reads it as usual."""
    import importlib.util
    import os
    import types

    for package in ("psycopg", "psycopg_binary"):
        module = f"{package}.version"
        spec = importlib.util.find_spec(package)
        if module in sys.modules or spec is None or not spec.submodule_search_locations:
            continue
        where = os.path.dirname(next(iter(spec.submodule_search_locations)))
        prefix, suffix = f"{package}-", ".dist-info"
        found = [n for n in os.listdir(where) if n.startswith(prefix) and n.endswith(suffix)]
        if len(found) == 1:
            stand_in = types.ModuleType(module, f"{package}'s version, from {found[0]}")
            stand_in.__version__ = found[0][len(prefix) : -len(suffix)]
            sys.modules[module] = stand_in


def main() -> None:
    """The process entry point (console script and ``python -m shardctl``)."""
    global _gc_paused
    if "psycopg" not in sys.modules:
        _psycopg_versions_from_dist_info()
    _gc_paused = gc.isenabled()
    gc.disable()
    try:
        cli.main(prog_name="shardctl")
    finally:
        gc.freeze()


def load_commands() -> dict[str, click.Command]:
    """Every top-level command, all modules loaded (for documentation and tests)."""
    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
