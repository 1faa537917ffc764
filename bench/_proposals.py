"""Proposed changes to shardctl, measured by ``--proposals`` (rows marked "(proposal)", never targets).

Nothing here is used by shardctl. Each function is a drop-in for the shardctl code named in its
docstring, written so the owner can port it and the benchmark shows what it would gain.
"""

from __future__ import annotations

import datetime as _dt
import io
from itertools import islice

CHUNK = 8192
_MS_Z = [f".{ms:03d}Z" for ms in range(1000)]
_HOURS = [f"{h:02d}:" for h in range(24)]
_MM_SS = [f"{m:02d}:{s:02d}" for m in range(60) for s in range(60)]


def write_csv(decoder, lines, out) -> list[tuple[int, str, str]]:
    """Proposed ``shardctl.ids.decode.Decoder.write_csv``: same output and same errors, faster.

    Compared with shardctl's per-layout loop (``shardctl.ids.decode._decoding_loop``), three differences:

    * lines go in chunks of 8192 and each chunk is converted with ``list(map(int, chunk))`` and range-checked
      with ``min``/``max``: those loops run in C, where today every line pays a Python-level
      ``enumerate`` step, a ``try``/``int()``, and two comparisons. A chunk with anything unusual (a bad
      line, a negative or oversized value, a shard the topology lacks, a year past 9999) goes whole through
      the existing careful loop, which names each bad line; line numbers are shifted to the chunk's place;
    * the time of day comes from two small tables, "HH:" (24) and "MM:SS" (3600), instead of one table of
      the 86400 "HH:MM:SS" of a day (~5 MB of string objects): on IDs spread over months nearly every
      lookup in the big table is a cache miss (about 20% of the time on the ``spread`` dataset);
    * ",schema,host\n" per shard from a list indexed by shard (no dict, no ``__missing__``).
    """
    layout = decoder.layout
    names = [f.name for f in layout.fields]
    if not layout.has_time or len(names) != 3 or names[0] != "time":
        return decoder.write_csv(
            lines, out
        )  # pinterest (no time) and other shapes: the existing loop
    time_shift = layout.shift("time")
    a_shift, a_mask = layout.shift(names[1]), (1 << layout.bits(names[1])) - 1
    b_mask = (1 << layout.bits(names[2])) - 1
    limit = min(
        1 << layout.payload_bits, 1 << 63
    )  # IDs >= 2**63 print as negative bigints: careful loop
    epoch_ms = layout.epoch_ms
    hours, mmss, ms_z = _HOURS, _MM_SS, _MS_Z
    days: dict[int, str] = {}
    a_text = [f",{i}," for i in range(a_mask + 1)]
    tails: list[str | None] | None = None
    if decoder.topology is not None:
        if names[1] != "shard":
            return decoder.write_csv(lines, out)
        schema = decoder.topology.schema_name
        tails = [None] * (a_mask + 1)
        for shard, host in decoder._hosts.items():
            if 0 <= shard <= a_mask:
                tails[shard] = f",{schema(shard)},{host}\n"
    write = out.write
    write(",".join(decoder.columns()) + "\n")
    source = iter(lines)
    bad: list[tuple[int, str, str]] = []
    done = 0
    while True:
        chunk = list(islice(source, CHUNK))
        if not chunk:
            break
        try:
            ints = list(map(int, chunk))
            fast = min(ints) >= 0 and max(ints) < limit
        except ValueError:
            fast = False
        buf: list[str] = []
        append = buf.append
        if fast:
            for v in ints:
                secs, ms = divmod((v >> time_shift) + epoch_ms, 1000)
                d, second = divmod(secs, 86400)
                hh, second = divmod(second, 3600)
                day = days.get(d)
                if day is None:
                    try:
                        day = _dt.date.fromordinal(719163 + d).isoformat() + "T"
                    except (
                        ValueError,
                        OverflowError,
                    ):  # beyond year 9999: the careful loop prints no time
                        fast = False
                        break
                    days[d] = day
                a = (v >> a_shift) & a_mask
                if tails is None:
                    append(f"{v},{day}{hours[hh]}{mmss[second]}{ms_z[ms]}{a_text[a]}{v & b_mask}\n")
                else:
                    tail = tails[a]
                    if (
                        tail is None
                    ):  # a shard this topology does not have: the careful loop names it
                        fast = False
                        break
                    append(
                        f"{v},{day}{hours[hh]}{mmss[second]}{ms_z[ms]}{a_text[a]}{v & b_mask}{tail}"
                    )
        if fast:
            write("".join(buf))
        else:
            part = io.StringIO()
            bad += [
                (n + done, text, problem) for n, text, problem in decoder.write_csv(chunk, part)
            ]
            text = part.getvalue()
            write(text[text.index("\n") + 1 :])  # without its header
        done += len(chunk)
    return bad


def patched_cli() -> None:
    """``shardctl`` with :func:`write_csv` in place of ``Decoder.write_csv`` (for the CLI proposal row)."""
    from shardctl.cli import main
    from shardctl.ids import decode

    original = decode.Decoder.write_csv

    def method(self, lines, out):
        return write_csv(_Careful(self, original), lines, out)

    decode.Decoder.write_csv = method
    main()


class _Careful:
    """A decoder whose ``write_csv`` is the original one (the proposal's fallback), all else delegated."""

    def __init__(self, decoder, original):
        self._decoder = decoder
        self._original = original

    def __getattr__(self, name):
        return getattr(self._decoder, name)

    def write_csv(self, lines, out):
        return self._original(self._decoder, lines, out)
