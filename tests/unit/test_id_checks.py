"""shardctl.ids.checks: verify's ID checks as pure functions (no database)."""

from __future__ import annotations

from shardctl.ids.checks import duplicate, sample_problems, sequence_problems, time_goes_back
from shardctl.model.layouts import custom, instagram, pinterest

EPOCH = 1_577_836_800_000  # 2020-01-01
LAYOUT = instagram(EPOCH)


def ids(shard: int, *pairs: tuple[int, int]) -> list[int]:
    """IDs of ``shard`` from (ms since epoch, sequence) pairs."""
    return [LAYOUT.encode(time=t, shard=shard, sequence=q) for t, q in pairs]


def host_ms(ms: int) -> int:
    return EPOCH + ms


def test_a_wrap_within_one_millisecond_is_not_a_fault():
    sample = ids(7, (1000, 1021), (1000, 1022), (1000, 1023), (1000, 0), (1000, 1), (1001, 2))
    assert sample[3] < sample[2]  # the old "strictly increase" check failed here
    assert sample_problems(LAYOUT, 7, sample, host_ms(1001), 5000) == []


def test_a_duplicate_is_a_fault():
    sample = ids(7, (1000, 1), (1000, 2), (1000, 1))
    (problem,) = sample_problems(LAYOUT, 7, sample, host_ms(1000), 5000)
    assert f"returned {sample[0]} twice" in problem and "do not strictly increase" in problem
    assert duplicate(sample) == sample[0] and duplicate(sample[:2]) is None


def test_time_going_back_is_a_fault():
    sample = ids(7, (1000, 1), (999, 2))
    (problem,) = sample_problems(LAYOUT, 7, sample, host_ms(1000), 5000)
    assert "across milliseconds" in problem
    assert time_goes_back(LAYOUT, sample) == (sample[0], sample[1])


def test_wrong_shard_bits():
    sample = ids(6, (1000, 1), (1000, 2))
    (problem,) = sample_problems(LAYOUT, 5, sample, host_ms(1000), 5000)
    assert problem.startswith("next_id() mints IDs for shard 6, not 5")


def test_time_far_from_the_host_clock():
    sample = ids(7, (1000, 1), (1000, 2))
    (problem,) = sample_problems(LAYOUT, 7, sample, host_ms(1000 + 86_400_000), 5000)
    assert "-86400000 ms from the host clock" in problem and "wrong epoch?" in problem


def test_signed_ids_after_the_sign_bit_date_compare_as_unsigned():
    layout = instagram(0)  # epoch 1970: its IDs are already negative bigints
    base = 1 << 40
    raw = [
        layout.encode(time=base + t, shard=1, sequence=q) for t, q in ((0, 1023), (0, 0), (1, 1))
    ]
    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in raw]
    assert all(v < 0 for v in signed)
    assert time_goes_back(layout, signed) is None and duplicate(signed) is None


def test_layouts_without_time_check_only_duplicates_and_shards():
    layout = pinterest()
    sample = [layout.encode(shard=3, type=1, local=n) for n in (5, 6, 2)]
    assert sample_problems(layout, 3, sample, 0, 5000) == []


def test_custom_layout_with_two_sequence_bits():
    layout = custom(EPOCH, 41, 20, 2)
    sample = [layout.encode(time=10, shard=3, sequence=q) for q in (0, 1, 2, 3, 0)]
    (problem,) = sample_problems(layout, 3, sample, host_ms(10), 5000)
    assert "more than 4 IDs in one millisecond" in problem


def test_sequence_settings():
    assert sequence_problems({"cache_size": 1, "increment_by": 1}) == []
    assert sequence_problems({"cache_size": 20, "increment_by": 1}) == [
        (
            "ID sequence has CACHE 20, not 1 (backends would take blocks of values and can mint the same ID "
            "in one millisecond)"
        )
    ]
    assert sequence_problems({"cache_size": 1, "increment_by": -1}) == [
        "ID sequence has INCREMENT BY -1, not 1"
    ]
