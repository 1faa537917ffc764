"""Where a routing key lives: integer keys ``key % modulus``, strings ``md5(key) mod modulus``."""

from __future__ import annotations

import hashlib

from ..errors import BadInput
from ..model.numbers import echo, is_ascii_digits


def shard_for_key(key: int | str, modulus: int, *, force_string: bool = False) -> int:
    """Shard of a routing key. Integer-looking text counts as an integer unless ``force_string``."""
    if isinstance(key, bool):
        raise BadInput(f"a routing key must be an integer or a string, got {key!r}")
    if isinstance(key, int) and not force_string:
        if key < 0:
            raise BadInput(f"integer routing keys are not negative: {key}")
        return key % modulus
    text = str(key)
    if not force_string and is_integer_key(text):
        try:
            return shard_for_key(int(text), modulus)
        except ValueError:  # beyond int()'s 4300 digits
            raise BadInput(
                f"integer routing key of {len(text.strip())} digits is too long"
            ) from None
    if not force_string and _foreign_digits(text):
        raise BadInput(
            f"routing key {echo(text)} is written with non-ASCII digits: write the number with 0-9, "
            f"or route it as a string (--string)"
        )
    if text == "":
        raise BadInput("a routing key must not be empty")
    # Pinterest's "mod shard": the whole 128-bit md5 digest, as an unsigned integer, mod the count.
    return int.from_bytes(hashlib.md5(text.encode()).digest(), "big") % modulus


def is_integer_key(text: str) -> bool:
    """Whether text is routed as an integer: optional leading ``-``, then ASCII digits 0-9.

    Not ``isdecimal``/``int()`` alone: they also read digits such as ``١٢٣`` or ``０``, which
    would send a key that merely looks like 123 to shard 123 (such keys are refused instead).
    """
    stripped = text.strip()
    digits = stripped.removeprefix("-")
    return is_ascii_digits(digits)


def _foreign_digits(text: str) -> bool:
    """Text that ``int()`` would read as a number, written with non-ASCII digits."""
    stripped = text.strip()
    digits = stripped.removeprefix("-")
    return digits.isdecimal() and not digits.isascii()


def placement_shard(key: int | str, new_objects: list[int], *, force_string: bool = False) -> int:
    """The shard a *new* object goes to under ``placement.new_objects``: spread over those shards
    the same way keys spread over the modulus."""
    return new_objects[shard_for_key(key, len(new_objects), force_string=force_string)]
