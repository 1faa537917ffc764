"""ID layouts: the worked examples, limits, and every way encode/decode refuses input."""

from __future__ import annotations

import io
from datetime import date, datetime, timezone

import pytest

from shardctl.errors import BadInput, ConfigError
from shardctl.ids.decode import Decoder
from shardctl.model.layouts import (
    TWITTER_EPOCH_MS,
    by_name,
    custom,
    instagram,
    iso,
    parse_epoch,
    pinterest,
    snowflake,
)

BLOG_EPOCH_MS = 1293840000000  # 2011-01-01T00:00:00Z, the epoch of Instagram's post


# ---- the worked examples ---------------------------------------------------------------


def test_pinterest_worked_example():
    parts = pinterest().decode(241294492511762325)
    assert (parts["shard"], parts["type"], parts["local"]) == (3429, 1, 7075733)
    assert "time" not in parts  # Pinterest IDs carry no time
    assert pinterest().encode(shard=3429, type=1, local=7075733) == 241294492511762325


def test_instagram_worked_example():
    layout = instagram(parse_epoch("2011-01-01T00:00:00Z"))
    assert layout.epoch_ms == BLOG_EPOCH_MS
    shard, sequence = 31341 % 2000, 5001 % 1024
    assert (shard, sequence) == (1341, 905)
    value = layout.encode(time=1387263000, shard=shard, sequence=sequence)
    assert value == 1387263000 << 23 | 1341 << 10 | 905 == 11637205501278089
    parts = layout.decode(value)
    assert parts["ms_since_epoch"] == 1387263000
    assert parts["shard"] == 1341
    assert parts["sequence"] == 905
    assert parts["unix_ms"] == BLOG_EPOCH_MS + 1387263000
    assert parts["time"] == "2011-01-17T01:21:03.000Z"
    # by_name's default instagram epoch is the blog's
    assert by_name("instagram").encode(time=1387263000, shard=1341, sequence=905) == value


def test_instagram_encode_from_unix_ms():
    layout = instagram(BLOG_EPOCH_MS)
    assert (
        layout.encode(unix_ms=BLOG_EPOCH_MS + 1387263000, shard=1341, sequence=905)
        == 1387263000 << 23 | 1341 << 10 | 905
    )


def test_snowflake_twitter_epoch():
    # Wikipedia's "Snowflake ID" example: tweet 1541815603606036480.
    layout = snowflake()
    assert layout.epoch_ms == TWITTER_EPOCH_MS == 1288834974657
    parts = layout.decode(1541815603606036480)
    assert parts["ms_since_epoch"] == 367597485448
    assert parts["unix_ms"] == 1656432460105
    assert parts["time"] == "2022-06-28T16:07:40.105Z"
    assert (parts["worker"], parts["sequence"]) == (378, 0)
    assert layout.encode(time=367597485448, worker=378, sequence=0) == 1541815603606036480


def test_snowflake_other_epoch():
    layout = by_name("snowflake", 0)
    parts = layout.decode((1000 << 22) | (3 << 12) | 7)
    assert (parts["unix_ms"], parts["worker"], parts["sequence"]) == (1000, 3, 7)
    assert parts["time"] == "1970-01-01T00:00:01.000Z"


@pytest.mark.parametrize(
    "time_bits,shard_bits,sequence_bits", [(41, 12, 10), (40, 13, 10), (42, 10, 11), (1, 1, 61)]
)
def test_custom_layouts(time_bits, shard_bits, sequence_bits):
    layout = custom(BLOG_EPOCH_MS, time_bits, shard_bits, sequence_bits)
    assert layout.total_bits == 64 and layout.payload_bits == 63 and not layout.uses_sign_bit
    assert layout.shift("sequence") == 0
    assert layout.shift("shard") == sequence_bits
    assert layout.shift("time") == shard_bits + sequence_bits
    assert layout.max_shards == 1 << shard_bits
    assert layout.ids_per_ms_per_shard == 1 << sequence_bits
    time, shard, seq = (1 << time_bits) - 1, (1 << shard_bits) - 1, (1 << sequence_bits) - 1
    value = layout.encode(time=time, shard=shard, sequence=seq)
    assert value == (time << (shard_bits + sequence_bits)) | (shard << sequence_bits) | seq
    assert value < 1 << 63  # the sign bit stays 0
    parts = layout.decode(value)
    assert (parts["ms_since_epoch"], parts["shard"], parts["sequence"]) == (time, shard, seq)


def test_custom_12_bit_shards_example():
    layout = by_name("custom", BLOG_EPOCH_MS, {"time": 41, "shard": 12, "sequence": 10})
    assert layout.describe() == "1 reserved | 41 time | 12 shard | 10 sequence"
    value = layout.encode(time=1387263000, shard=1341, sequence=905)
    assert value == 1387263000 << 22 | 1341 << 10 | 905


@pytest.mark.parametrize(
    "bits,needle",
    [
        ({"time": 41, "shard": 13, "sequence": 10}, "sum to 63"),
        ({"time": 40, "shard": 12, "sequence": 10}, "sum to 63"),
        ({"time": 0, "shard": 53, "sequence": 10}, "bits.time"),
        ({"time": 41, "shard": -1, "sequence": 23}, "bits.shard"),
        ({"time": 41.0, "shard": 12, "sequence": 10}, "bits.time"),
        ({"time": True, "shard": 52, "sequence": 10}, "bits.time"),
    ],
)
def test_custom_bits_must_sum_to_63(bits, needle):
    with pytest.raises(ConfigError, match=needle):
        by_name("custom", 0, bits)


def test_unknown_layout_and_custom_without_bits():
    with pytest.raises(BadInput, match="unknown layout"):
        by_name("twitter")
    with pytest.raises(BadInput, match="bit widths"):
        by_name("custom", 0)


# ---- limits ---------------------------------------------------------------------------


def test_instagram_limits_name_the_dates():
    limits = instagram(BLOG_EPOCH_MS).limits()
    assert limits == {
        "total_bits": 64,
        "max_shards": 8192,
        "ids_per_ms_per_shard": 1024,
        # 2**40 ms after the epoch the top bit is set; 2**41 ms after, the time field overflows
        "negative_at": "2045-11-03T19:53:47.776Z",
        "overflow_at": "2080-09-06T15:47:35.552Z",
    }
    assert instagram(BLOG_EPOCH_MS).uses_sign_bit


def test_63_bit_layouts_never_turn_negative():
    layout = custom(BLOG_EPOCH_MS, 41, 12, 10)
    assert layout.negative_at is None
    assert layout.limits()["negative_at"] is None
    assert layout.limits()["overflow_at"] == "2080-09-06T15:47:35.552Z"
    assert pinterest().limits()["overflow_at"] is None
    assert pinterest().ids_per_ms_per_shard is None
    assert pinterest().max_shards == 65536


# ---- refusing bad IDs and parts --------------------------------------------------------


@pytest.mark.parametrize(
    "value,needle",
    [
        (-1, "negative"),
        (1 << 64, "does not fit in 64 bits"),
        ((1 << 64) + 5, "does not fit in 64 bits"),
        ("123", "must be an integer"),
        (1.0, "must be an integer"),
        (True, "must be an integer"),
    ],
)
def test_decode_refuses(value, needle):
    with pytest.raises(BadInput, match=needle):
        instagram(BLOG_EPOCH_MS).decode(value)


@pytest.mark.parametrize("layout", [pinterest(), snowflake(), custom(0, 41, 12, 10)])
def test_decode_refuses_reserved_bits(layout):
    with pytest.raises(BadInput, match="reserved"):
        layout.decode(1 << 63)


def test_negative_ids_before_and_after_the_sign_bit_date():
    # Epoch 2011: the sign bit is first used in 2045, so a negative value is not an ID yet.
    with pytest.raises(BadInput, match="stay positive until 2045-11-03T19:53:47.776Z"):
        instagram(BLOG_EPOCH_MS).decode(-5)
    # Epoch 1970: 2**40 ms later (2004) IDs became negative bigints; they decode as unsigned.
    old = instagram(0)
    value = old.encode(time=(1 << 40) + 7, shard=3, sequence=9)
    signed = value - (1 << 64)
    assert signed < 0
    for form in (value, signed):
        parts = old.decode(form)
        assert (parts["ms_since_epoch"], parts["shard"], parts["sequence"]) == ((1 << 40) + 7, 3, 9)
        assert parts["id"] == signed  # reported as the bigint PostgreSQL stores
    with pytest.raises(BadInput, match="never negative"):
        custom(0, 41, 12, 10).decode(-1)


@pytest.mark.parametrize(
    "parts,needle",
    [
        (
            {"time": 1 << 41, "shard": 0, "sequence": 0},
            "time 2199023255552 does not fit in 41 bits",
        ),
        ({"time": 0, "shard": 8192, "sequence": 0}, "shard 8192 does not fit in 13 bits"),
        ({"time": 0, "shard": 0, "sequence": 1024}, "sequence 1024 does not fit in 10 bits"),
        ({"time": -1}, "time -1 does not fit"),
        ({"unix_ms": BLOG_EPOCH_MS - 1}, "time -1 does not fit"),
        ({"shard": "1"}, "shard must be an integer"),
        ({"shard": True}, "shard must be an integer"),
        ({"worker": 1}, "has no field worker"),
    ],
)
def test_encode_refuses(parts, needle):
    with pytest.raises(BadInput, match=needle):
        instagram(BLOG_EPOCH_MS).encode(**parts)


def test_encode_unix_ms_needs_a_time_field():
    with pytest.raises(BadInput, match="no time field"):
        pinterest().encode(unix_ms=5)


def test_wide_time_fields_beyond_year_9999_still_decode():
    layout = custom(0, 60, 2, 1)
    value = layout.encode(time=(1 << 60) - 1, shard=3, sequence=1)
    parts = layout.decode(value)
    assert parts["ms_since_epoch"] == (1 << 60) - 1 and parts["shard"] == 3
    assert parts["time"] is None  # no calendar date that far out
    out = io.StringIO()
    assert Decoder(layout).write_csv([str(value)], out) == []
    assert out.getvalue().splitlines()[1] == f"{value},,3,1"


# ---- epochs and timestamps ----------------------------------------------------------------


@pytest.mark.parametrize(
    "value,expected",
    [
        ("2011-01-01T00:00:00Z", BLOG_EPOCH_MS),
        ("2011-01-01T00:00:00z", BLOG_EPOCH_MS),
        ("2011-01-01T00:00:00+00:00", BLOG_EPOCH_MS),
        ("2011-01-01T01:00:00+01:00", BLOG_EPOCH_MS),
        ("2011-01-01T00:00:00", BLOG_EPOCH_MS),  # no offset: UTC
        ("2011-01-01T00:00:00.250Z", BLOG_EPOCH_MS + 250),
        ("2011-01-01", BLOG_EPOCH_MS),
        (" 1293840000000 ", BLOG_EPOCH_MS),
        (1288834974657, TWITTER_EPOCH_MS),
        (datetime(2011, 1, 1, tzinfo=timezone.utc), BLOG_EPOCH_MS),
        (date(2011, 1, 1), BLOG_EPOCH_MS),  # YAML reads an unquoted date as a date
    ],
)
def test_parse_epoch(value, expected):
    assert parse_epoch(value) == expected


@pytest.mark.parametrize("value", ["yesterday", "", "2011-13-01", True, 1.5, None, [2011]])
def test_parse_epoch_refuses(value):
    with pytest.raises(ValueError):
        parse_epoch(value)


def test_iso_format():
    assert (
        iso(datetime(2013, 12, 17, 2, 50, 0, 123456, tzinfo=timezone.utc))
        == "2013-12-17T02:50:00.123Z"
    )
    assert iso(datetime(5, 1, 2, tzinfo=timezone.utc)) == "0005-01-02T00:00:00.000Z"
    assert iso(None) is None


# ---- the bulk decoder ------------------------------------------------------------------------


def test_decoder_lines_and_csv_agree():
    layout = instagram(BLOG_EPOCH_MS)
    good = [
        layout.encode(time=t, shard=s, sequence=q)
        for t, s, q in [(0, 0, 0), (1387263000, 1341, 905), ((1 << 40) - 1, 8191, 1023)]
    ]
    lines = [
        f"{good[0]}\n",
        "abc\n",
        f"{good[1]}\r\n",
        "\n",
        "-1\n",
        f"{1 << 64}\n",
        f"{good[2]}\n",
    ]
    decoder = Decoder(layout)
    results, bad = decoder.decode_lines(lines)
    assert [r["id"] for r in results] == good
    assert [(n, p.split(":")[0]) for n, _, p in bad] == [
        (2, "not an integer ID"),
        (4, "empty line"),
        (5, "-1 is negative; instagram IDs stay positive until 2045-11-03T19"),
        (6, f"{1 << 64} does not fit in 64 bits"),
    ]
    out = io.StringIO()
    csv_bad = decoder.write_csv(lines, out)
    assert [n for n, _, _ in csv_bad] == [2, 4, 5, 6]
    rows = out.getvalue().splitlines()
    assert rows[0] == "id,time,shard,sequence"
    expected = [f"{r['id']},{r['time']},{r['shard']},{r['sequence']}" for r in results]
    assert rows[1:] == expected
