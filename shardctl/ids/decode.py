"""Decoding many IDs at once: per-line errors, owning schema and host, fast CSV, JSON and table rows.

Everything streams: lines are read in bounded chunks (a line longer than
:data:`MAX_LINE_CHARS` is reported by its first characters, never held whole), decoded
IDs are written as they come, and bad lines are counted, with only the first
:data:`KEEP_BAD` kept for the report. Memory stays flat however long the input.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TextIO

from ..errors import BadInput
from ..model.layouts import Layout, iso, utc_from_ms
from ..model.numbers import ECHO_CHARS, is_ascii_digits
from ..model.topology import Topology
from . import old_ids

_MAX_U64 = (1 << 64) - 1
MAX_LINE_CHARS = 4096  # no ID is longer than 21 characters; a longer line is reported, not kept
KEEP_BAD = 100  # bad lines kept (with their text) for the report; the rest are only counted
_TOO_LONG = "\x00"  # marks a line cut at MAX_LINE_CHARS (a NUL never starts a real line of IDs)
_CHUNK = 1 << 16
_MAX_RAISES = 64  # per chunk of 8192 lines in the CSV loop's fast path


def bounded_lines(stream: TextIO, limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of ``stream`` without their newline, each at most ``limit`` characters long.

    A longer line comes out as its first characters behind a marker (see :func:`line_problem`);
    the rest of it is skipped as it is read, so a 20 MB line costs no more memory than a short one.
    """
    carry, overlong = "", False
    while True:
        data = stream.read(_CHUNK)
        if not data:
            break
        parts = data.split("\n")
        last = parts.pop()
        if parts:
            parts[0] = _TOO_LONG + carry if overlong else carry + parts[0]
            if max(map(len, parts)) > limit:
                parts = [p if len(p) <= limit else _TOO_LONG + p[:ECHO_CHARS] for p in parts]
            yield from parts
            carry, overlong = "", False
        if not overlong:
            carry += last
            if len(carry) > limit:
                carry, overlong = carry[:ECHO_CHARS], True
    if overlong:
        yield _TOO_LONG + carry
    elif carry:
        yield carry


def bounded_arguments(values: Iterable[str], limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """IDs given as arguments, cut like :func:`bounded_lines` cuts lines."""
    for v in values:
        yield v if len(v) <= limit else _TOO_LONG + v[:ECHO_CHARS]


def parse_loose(raw: str) -> int | None:
    """The integer on a line with spaces or a sign around its ASCII digits, or None (no exception:
    a million bad lines cost a million cheap checks, not a million raised errors)."""
    text = raw.strip()
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 4000:  # int() stops at 4300 digits
        return int(text)
    return None


def line_problem(raw: str) -> tuple[str, str]:
    """(text to show, problem) for a line that is not an integer: shown text is cut short."""
    text = raw.rstrip("\r\n")
    if text.startswith(_TOO_LONG):
        return text[1:] + "…", f"line longer than {MAX_LINE_CHARS} characters, not an ID"
    shown = text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"
    if not text.strip():
        return shown, "empty line"
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not text.isascii() and digits.isdecimal():
        return shown, "not an integer ID (digits must be ASCII 0-9)"
    return shown, "not an integer ID"


class _Utf8Reader:
    """``read(n)`` over a binary stream, decoding UTF-8 (bad bytes become U+FFFD, then a bad line)."""

    def __init__(self, raw: object):
        import codecs

        self.raw = raw
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self, size: int) -> str:
        while True:  # a chunk that ends inside a character decodes to "" without being the end
            data = self.raw.read(size)
            text = self.decoder.decode(data, final=not data)
            if text or not data:
                return text


def utf8_reader(stream: TextIO) -> object:
    """A reader for :func:`bounded_lines` over a text stream's bytes (the stream itself if it has none)."""
    raw = getattr(stream, "buffer", None)
    return _Utf8Reader(raw) if raw is not None else stream


class BadLines:
    """Bad input lines: counted, with the first :data:`KEEP_BAD` kept as (line number, text, problem)."""

    def __init__(self, keep: int = KEEP_BAD):
        self.keep = keep
        self.count = 0
        self.kept: list[tuple[int, str, str]] = []

    def __bool__(self) -> bool:
        return self.count > 0

    def append(self, item: tuple[int, str, str]) -> None:
        self.count += 1
        if len(self.kept) < self.keep:
            n, text, problem = item
            if len(text) > ECHO_CHARS:
                text = text[:ECHO_CHARS] + "…"
            self.kept.append((n, text, problem if len(problem) <= 200 else problem[:199] + "…"))

    def reject(self, n: int, raw: str) -> None:
        """Record line ``n`` that is not an integer at all."""
        self.count += 1
        if len(self.kept) < self.keep:
            text, problem = line_problem(raw)
            self.kept.append((n, text, problem))

    def __iter__(self):
        return iter(self.kept)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return self.count == len(other) and self.kept == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return self.count


class Decoder:
    """Decodes IDs of one layout; with a topology, adds schema and host and rejects unknown shards."""

    def __init__(
        self,
        layout: Layout,
        topology: Topology | None = None,
        *,
        table: str | None = None,
        lookup: Callable[[Any, int], int | None] | None = None,
    ):
        """``table``/``lookup``: where a pre-adoption ID's row is (``old_ids.describe``), when the
        topology has an ``adoption:`` section."""
        self.layout = layout
        self.topology = topology
        self._hosts = {n: h.name for h in topology.hosts for n in h.shards} if topology else {}
        self.adoption = topology.adoption if topology is not None else None
        self.table, self.lookup = table, lookup
        if self.adoption is not None and table is not None:
            old_ids.describe(topology, 0, table)  # BadInput now for a table not adopted

    def columns(self) -> list[str]:
        cols = ["id"]
        if self.layout.has_time:
            cols.append("time")
        cols += [f.name for f in self.layout.fields if f.name != "time"]
        if self.topology:
            cols += ["schema", "host"]
        if self.adoption is not None:
            cols.append("note")
        return cols

    def decode(self, value: int) -> dict:
        """Decode one ID; BadInput when it is not an ID of this fleet. A pre-adoption ID (below the
        adoption's ID floor) is said to be one: its bits name no shard (``old_ids.describe``)."""
        if self.adoption is not None and type(value) is int and self.adoption.is_old_id(value):
            return old_ids.describe(self.topology, value, self.table, self.lookup)
        out = self._decode(value)
        if self.adoption is not None:
            out["note"] = ""
        return out

    def _decode(self, value: int) -> dict:
        out = self.layout.decode(value)
        if self.topology is not None:
            shard = out["shard"]
            host = self._hosts.get(shard)
            if host is None:
                raise BadInput(
                    f"shard {shard} is not in this topology (0..{self.topology.shard_count - 1})"
                )
            out["schema"] = self.topology.schema_name(shard)
            out["host"] = host
        return out

    def parse(self, text: str) -> int:
        """One ID from text: ASCII decimal digits (optionally signed); BadInput otherwise."""
        stripped = text.strip()
        if not stripped:
            raise BadInput("empty line")
        digits = stripped[1:] if stripped[:1] in "+-" else stripped
        if not is_ascii_digits(digits) or len(digits) > 40:
            raise BadInput(line_problem(stripped)[1])
        return int(stripped, 10)

    def iter_decode(self, lines: Iterable[str], bad: BadLines) -> Iterator[dict]:
        """Decode line by line, yielding each good ID's parts; bad lines go to ``bad``."""
        decode = self.decode
        for number, raw in enumerate(lines, start=1):
            value = int(raw) if raw.isascii() and raw.isdigit() else parse_loose(raw)
            if value is None:
                bad.reject(number, raw)
                continue
            try:
                yield decode(value)
            except BadInput as exc:
                bad.append((number, raw.strip(), str(exc)))

    def decode_lines(self, lines: Iterable[str]) -> tuple[list[dict], BadLines]:
        """Decode every line into a list (for a few IDs; stream big inputs with :meth:`rows`)."""
        bad = BadLines()
        return list(self.iter_decode(lines, bad)), bad

    def write_csv(self, lines: Iterable[str], out: TextIO, bad: BadLines | None = None) -> BadLines:
        """Decode to CSV with a header. Returns the bad lines (counted; the first few kept)."""
        bad = BadLines() if bad is None else bad
        out.write(",".join(self.columns()) + "\n")
        out.writelines("".join(chunk) for chunk in self.rows(lines, "csv", bad))
        return bad

    def rows(self, lines: Iterable[str], form: str, bad: BadLines) -> Iterator[list]:
        """Decode line by line, yielding the rows of each chunk of lines as ``form`` says; bad lines go
        to ``bad``. ``csv``: CSV lines (with their newline, no header); ``json``: each ID's JSON object,
        as ``json.dumps(self.decode(id))`` writes it; ``cells``: a tuple of strings per ID, one per
        :meth:`columns` ("" for no value).

        The loop (:func:`_decoding_loop`) checks a chunk of lines at once and uses table lookups
        instead of format specs: about 1 µs per ID in CPython, against 10 for :meth:`iter_decode`.
        """
        if form not in _NO_OWNER:
            raise ValueError(f"form must be one of {', '.join(_NO_OWNER)}, got {form!r}")
        if self.adoption is not None:  # old and new IDs side by side: one by one
            return self._rows_one_by_one(lines, form, bad)
        owners = None
        if self.topology is not None:
            # shard → its row's schema and host (None if not in the fleet): one list index per ID
            size = (
                1 << self.layout.bits("shard")
                if _full_owner_table(self.layout)
                else max(self._hosts, default=-1) + 1
            )
            owners = [None] * size
            for n, host in self._hosts.items():
                owners[n] = _OWNER_FORMS[form](self.topology.schema_name(n), host)
        loop = _decoding_loop(self.layout, form, self.topology is not None)
        outside = f" is not in this topology (0..{self.topology.shard_count - 1})" if owners else ""
        return loop(lines, bad, owners, outside, self._slow_checks, _day_text)

    def _rows_one_by_one(self, lines: Iterable[str], form: str, bad: BadLines) -> Iterator[list]:
        """:meth:`rows` through :meth:`decode`, for a topology with an adoption (pre-adoption IDs)."""
        keys = self.columns()  # each a key of a decoded ID's document
        decoded = self.iter_decode(lines, bad)
        while chunk := list(islice(decoded, 8192)):
            if form == "json":
                yield [json.dumps(doc) for doc in chunk]
            else:
                cells = [tuple(_cell(doc.get(k)) for k in keys) for doc in chunk]
                yield cells if form == "cells" else [",".join(c) + "\n" for c in cells]

    def _slow_checks(self, value: int) -> tuple[int | None, str | None]:
        """For a negative or oversized value: (value to decode, None) or (None, problem)."""
        layout = self.layout
        if value < 0:
            if layout.negative_ids_possible() and value >= -(1 << 63):
                value += 1 << 64
            else:
                return None, layout.negative_message(value)
        if value > _MAX_U64:
            shown = value if value.bit_length() <= 200 else f"a number of {len(str(value))} digits"
            return None, f"{shown} does not fit in 64 bits"
        if value >> layout.payload_bits:
            return None, f"{value} has its reserved high bit(s) set"
        return value, None


def _cell(value: object) -> str:
    return "" if value is None else str(value)


_LOOPS: dict[tuple, object] = {}
_P3Z = [f"{i:03d}Z" for i in range(1000)]  # milliseconds and the zone, after the second's text
_BLANK = [""] * 1000  # no time text beyond year 9999
# Small tables stay in the CPU cache (a table of all 86400 seconds of a day mostly misses).
_HH = [f"{h:02d}:" for h in range(24)]
_MMSS = [f"{m:02d}:{sec:02d}" for m in range(60) for sec in range(60)]
_DAYS: dict[int, str] = {}


def _day_text(day: int) -> str:
    """``YYYY-MM-DD`` of a day number since 1970 (cached); "" beyond year 9999."""
    text = _DAYS.get(day)
    if text is None:
        moment = utc_from_ms(day * 86_400_000)
        text = iso(moment)[:10] if moment is not None else ""
        if len(_DAYS) > 200_000:
            _DAYS.clear()
        _DAYS[day] = text
    return text


def _full_owner_table(layout: Layout) -> bool:
    """Whether the shard → owner table covers every shard the layout's bits allow (no bounds check per ID)."""
    return layout.bits("shard") <= 20


def _row_form(layout: Layout, form: str):
    """``row(sid, first, text, second, third, owner)``: one ID's row in ``form``, from its signed
    value, its three fields (the first is the milliseconds since the epoch when the layout has time),
    its time text ("" beyond year 9999) and its owner's part of the row (``_OWNER_FORMS``)."""
    names = [f.name for f in layout.fields]
    epoch = layout.epoch_ms
    if form == "csv":
        if layout.has_time:
            return lambda sid, x0, text, x1, x2, owner: f"{sid},{text},{x1},{x2}{owner}\n"
        return lambda sid, x0, text, x1, x2, owner: f"{sid},{x0},{x1},{x2}{owner}\n"
    if form == "cells":
        if layout.has_time:
            return lambda sid, x0, text, x1, x2, owner: (f"{sid}", text, f"{x1}", f"{x2}", *owner)
        return lambda sid, x0, text, x1, x2, owner: (f"{sid}", f"{x0}", f"{x1}", f"{x2}", *owner)
    k0, k1, k2 = (json.dumps(n) for n in names)  # Layout.decode's keys, in its order
    if not layout.has_time:
        return lambda sid, x0, text, x1, x2, owner: (
            f'{{"id": {sid}, {k0}: {x0}, {k1}: {x1}, {k2}: {x2}{owner}}}'
        )

    def timed(sid: int, x0: int, text: str, x1: int, x2: int, owner: str) -> str:
        shown = f'"{text}"' if text else "null"
        return (
            f'{{"id": {sid}, "ms_since_epoch": {x0}, {k1}: {x1}, {k2}: {x2}, '
            f'"unix_ms": {x0 + epoch}, "time": {shown}{owner}}}'
        )

    return timed


# An owner's part of a row, and a row's part when there is no topology.
_OWNER_FORMS = {
    "csv": lambda schema, host: f",{schema},{host}",
    "json": lambda schema, host: f', "schema": {json.dumps(schema)}, "host": {json.dumps(host)}',
    "cells": lambda schema, host: (schema, host),
}
_NO_OWNER = {"csv": "", "json": "", "cells": ()}


def _decoding_loop(layout: Layout, form: str, with_topology: bool):
    """The decoding loop for ``layout``: its shifts, masks and epoch bound as locals of a closure (cached
    per layout shape and form).

    Plain Python, not source generated per layout and ``exec``'d with the constants baked in: that
    would be 7–13 % faster (300,000 IDs, 11 interleaved rounds; bench/results/decode-2026-11-25-0b042ab.json),
    less than the 10–15 % generated code has to gain to be kept (docs/performance.md, "Decoding IDs").
    """
    key = (layout.fields, layout.epoch_ms, layout.payload_bits, form, with_topology)
    cached = _LOOPS.get(key)
    if cached is not None:
        return cached
    names = [f.name for f in layout.fields]
    has_time = layout.has_time  # time is always the first (highest) field when there is one
    assert len(names) == 3 and (not has_time or names[0] == "time")
    (s0, m0), (s1, m1), (s2, m2) = ((layout.shift(n), (1 << layout.bits(n)) - 1) for n in names)
    ss, ms_ = (layout.shift("shard"), (1 << layout.bits("shard")) - 1) if with_topology else (0, 0)
    payload, epoch = layout.payload_bits, layout.epoch_ms
    # IDs from 2**63 on print as PostgreSQL's bigint shows them (only a 64-bit payload reaches there)
    signed_from = 1 << 63 if payload > 63 else 1 << 64
    HH, MMSS, days, P3Z, BLANK = _HH, _MMSS, _DAYS, _P3Z, _BLANK
    row, no_owner = _row_form(layout, form), _NO_OWNER[form]

    def loop(lines, bad, owners, outside, slow, day_text):
        reject = bad.reject
        it = iter(lines)
        n0 = 0
        last_s = None
        text = ""
        owner = no_owner
        # shards past the table are not in the fleet
        known = len(owners) if owners is not None else 0
        while True:
            chunk = list(islice(it, 8192))
            if not chunk:
                break
            joined = "".join(chunk)
            clean = joined.isascii() and joined.replace("\n", "").replace("\r", "").isdigit()
            raises = 0
            buf = []
            append = buf.append
            for n, raw in enumerate(chunk, n0 + 1):
                if clean:
                    try:
                        v = int(raw)
                    except ValueError:
                        raises += 1
                        clean = raises < _MAX_RAISES
                        reject(n, raw)
                        continue
                elif raw.isascii() and raw.rstrip().isdigit():
                    v = int(raw)
                else:
                    v = parse_loose(raw)
                    if v is None:
                        reject(n, raw)
                        continue
                if v >> payload:
                    v, problem = slow(v)
                    if problem:
                        bad.append((n, raw.strip(), problem))
                        continue
                if owners is not None:
                    shard = (v >> ss) & ms_
                    owner = owners[shard] if shard < known else None
                    if owner is None:
                        bad.append((n, raw.strip(), f"shard {shard}{outside}"))
                        continue
                x0 = (v >> s0) & m0
                if has_time:
                    s, ms = divmod(x0 + epoch, 1000)
                    if s != last_s:
                        last_s = s
                        d, sod = divmod(s, 86400)
                        day = days.get(d) or day_text(d)
                        h, mmss = divmod(sod, 3600)
                        second = f"{day}T{HH[h]}{MMSS[mmss]}." if day else ""
                        stamp = P3Z if day else BLANK
                    text = f"{second}{stamp[ms]}"
                sid = v if v < signed_from else v - 18446744073709551616
                append(row(sid, x0, text, (v >> s1) & m1, (v >> s2) & m2, owner))
            n0 += len(chunk)
            yield buf

    _LOOPS[key] = loop
    return loop
