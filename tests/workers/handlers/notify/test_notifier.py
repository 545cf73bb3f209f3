"""workers.handlers.notify.notifier: only the concerned long-polls wake; their timeouts end on a grid."""

from __future__ import annotations

import asyncio

from workers.handlers.notify.notifier import GRID_FROM_S, TIMEOUT_GRID_S, Notifier, poll_deadline


def _in(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_notifier_wakes_only_concerned_waiters() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a, notifier.waiter("@b", frozenset({"!r2"})) as b:
        assert notifier.notify({"!r1"}, set()) == 1
        assert a.woken and not b.woken
        assert notifier.notify(set(), {"@b"}) == 1
        assert await b.wait(_in(0.01))
    assert notifier.waiting == 0


async def test_a_waiter_times_out_or_is_woken_while_waiting() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a:
        assert not await a.wait(_in(0.01))
        waiting = asyncio.create_task(a.wait(_in(5)))
        await asyncio.sleep(0)
        notifier.notify({"!r1"}, set())
        assert await asyncio.wait_for(waiting, 1) and a.woken_at > 0


def test_a_long_timeout_ends_on_the_grid_at_most_one_tick_early() -> None:
    for start in (100.0, 100.004, 100.0999, 1234.5678, 98765.43):
        for timeout in (GRID_FROM_S, 1.05, 30.0, 60.0):
            end = poll_deadline(start, timeout)
            assert start + timeout - TIMEOUT_GRID_S < end <= start + timeout
            assert poll_deadline(end - timeout + 0.001, timeout) == end  # the tick's other polls


def test_polls_timing_out_within_one_tick_share_their_end_and_a_short_one_is_exact() -> None:
    assert poll_deadline(500.01, 30) == poll_deadline(500.07, 30) == 530.0
    assert poll_deadline(500.01, 0.5) == 500.51
    assert poll_deadline(500.01, 0) == 500.01


async def test_waiters_whose_timeouts_share_a_tick_time_out_in_one_loop_turn() -> None:
    notifier = Notifier()
    loop = asyncio.get_running_loop()
    turns = 0

    def count() -> None:
        nonlocal turns
        turns += 1
        loop.call_soon(count)

    with notifier.waiter("@a", frozenset()) as a, notifier.waiter("@b", frozenset()) as b:
        end = poll_deadline(loop.time(), GRID_FROM_S)
        first = asyncio.create_task(a.wait(end))
        await asyncio.sleep(0.03)  # the second poll starts later, in the same tick
        second = asyncio.create_task(b.wait(end))
        await asyncio.sleep(0)
        loop.call_soon(count)
        assert not await first
        at_first = turns
        assert not await second
        assert turns - at_first <= 1
