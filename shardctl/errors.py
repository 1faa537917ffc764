"""One exception hierarchy; each class carries the CLI exit code it maps to.

Exit codes: 0 ok; 1 the operation failed or ``--check`` found work
pending; 2 bad input (config, arguments, IDs); 3 a host could not be reached;
4 the fleet is incomplete: shards missing (never created, or their schema gone) or
failed (``migrate`` finished without them; ``status`` found them); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_INCOMPLETE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class ShardctlError(Exception):
    """Base of every error shardctl raises on purpose."""

    exit_code = EXIT_FAILED


class BadInput(ShardctlError):
    """Bad arguments or IDs given on the command line or to the API."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(BadInput):
    """The topology file is invalid. ``line`` is 1-based where known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        self.problem = message
        where = ""
        if path and line:
            where = f"{path}:{line}: "
        elif path:
            where = f"{path}: "
        elif line:
            where = f"line {line}: "
        super().__init__(f"{where}{message}")


class ConfigErrors(ConfigError):
    """Several validation problems found in one pass over the file."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        first = errors[0]
        extra = (
            f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
            if len(errors) > 1
            else ""
        )
        super().__init__(first.problem + extra, path=first.path, line=first.line)

    def all_messages(self) -> list[str]:
        return [str(e) for e in self.errors]


class SessionStateError(BadInput):
    """A Router statement would leave session state on a server connection a transaction pooler shares."""


class OperationFailed(ShardctlError):
    """The operation ran but some of it failed (details in ``report``)."""

    def __init__(self, message: str, report: object | None = None):
        self.report = report
        super().__init__(message)


class FleetIncomplete(OperationFailed):
    """Shards are missing (never created, or their schema is gone) or failed their last migration: the
    command itself ran (``migrate`` applied what it could; ``status`` read every host)."""

    exit_code = EXIT_INCOMPLETE


class Interrupted(OperationFailed):
    """Ctrl-C stopped a fleet command at a shard boundary; ``report`` says which shards were done."""

    exit_code = EXIT_INTERRUPTED


class LockBusy(OperationFailed):
    """Another shardctl run holds the per-host lock."""


class PendingWork(ShardctlError):
    """``--check`` found work pending."""


class HostUnreachable(ShardctlError):
    """A host could not be reached."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, host: str, reason: str, report: object | None = None):
        self.host = host
        self.reason = reason
        self.report = report
        super().__init__(f"host {host} is unreachable: {reason}")


def first_few(
    items: Sequence[T],
    shown: int,
    say: Callable[[T], str] = str,
    sep: str = "; ",
    more: str = "more",
) -> str:
    """The first ``shown`` of ``items``, each as ``say`` puts it, joined by ``sep``, then
    " (and N more)" for the rest: how a one-line message names the first few of many problems."""
    text = sep.join(say(item) for item in items[:shown])
    if len(items) > shown:
        text += f" (and {len(items) - shown} {more})"
    return text
