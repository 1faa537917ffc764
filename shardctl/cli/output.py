"""Rendering results: rich for humans (stdout), one JSON document with --json."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..model.dsn import mask

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class _LazyConsole:
    """A rich Console made on first use: a command that prints no table or markup (``migrate --check``
    passing, ``--json``) never imports rich (about 40 ms of its start-up)."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._settings)
        return getattr(self._console, name)


# Piped output keeps whole tables: rich would otherwise squeeze them to 80 columns.
# emoji=False: shardctl prints no emoji codes, and a name or DSN holding one (":fire:") stays as
# written; rich also skips importing its table of 4,000 emoji names (~4 ms of every start-up).
stdout: Console = _LazyConsole(  # type: ignore[assignment]
    highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200
)
stderr: Console = _LazyConsole(  # type: ignore[assignment]
    stderr=True, highlight=False, emoji=False, soft_wrap=True
)


def command_name() -> str:
    """The running command as typed after ``shardctl``: ``status``, ``sandbox up``."""
    ctx = click.get_current_context(silent=True)
    return ctx.command_path.partition(" ")[2] if ctx is not None else ""


def headed(data: dict[str, Any], command: str | None = None) -> dict[str, Any]:
    """``data`` as every ``--json`` document is: ``command`` then ``ok`` first, then the rest in
    order. ``command``: the document's own, else ``command``, else the running command's name;
    ``ok``: the document's own, else True (a failure sets it: ``finish``, ``report_error``)."""
    name = data.get("command") or command or command_name()
    rest = {k: v for k, v in data.items() if k not in ("command", "ok")}
    return {"command": name, "ok": data.get("ok", True), **rest}


def write_json(data: dict[str, Any]) -> None:
    sys.stdout.write(mask(json.dumps(headed(data), indent=2, default=str)) + "\n")


def emit(as_json: bool, data: dict[str, Any], human: Callable[[], None]) -> None:
    """Print ``data`` as one JSON document (``command`` and ``ok`` first), or call ``human`` to print it
    for people."""
    if as_json:
        write_json(data)
    else:
        human()


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*["" if v is None else mask(str(v)) for v in r])
    return t


def host_table(
    title: str, columns: list[str], hosts: list[Any], cells: Callable[[Any], list[Any]]
) -> Table:
    """One row per host (a HostResult): its name, ``cells(host)`` under ``columns``, then the time it
    took there."""
    rows = [[h.host, *cells(h), f"{h.seconds:.2f}s"] for h in hosts]
    return table(title, ["host", *columns, "time"], rows)


def flagged(label: str, text: str, color: str = "red") -> None:
    """One line on stdout, ``label: text``, the label (a host, "problem") in ``color``."""
    stdout.print(f"[{color}]{label}[/{color}]: {text}", markup=True, highlight=False)


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {mask(message)}", markup=True)


def info(message: str) -> None:
    """A progress note to stderr, so stdout stays clean for data."""
    stderr.print(mask(message), markup=False)
