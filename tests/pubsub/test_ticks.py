"""pubsub.ticks: periodic loops share whole seconds of the loop clock, never later than asked."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsub.ticks import TICK_S, next_run, sleep_to_next_run


@given(
    now=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    period=st.floats(min_value=0.01, max_value=120, allow_nan=False),
)
def test_a_run_comes_after_now_and_never_later_than_the_period(now: float, period: float) -> None:
    at = next_run(now, period)
    assert now < at <= now + period + 1e-6
    if period >= TICK_S:
        assert at > now + period - TICK_S - 1e-6  # at most one tick early


def test_loops_of_different_periods_wake_on_the_same_whole_seconds() -> None:
    assert next_run(10.3, 1.0) == 11.0
    assert next_run(10.3, 2.0) == 12.0
    assert next_run(10.3, 2.5) == 12.0
    assert next_run(10.3, 10 / 3) == 13.0
    assert next_run(11.0, 1.0) == 12.0  # a run on a tick: the next one, a whole period on
    assert next_run(10.3, 0.2) == pytest.approx(10.4)  # under a second: its own grid


async def test_the_sleep_ends_on_the_tick() -> None:
    loop = asyncio.get_running_loop()
    expected = next_run(loop.time(), 0.25)
    await sleep_to_next_run(0.25)
    assert loop.time() >= expected - 0.002
