"""Shard range parsing and formatting: ``"0-2047"``, ``"0-3,7"``, ``[0, "4-7"]``, ``5``."""

from __future__ import annotations

from collections.abc import Iterable

from .numbers import MAX_DIGITS, echo, is_ascii_digits

# No fleet has more shards than this (docs/topology.md): a range is checked against it, or
# against the caller's tighter ``limit``, before a single number of it is materialised.
MAX_SHARDS = 1 << 16


def parse_shards(spec: object, *, limit: int | None = None) -> list[int]:
    """Return the sorted, distinct shard numbers named by ``spec``.

    Raises ``ValueError`` with a readable message on bad syntax (digits are ASCII 0-9 only),
    reversed or negative ranges, repeats, or numbers at or beyond ``limit`` (at most
    :data:`MAX_SHARDS`, also when ``limit`` is None).
    """
    items = _items(spec)
    seen: set[int] = set()
    bound = MAX_SHARDS if limit is None else min(limit, MAX_SHARDS)
    for item in items:
        lo, hi = _one(item)
        if hi >= bound:
            if limit is not None and limit <= MAX_SHARDS:
                raise ValueError(f"shard {hi} is out of range (0..{limit - 1})")
            raise ValueError(
                f"shard {hi} is beyond the {MAX_SHARDS} shards shardctl handles (0..{MAX_SHARDS - 1})"
            )
        for n in range(lo, hi + 1):
            if n in seen:
                raise ValueError(f"shard {n} is listed twice")
            seen.add(n)
    return sorted(seen)


def _items(spec: object) -> list[object]:
    if isinstance(spec, bool) or spec is None:
        raise ValueError(
            f'expected a shard number, a range like "0-2047" or a list, got {echo(spec)}'
        )
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise ValueError(f"empty shard range in {echo(spec)}")
        return parts
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("empty list of shards")
        out: list[object] = []
        for item in spec:
            if isinstance(item, (list, tuple)):
                raise ValueError(f"nested list in shard list: {echo(item)}")
            out.extend(_items(item))
        return out
    raise ValueError(f'expected a shard number, a range like "0-2047" or a list, got {echo(spec)}')


def _one(item: object) -> tuple[int, int]:
    if isinstance(item, bool):
        raise ValueError(f"not a shard number: {echo(item)}")
    if isinstance(item, int):
        if item < 0:
            raise ValueError(f"shard numbers are not negative: {item}")
        return item, item
    text = str(item).strip()
    lo_text, sep, hi_text = text.partition("-")
    if not sep:
        hi_text = lo_text
    if not (is_ascii_digits(lo_text) and is_ascii_digits(hi_text)):
        digits = (
            ""
            if text.isascii() or not any(c.isdigit() for c in text)
            else " (digits must be ASCII 0-9)"
        )
        raise ValueError(
            f'not a shard number or range: {echo(text)}{digits} (write e.g. 7 or "0-2047")'
        )
    if len(lo_text) > MAX_DIGITS or len(hi_text) > MAX_DIGITS:
        raise ValueError(f"shard number too large in {echo(text)}")
    lo, hi = int(lo_text), int(hi_text)
    if lo > hi:
        raise ValueError(f"range {echo(text)} runs backwards")
    return lo, hi


def format_shards(shards: Iterable[int]) -> str:
    """Compact text for a set of shard numbers: ``0-3,7,9-10``."""
    nums = sorted(set(shards))
    runs: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        runs.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(runs)
