"""Shard range parsing and formatting: ``"0-2047"``, ``"0-3,7"``, ``[0, "4-7"]``, ``5``."""

from __future__ import annotations

from collections.abc import Iterable


def parse_shards(spec: object, *, limit: int | None = None) -> list[int]:
    """Return the sorted, distinct shard numbers named by ``spec``.

    Raises ``ValueError`` with a readable message on bad syntax, reversed or
    negative ranges, repeats, or numbers at or beyond ``limit``.
    """
    items = _items(spec)
    seen: set[int] = set()
    for item in items:
        lo, hi = _one(item)
        if limit is not None and hi >= limit:
            raise ValueError(f"shard {hi} is out of range (0..{limit - 1})")
        for n in range(lo, hi + 1):
            if n in seen:
                raise ValueError(f"shard {n} is listed twice")
            seen.add(n)
    return sorted(seen)


def _items(spec: object) -> list[object]:
    if isinstance(spec, bool) or spec is None:
        raise ValueError(f"expected a shard number, a range like \"0-2047\" or a list, got {spec!r}")
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise ValueError(f"empty shard range in {spec!r}")
        return parts
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("empty list of shards")
        out: list[object] = []
        for item in spec:
            if isinstance(item, (list, tuple)):
                raise ValueError(f"nested list in shard list: {item!r}")
            out.extend(_items(item))
        return out
    raise ValueError(f"expected a shard number, a range like \"0-2047\" or a list, got {spec!r}")


def _one(item: object) -> tuple[int, int]:
    if isinstance(item, bool):
        raise ValueError(f"not a shard number: {item!r}")
    if isinstance(item, int):
        if item < 0:
            raise ValueError(f"shard numbers are not negative: {item}")
        return item, item
    text = str(item).strip()
    lo_text, sep, hi_text = text.partition("-")
    if not sep:
        hi_text = lo_text
    if not (lo_text.isdecimal() and hi_text.isdecimal()):
        raise ValueError(f"not a shard number or range: {text!r} (write e.g. 7 or \"0-2047\")")
    lo, hi = int(lo_text), int(hi_text)
    if lo > hi:
        raise ValueError(f"range {text!r} runs backwards")
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
