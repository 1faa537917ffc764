"""Options and result handling shared by the fleet commands (init, migrate, plan, verify, status, grow,
move, lint, redeploy)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from ..engine.defaults import DEFAULT_BATCH, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RECYCLE
from ..errors import ShardctlError
from . import json_option, report_error, settings
from .output import emit
from .params import AsciiFloat, AsciiInt, Names, shown_option


def option_group(*decorators: Callable[[Callable], Callable]) -> Callable[[Callable], Callable]:
    """One decorator for several options, named in the order they would be stacked above a command
    (the order its help lists them in)."""

    def apply(func: Callable) -> Callable:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def connect_timeout_option(func: Callable) -> Callable:
    """``--connect-timeout``: every command that connects to a host has it, with one default
    (``engine.defaults.DEFAULT_CONNECT_TIMEOUT``, the library's default too)."""
    return shown_option(
        "--connect-timeout",
        AsciiInt(1, 3600),
        DEFAULT_CONNECT_TIMEOUT,
        "Seconds to wait for a host to answer.",
    )(func)


def wait_option(func: Callable) -> Callable:
    """``--wait``: how long a command that takes hosts' locks waits for another run's (one default, 0)."""
    return shown_option(
        "--wait",
        AsciiFloat(0, 86_400),
        0,
        "Seconds to wait for another shardctl run's locks on the hosts.",
    )(func)


def hosts_option(func: Callable) -> Callable:
    """``--hosts NAMES``: limit a command to some hosts; the command is given their list, or None."""
    return click.option(
        "--hosts", type=Names(), metavar="NAMES", help="Only these hosts (comma-separated)."
    )(func)


# ``--hosts``, ``--connect-timeout`` and ``--json``: what every fleet-wide command takes.
host_options = option_group(json_option, connect_timeout_option, hosts_option)

# How a command that applies shards runs them: parallelism, lock wait, connection reuse, batches.
# The options named as RunOptions fields (--jobs, --wait, --batch-size, --recycle-after, and migrate's
# lock options; --connect-timeout too) reach the command in its ``**run``, which it passes on as ``RunOptions(**run)``.
run_options = option_group(
    click.option(
        "--jobs",
        type=AsciiInt(1, 256),
        default=None,
        help="Connections applying shards at once per host (default: the host's cores, "
        "bounded by hosts[].max_jobs and free connection slots).",
    ),
    wait_option,
    shown_option(
        "--recycle-after",
        AsciiInt(1, 1_000_000),
        DEFAULT_RECYCLE,
        "Shards per connection before it is replaced.",
    ),
    shown_option(
        "--batch-size",
        AsciiInt(1, 10_000),
        DEFAULT_BATCH,
        "Shards per transaction (at most; see --max-lock-hold).",
    ),
)


def finish(
    as_json: bool, doc: dict, human: Callable[[], None], error: ShardctlError | None
) -> None:
    """Print the result, then the one-line error and its exit code, if any."""
    if error is not None and as_json:
        doc = {**doc, "ok": False, "error": str(error), "exit_code": error.exit_code}
    emit(as_json, doc, human)
    if error is not None:
        report_error(error, as_json=False, debug=settings().debug)
        sys.exit(error.exit_code)


def status_of(result: object) -> ShardctlError | None:
    """The error ``result.raise_for_status()`` raises, or None."""
    try:
        result.raise_for_status()
    except ShardctlError as exc:
        return exc
    return None
