"""Option types: numbers in ASCII digits only; and three shapes of option: :func:`shown_option`, whose
help shows its default, :func:`choice_option`, one of a list (the first by default), and
:func:`flag_option`, an on/off flag.

click's INT and FLOAT read any Unicode decimal digit (``--shard ٣`` is 3); these types refuse them
with one line and exit code 2, like every other bad input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..errors import BadInput
from ..model.numbers import echo, parse_decimal, parse_int


class AsciiInt(click.ParamType):
    """A whole number written with 0-9 (a leading ``-`` allowed), optionally within [lo, hi]."""

    name = "integer"

    def __init__(self, lo: float | None = None, hi: float | None = None):
        self.lo, self.hi = lo, hi

    def parse(self, text: str) -> float:
        return parse_int(text, signed=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        else:
            text = str(value)
            try:
                number = self.parse(text)
            except ValueError as exc:
                problem = (
                    str(exc)
                    if "non-ASCII" in str(exc)
                    else f"{echo(text)} is not a valid {self.name}"
                )
                raise BadInput(f"{_name(param)}: {problem}") from None
        if (self.lo is not None and number < self.lo) or (self.hi is not None and number > self.hi):
            bounds = " and ".join(
                t
                for t in (
                    f"at least {_show(self.lo)}" if self.lo is not None else "",
                    f"at most {_show(self.hi)}" if self.hi is not None else "",
                )
                if t
            )
            raise BadInput(f"{_name(param)}: {_show(number)} is out of range (it must be {bounds})")
        return number

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.lo}, {self.hi})"


class AsciiFloat(AsciiInt):
    """A decimal number written with 0-9 and an optional point (``0.5``, ``5``), optionally within [lo, hi]."""

    name = "number"

    def parse(self, text: str) -> float:
        return parse_decimal(text)


def _show(number: float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)


def _name(param: click.Parameter | None) -> str:
    if param is None:
        return "value"
    opts = getattr(param, "opts", None)
    return opts[0] if opts else str(param.name)


ASCII_INT = AsciiInt()

# PostgreSQL's units for a time setting, in seconds (a bare number is in the option's ``unit``).
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class Duration(AsciiInt):
    """A time as PostgreSQL reads a time setting (``100ms``, ``2s``, ``1min``; a bare number is in
    ``unit``), read as seconds (float): the CLI's edge, where every timeout becomes seconds."""

    name = "duration"

    def __init__(self, unit: str = "ms", lo: float | None = 0, hi: float | None = 86_400):
        super().__init__(lo, hi)
        self.unit = unit

    def parse(self, text: str) -> float:
        stripped = text.strip()
        number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz").rstrip()
        unit = stripped[len(number) :].strip() or self.unit
        if unit not in _UNITS:
            raise ValueError(f"{echo(text)}: unknown unit {unit!r} (use {', '.join(_UNITS)})")
        return parse_decimal(number) * _UNITS[unit]


def show_duration(seconds: float) -> str:
    """``seconds`` the way a user writes it on the command line: ``100ms``, ``6s``."""
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


class Names(click.ParamType):
    """Comma-separated names (``pg1,pg2``), read as a list; an empty value is no list (None)."""

    name = "names"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list) or not value:
            return value or None
        names = [n.strip() for n in str(value).split(",") if n.strip()]
        if not names:
            raise BadInput(f"{_name(param)}: give names separated by commas")
        return names


def shown_option(
    name: str | tuple[str, str], type: Any, default: Any, help: str, **attrs: Any
) -> Callable[[Callable], Callable]:
    """``click.option(name, type=type, default=default, show_default=True, help=help, **attrs)``: an
    option whose help shows its default (``type`` None: click's, from the default). ``name`` may be
    the option and the parameter it fills: ``("--shards", "shard_spec")``."""
    names = (name,) if isinstance(name, str) else name
    return click.option(*names, type=type, default=default, show_default=True, help=help, **attrs)


def choice_option(name: str, choices: list[str], help: str) -> Callable[[Callable], Callable]:
    """An option taking one of ``choices``, the first by default (its help shows it)."""
    return shown_option(name, click.Choice(choices), choices[0], help)


def flag_option(*names: str, help: str) -> Callable[[Callable], Callable]:
    """``click.option(*names, is_flag=True, help=help)``: a flag, off unless given."""
    return click.option(*names, is_flag=True, help=help)
