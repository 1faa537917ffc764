"""Numbers typed by people: ASCII digits only, bounded length, and short echoes of bad input.

``int()`` and ``str.isdigit()`` accept any Unicode decimal digit (``٨``, ``０``, ``١٢٣``), so text
that merely looks like another number would be read as one; every number shardctl parses from
text goes through :func:`is_ascii_digits` or :func:`parse_int`.
"""

from __future__ import annotations

MAX_DIGITS = 20  # 2**64 has 20 digits: no ID, shard, count or millisecond needs more
ECHO_CHARS = 60  # how much of a bad value an error message repeats


def is_ascii_digits(text: str) -> bool:
    """True for a non-empty run of the ASCII digits 0-9 (nothing else, no sign, no spaces)."""
    return text.isascii() and text.isdigit()


def parse_int(text: str, *, signed: bool = False, max_digits: int = MAX_DIGITS) -> int:
    """Parse ASCII decimal text (optional ``-`` when ``signed``); ValueError with a short message otherwise."""
    stripped = text.strip()
    digits = stripped[1:] if signed and stripped.startswith("-") else stripped
    if not is_ascii_digits(digits):
        raise _not_a_number(stripped, "a whole number")
    if len(digits) > max_digits:
        raise ValueError(
            f"number too long ({len(digits)} digits, at most {max_digits}): {echo(stripped)}"
        )
    return int(stripped)


def parse_decimal(text: str, *, max_chars: int = 32) -> float:
    """Parse ASCII decimal text such as ``5``, ``0.5`` or ``.25`` (no sign, exponent, inf or nan)."""
    stripped = text.strip()
    whole, _, frac = stripped.partition(".")
    if (
        len(stripped) > max_chars
        or not (whole or frac)
        or any(p and not is_ascii_digits(p) for p in (whole, frac))
    ):
        raise _not_a_number(stripped, "a decimal number")
    return float(stripped)


def _not_a_number(text: str, what: str) -> ValueError:
    """The error for text that is not ``what``, saying so when it uses non-ASCII digits."""
    if text and not text.isascii() and any(c.isdigit() for c in text[:ECHO_CHARS]):
        return ValueError(f"{echo(text)} uses non-ASCII digits (write numbers with 0-9)")
    return ValueError(f"not {what}: {echo(text)}")


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr`` of a bad value for a message, cut to about ``limit`` characters.

    Containers are named, not printed: a YAML alias can make a small file stand for a huge list.
    """
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"… ({len(value)} characters)"
    text = (
        repr(value)
        if isinstance(value, (str, int, float, bool, type(None)))
        else f"a {type(value).__name__}"
    )
    return text if len(text) <= limit + 2 else text[:limit] + "…"
