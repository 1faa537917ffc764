"""What ``verify`` checks about a shard's IDs: exactly what the layout promises, nothing more.

The layout promises unique IDs, ordered across milliseconds. Within one millisecond the
sequence part is ``nextval % 2**sequence_bits``, so when the sequence passes a multiple
of that (e.g. 1023 → 1024 with 10 bits) the next ID in the same millisecond is *smaller*:
a wrap, not a fault (the primary key refuses the rare duplicate it could cause). So a
sample is checked for: duplicates, time going backwards, the shard bits, and time far
from the host clock. The sequence's own settings are checked separately (CACHE 1).

Pure functions over numbers: no database, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import BadInput
from ..model.layouts import Layout


def sample_problems(
    layout: Layout, shard: int, ids: Sequence[int], host_ms: int, tolerance_ms: int
) -> list[str]:
    """Problems with IDs ``ids`` that shard ``shard``'s next_id() returned in a row, just before
    the host's clock read ``host_ms``; an empty list for a healthy shard."""
    problems: list[str] = []
    try:
        # the shard of every ID (refused as decode refuses it); only the IDs a message names are
        # decoded in full: verify checks ~30,000 IDs at 8,192 shards
        shards = [layout.shard_of(i) for i in ids]
    except BadInput as exc:
        return [f"next_id() returns an ID that is not a {layout.name} ID: {exc}"]
    dup = duplicate(ids)
    if dup is not None:
        problems.append(
            f"IDs do not strictly increase: next_id() returned {dup} twice (a duplicate ID; "
            f"more than {layout.ids_per_ms_per_shard or '?'} IDs in one millisecond, "
            f"or a sequence that repeats)"
        )
    back = time_goes_back(layout, ids)
    if back is not None:
        a, b = back
        problems.append(
            f"IDs do not strictly increase across milliseconds: {a} then {b} "
            f"(the second is from an earlier millisecond)"
        )
    wrong = next((layout.decode(i) for i, n in zip(ids, shards) if n != shard), None)
    if wrong is not None:
        problems.append(
            f"next_id() mints IDs for shard {wrong['shard']}, not {shard} (e.g. {wrong['id']})"
        )
    if layout.has_time:
        for p in (layout.decode(ids[0]), layout.decode(ids[-1])) if ids else ():
            off = p["unix_ms"] - host_ms
            if abs(off) > tolerance_ms:
                problems.append(
                    f"ID {p['id']} decodes to {p['time']}, {off:+d} ms from the host clock "
                    f"(tolerance {tolerance_ms} ms; wrong epoch?)"
                )
                break
    return problems


def duplicate(ids: Sequence[int]) -> int | None:
    """An ID that occurs more than once in ``ids``, or None."""
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    return None


def time_goes_back(layout: Layout, ids: Sequence[int]) -> tuple[int, int] | None:
    """The first consecutive pair whose second ID is from an earlier millisecond, or None.

    Within one millisecond the order is not checked: the sequence part wraps at
    ``2**sequence_bits`` and the next ID of the same millisecond is then smaller.
    Signed (negative) bigint IDs are compared as the unsigned 64-bit values they stand for.
    """
    if not layout.has_time:
        return None
    shift, mask = layout.shift("time"), (1 << layout.bits("time")) - 1
    times = [((i + (1 << 64) if i < 0 else i) >> shift) & mask for i in ids]
    for k in range(1, len(ids)):
        if times[k] < times[k - 1]:
            return ids[k - 1], ids[k]
    return None


def sequence_problems(settings: dict) -> list[str]:
    """Problems with a shard's ID sequence, from its catalog row (``cache_size``, ``increment_by``, ``cycle``).

    CACHE 1 is required: with a larger cache each backend takes its own block of values, so
    two sessions hand out values out of order and, within one millisecond, can collide.
    """
    problems = []
    cache = settings.get("cache_size")
    if cache is not None and cache != 1:
        problems.append(
            f"ID sequence has CACHE {cache}, not 1 (backends would take blocks of values and "
            f"can mint the same ID in one millisecond)"
        )
    increment = settings.get("increment_by")
    if increment is not None and increment != 1:
        problems.append(f"ID sequence has INCREMENT BY {increment}, not 1")
    return problems
