"""The move's one wait (ops/move/transfer.wait_for): returns what ``ready`` returned once true,
raises what ``timed_out`` builds past the deadline, with pauses that double up to the cap."""

from __future__ import annotations

import time

import pytest

from shardctl.errors import WaitTimeout
from shardctl.ops.move import transfer


def test_returns_the_first_true_answer() -> None:
    answers = iter([None, 0, "", "ready"])
    assert transfer.wait_for(lambda: next(answers), time.monotonic() + 5, RuntimeError) == "ready"


def test_raises_past_the_deadline_after_doubling_pauses() -> None:
    calls: list[float] = []

    def never() -> bool:
        calls.append(time.monotonic())
        return False

    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="gave up"):
        transfer.wait_for(never, started + 0.3, lambda: WaitTimeout("gave up"), cap=0.05)
    assert calls[-1] > started + 0.3  # looked once more past the deadline before giving up
    # pauses of 1, 2, 4, 8, 16 ms, then the cap: at most ~12 looks in 0.3 s, however idle the machine
    assert 2 <= len(calls) <= 12
