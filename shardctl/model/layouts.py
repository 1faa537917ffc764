"""ID layouts: how the 64 bits of an ID are split, with encode/decode and limits."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from ..errors import BadInput, ConfigError
from .numbers import echo, parse_int

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TWITTER_EPOCH_MS = 1288834974657
INSTAGRAM_BLOG_EPOCH = "2011-01-01T00:00:00Z"


@dataclass(frozen=True)
class Field:
    name: str
    bits: int


@dataclass(frozen=True)
class Layout:
    """A split of the 64 ID bits into named fields, highest bits first.

    ``reserved`` high bits must be zero. A ``time`` field counts milliseconds
    since ``epoch_ms`` (Unix milliseconds). ``shard`` names the shard field.
    """

    name: str
    fields: tuple[Field, ...]
    epoch_ms: int = 0
    reserved: int = 0

    # ---- structure -------------------------------------------------------
    @property
    def total_bits(self) -> int:
        return self.reserved + sum(f.bits for f in self.fields)

    def bits(self, name: str) -> int:
        for f in self.fields:
            if f.name == name:
                return f.bits
        return 0

    def shift(self, name: str) -> int:
        """Bit position of the lowest bit of field ``name``."""
        s = 0
        for f in reversed(self.fields):
            if f.name == name:
                return s
            s += f.bits
        raise KeyError(name)

    @property
    def has_time(self) -> bool:
        return self.bits("time") > 0

    @property
    def uses_sign_bit(self) -> bool:
        """True for the seed-faithful 64-bit Instagram split (41+13+10)."""
        return self.total_bits == 64 and self.reserved == 0 and self.has_time

    @property
    def payload_bits(self) -> int:
        return sum(f.bits for f in self.fields)

    @property
    def epoch(self) -> datetime:
        return UNIX_EPOCH + timedelta(milliseconds=self.epoch_ms)

    # ---- limits ----------------------------------------------------------
    @property
    def max_shards(self) -> int:
        return 1 << self.bits("shard")

    @property
    def ids_per_ms_per_shard(self) -> int | None:
        seq = self.bits("sequence")
        return (1 << seq) if self.has_time and seq else None

    @property
    def overflow_at(self) -> datetime | None:
        """First instant whose milliseconds no longer fit the time field."""
        if not self.has_time:
            return None
        return self._after_epoch(1 << self.bits("time"))

    @property
    def negative_at(self) -> datetime | None:
        """For a split that uses the sign bit: first instant whose IDs are negative bigints."""
        if not self.uses_sign_bit:
            return None
        return self._after_epoch(1 << (self.bits("time") - 1))

    def _after_epoch(self, ms: int) -> datetime | None:
        try:
            return self.epoch + timedelta(milliseconds=ms)
        except OverflowError:
            return None

    def negative_ids_possible(self, now: datetime | None = None) -> bool:
        """Negative bigints are real IDs only for the 64-bit split, once its sign-bit date has passed."""
        moment = self.negative_at
        return moment is not None and (now or datetime.now(timezone.utc)) >= moment

    def negative_message(self, value: int) -> str:
        if self.negative_at is not None:
            return (
                f"{value} is negative; {self.name} IDs stay positive until {iso(self.negative_at)}"
            )
        return f"{value} is negative; {self.name} IDs are never negative"

    def limits(self) -> dict:
        return {
            "total_bits": self.total_bits,
            "max_shards": self.max_shards,
            "ids_per_ms_per_shard": self.ids_per_ms_per_shard,
            "overflow_at": iso(self.overflow_at),
            "negative_at": iso(self.negative_at),
        }

    def describe(self) -> str:
        parts = ([f"{self.reserved} reserved"] if self.reserved else []) + [
            f"{f.bits} {f.name}" for f in self.fields
        ]
        return " | ".join(parts)

    # ---- encode / decode -------------------------------------------------
    def encode(self, **parts: int) -> int:
        """Build an ID from its parts. ``time`` is milliseconds since the layout's epoch;
        ``unix_ms`` may be given instead."""
        if "unix_ms" in parts:
            if not self.has_time:
                raise BadInput(f"layout {self.name} has no time field")
            parts["time"] = parts.pop("unix_ms") - self.epoch_ms
        names = {f.name for f in self.fields}
        unknown = set(parts) - names
        if unknown:
            raise BadInput(
                f"layout {self.name} has no field {', '.join(sorted(unknown))}"
                f" (fields: {', '.join(f.name for f in self.fields)})"
            )
        value = 0
        for f in self.fields:
            part = parts.get(f.name, 0)
            if not isinstance(part, int) or isinstance(part, bool):
                raise BadInput(f"{f.name} must be an integer, got {part!r}")
            if part < 0 or part >= (1 << f.bits):
                raise BadInput(
                    f"{f.name} {part} does not fit in {f.bits} bits (0..{(1 << f.bits) - 1})"
                )
            value = (value << f.bits) | part
        return value

    def decode(self, id_value: int) -> dict:
        """Split an ID into its parts; adds ``time`` as UTC ISO-8601 for timed layouts.

        Negative values are accepted as the signed bigint form of the 64-bit split.
        """
        id_value = self._unsigned(id_value)
        out: dict = {"id": id_value if id_value < (1 << 63) else id_value - (1 << 64)}
        shift = 0
        values = {}
        for f in reversed(self.fields):
            values[f.name] = (id_value >> shift) & ((1 << f.bits) - 1)
            shift += f.bits
        for f in self.fields:
            out[f.name if f.name != "time" else "ms_since_epoch"] = values[f.name]
        if self.has_time:
            unix_ms = self.epoch_ms + values["time"]
            out["unix_ms"] = unix_ms
            out["time"] = iso(utc_from_ms(unix_ms))
        return out

    def shard_of(self, id_value: int) -> int:
        """The shard inside an ID, checked as :meth:`decode` checks it (the Router's routing by ID: no
        other field is decoded)."""
        shift, mask, payload = self._shard_field
        if type(id_value) is int and 0 <= id_value and not id_value >> payload:
            return (id_value >> shift) & mask  # what _unsigned passes through as it is
        return (self._unsigned(id_value) >> shift) & mask

    @functools.cached_property
    def _shard_field(self) -> tuple[int, int, int]:
        """(shift, mask) of the shard field and the payload bits: :meth:`shard_of` runs on every call
        an ORM routes by ID, so it does not walk the fields each time."""
        return self.shift("shard"), (1 << self.bits("shard")) - 1, self.payload_bits

    def _unsigned(self, id_value: int) -> int:
        """``id_value`` as the unsigned 64-bit number, or BadInput when it is not an ID of this layout."""
        if isinstance(id_value, bool) or not isinstance(id_value, int):
            raise BadInput(f"an ID must be an integer, got {id_value!r}")
        if id_value < 0:
            if self.negative_ids_possible() and id_value >= -(1 << 63):
                id_value += 1 << 64
            else:
                raise BadInput(self.negative_message(id_value))
        if id_value >= 1 << 64:
            raise BadInput(f"{id_value} does not fit in 64 bits")
        if id_value >> self.payload_bits:
            raise BadInput(f"{id_value} has its reserved high bit(s) set; not a {self.name} ID")
        return id_value


def utc_from_ms(unix_ms: int) -> datetime | None:
    """The UTC instant ``unix_ms`` after 1970, or None beyond what ``datetime`` can hold (years 1..9999).

    Wide custom time fields (or a far ``--epoch``) reach past year 9999; such IDs still decode.
    """
    try:
        return UNIX_EPOCH + timedelta(milliseconds=unix_ms)
    except OverflowError:
        return None


def iso(moment: datetime | None) -> str | None:
    """UTC ISO-8601 with milliseconds, e.g. ``2013-12-17T02:50:00.000Z``."""
    if moment is None:
        return None
    m = moment.astimezone(timezone.utc)
    # Not strftime: its %Y does not zero-pad years before 1000 on every platform.
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}."
        f"{m.microsecond // 1000:03d}Z"
    )


def parse_epoch(value: object) -> int:
    """Parse an epoch (ISO-8601 string, datetime, or Unix milliseconds) to Unix ms."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {echo(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):  # YAML reads an unquoted 2026-01-01 as a date: midnight UTC
        moment = datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    elif isinstance(value, str):
        text = value.strip()
        if text.lstrip("-") and text.lstrip("-").isdigit():
            return parse_int(text, signed=True)  # ValueError for non-ASCII digits such as ١٢٣
        if not text.isascii():
            raise ValueError(f"not an ISO-8601 timestamp: {echo(value)} (only ASCII characters)")
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not an ISO-8601 timestamp: {echo(value)}") from None
    else:
        raise ValueError(f"not a timestamp: {echo(value)}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - UNIX_EPOCH
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def instagram(epoch_ms: int) -> Layout:
    return Layout(
        "instagram", (Field("time", 41), Field("shard", 13), Field("sequence", 10)), epoch_ms
    )


def pinterest() -> Layout:
    return Layout(
        "pinterest", (Field("shard", 16), Field("type", 10), Field("local", 36)), 0, reserved=2
    )


def snowflake(epoch_ms: int = TWITTER_EPOCH_MS) -> Layout:
    return Layout(
        "snowflake",
        (Field("time", 41), Field("worker", 10), Field("sequence", 12)),
        epoch_ms,
        reserved=1,
    )


def custom(epoch_ms: int, time: int, shard: int, sequence: int) -> Layout:
    for name, value in (("time", time), ("shard", shard), ("sequence", sequence)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"custom layout: bits.{name} must be a positive integer, got {value!r}"
            )
    total = time + shard + sequence
    if total != 63:
        raise ConfigError(
            f"custom layout: bit widths must sum to 63 (the sign bit stays 0), "
            f"got {time}+{shard}+{sequence} = {total}"
        )
    return Layout(
        "custom",
        (Field("time", time), Field("shard", shard), Field("sequence", sequence)),
        epoch_ms,
        reserved=1,
    )


# The split ``sandbox up`` and ``demo`` write (a custom layout): Instagram's 41 time and 13 shard bits,
# one sequence bit given up so the sign bit stays 0. 8192 shards, 512 IDs per ms per shard, and IDs
# that stay positive until they overflow (2095 from a 2026 epoch): a fleet made for trying shardctl
# warns about nothing.
SIGNLESS_INSTAGRAM_BITS = {"time": 41, "shard": 13, "sequence": 9}

LAYOUT_NAMES = ("instagram", "pinterest", "snowflake", "custom")
# Layouts whose IDs shardctl can mint with next_id(); the others are decode-only.
MINTABLE = ("instagram", "custom")


def by_name(name: str, epoch_ms: int | None = None, bits: dict | None = None) -> Layout:
    """Build a layout by name; ``epoch_ms`` None means the layout's customary epoch."""
    if name == "instagram":
        return instagram(parse_epoch(INSTAGRAM_BLOG_EPOCH) if epoch_ms is None else epoch_ms)
    if name == "pinterest":
        return pinterest()
    if name == "snowflake":
        return snowflake(TWITTER_EPOCH_MS if epoch_ms is None else epoch_ms)
    if name == "custom":
        if not bits:
            raise BadInput("layout custom needs bit widths, e.g. time=41,shard=12,sequence=10")
        return custom(epoch_ms or 0, bits.get("time"), bits.get("shard"), bits.get("sequence"))
    raise BadInput(f"unknown layout {name!r} (choose from {', '.join(LAYOUT_NAMES)})")
