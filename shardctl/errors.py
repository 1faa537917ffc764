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
    """Base of every error shardctl raises on purpose. ``next_step``: what to do about it, set by a
    caller that knows (a move names how to resume), shown after the raiser's own message."""

    exit_code = EXIT_FAILED
    next_step: str | None = None

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} [{self.next_step}]" if self.next_step else text


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


class MissingExtra(BadInput):
    """A feature needs a package that ``pip install shardctl`` leaves out (the PostgreSQL servers,
    the SQL parser and linter): the message names the extra that brings it."""

    def __init__(self, what: str, extra: str):
        self.extra = extra
        super().__init__(
            f"{what} needs shardctl's {extra!r} extra: pip install 'shardctl[{extra}]'"
        )


class LimitExceeded(BadInput):
    """The topology text crosses a size limit (bytes, nodes, depth, one value's length) or is not
    YAML; ``line`` is 1-based where known (the loader turns it into a ConfigError with the path)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class SqlSyntaxError(BadInput):
    """SQL that PostgreSQL's parser refuses; ``line`` is 1-based in the text parsed."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.message, self.line = message, line


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


class ShardMoved(OperationFailed):
    """A shard moved to another host after this transaction had sent a statement to the old one, so the
    transaction cannot follow it. Retry the request: the next transaction is routed to the new owner."""

    def __init__(self, shard: int, host: str):
        self.shard = shard
        self.host = host
        super().__init__(f"shard {shard} moved to host {host!r} during this transaction; retry it")


class WaitTimeout(OperationFailed):
    """A wait for the servers to reach a state (a slot released, a worker stopped, a subscription
    caught up) ran out of time."""


class FreezeTimeout(WaitTimeout):
    """One freeze attempt of a move could not finish within --max-freeze; it was rolled back."""


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


class ConnectionLost(ShardctlError):
    """A host went away in the middle of a run; the shards it had not committed are untouched."""

    exit_code = EXIT_UNREACHABLE


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
