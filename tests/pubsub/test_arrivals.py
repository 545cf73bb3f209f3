"""When queued lines were received: marks per socket read, observed per apply, weighted by the lines
each mark covers; and on a real handler, the received -> applied and applied -> woken histograms."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.arrivals import Arrivals
from pubsub.handler import ReplicationHandler
from pubsub.histograms import HistogramChild
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import Stream, StreamRegistry
from tests.pubsub.fakes import MemoryTable, Row, memory_stream


def test_each_mark_is_observed_once_weighted_by_the_entries_it_covers() -> None:
    arrivals, child = Arrivals(), HistogramChild((1.0, 2.0, 5.0))
    arrivals.mark(3, 10.0)  # entries 1-3 read at t=10
    arrivals.mark(3, 11.0)  # nothing new: ignored
    arrivals.mark(5, 12.0)  # entries 4-5 at t=12
    arrivals.taken = 4
    arrivals.observe(2, 4, 13.0, child)  # entry 1 was a POSITION, not timed
    assert child.counts == [1, 0, 2, 0]  # entry 4 waited 1 s, entries 2-3 waited 3 s
    assert child.sum == 1.0 + 2 * 3.0
    arrivals.taken = 5
    arrivals.observe(5, 5, 12.5, child)
    assert child.counts == [2, 0, 2, 0] and arrivals.taken == 5
    arrivals.mark(7, 20.0)
    arrivals.taken = 7
    arrivals.prune()  # taken without an apply (duplicates): forgotten, never observed
    arrivals.observe(6, 7, 30.0, child)
    assert sum(child.counts) == 4


def test_an_overflow_forgets_the_marks_and_keeps_counting() -> None:
    arrivals, child = Arrivals(), HistogramChild((1.0,))
    arrivals.mark(4, 1.0)
    arrivals.taken = 1
    arrivals.dropped(3)
    assert arrivals.taken == 4
    arrivals.mark(5, 2.0)
    arrivals.taken = 5
    arrivals.observe(5, 5, 2.5, child)
    assert child.counts == [1, 0] and child.sum == 0.5


async def test_a_handler_times_live_rows_from_their_read_and_applies_to_their_listeners() -> None:
    """Rows read while the previous apply runs wait for it: their received -> applied time includes
    that wait. Rows fetched by a catch-up were never received live and are not timed. The bounds
    come from clock readings around each step, so they hold however slow the machine is."""
    table = MemoryTable()
    table.add("w1", 1, Row(payload="caught-up"))
    token_2_applied: list[float] = []
    applying_2 = asyncio.Event()

    async def apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Any]]) -> None:
        if token == 2:
            applying_2.set()
            await asyncio.sleep(0.2)
            token_2_applied.append(time.monotonic())

    metrics = ReplicationMetrics()
    streams = StreamRegistry([memory_stream("s", ["w1"], table)])
    handler = ReplicationHandler("me", streams, apply, metrics=metrics)
    handler.position_listeners.append(lambda *_: None)
    handler.start()
    try:
        start = time.monotonic()
        handler.handle_lines([b"POSITION s w1 1 1"], 0.0)
        await _settle()
        handler.handle_lines([_rd(2, prev=1)], 0.0)
        read_2 = time.monotonic()  # token 2 was received before this
        await asyncio.wait_for(applying_2.wait(), 10)  # these two queue behind token 2's apply
        handler.handle_lines([_rd(3, prev=2), _rd(4, prev=3)], 0.0)
        read_3_4 = time.monotonic()
        for _ in range(500):
            await asyncio.sleep(0.01)
            if handler.streams["s"].current_token("w1") == 4:
                break
        end = time.monotonic()
    finally:
        await handler.stop()
    received = {"stream": "s"}
    assert handler.streams["s"].current_token("w1") == 4
    assert metrics.value("fanout_repl_received_to_applied_seconds_count", received) == 3
    waited = metrics.value("fanout_repl_received_to_applied_seconds_sum", received)
    applied_2 = token_2_applied[0]
    # Token 2 waited for its own apply; 3 and 4 were received before `read_3_4` and applied after 2.
    assert (applied_2 - read_2) + 2 * (applied_2 - read_3_4) <= waited <= 3 * (end - start)
    # Three applies with rows: the catch-up's, token 2's, and tokens 3-4 together.
    assert metrics.value("fanout_repl_applied_to_woken_seconds_count", received) == 3
    assert metrics.value("fanout_repl_applied_to_woken_seconds_sum", received) <= 3 * (end - start)


def _rd(token: int, prev: int) -> bytes:
    return f"RDATA s w1 {token} {json.dumps([prev, 1, 'x', 0])}".encode()


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6), st.booleans()), max_size=30))
def test_every_applied_entry_is_observed_once_with_its_own_reads_time(
    steps: list[tuple[int, int, bool]],
) -> None:
    """Against a model that remembers each entry's read time: reads of `n` entries, then runs of
    `k` entries taken and applied together (or taken and dropped unapplied, as duplicates are)."""
    arrivals, child = Arrivals(), HistogramChild(tuple(float(b) for b in range(1, 200)))
    read_at: list[float] = []  # entry ordinal - 1 -> its read's time
    expected: list[float] = []
    clock = 0.0
    for n, k, applied in steps:
        clock += 1.0
        read_at += [clock] * n
        arrivals.mark(len(read_at), clock)
        k = min(k, len(read_at) - arrivals.taken)
        if k == 0:
            continue
        clock += 0.5
        first = arrivals.taken + 1
        arrivals.taken += k
        if applied:
            arrivals.observe(first, arrivals.taken, clock, child)
            expected += [clock - read_at[i - 1] for i in range(first, arrivals.taken + 1)]
        arrivals.prune()
    model = HistogramChild(child.bounds)
    for wait in expected:
        model.observe(wait)
    assert child.counts == model.counts and child.sum == pytest.approx(model.sum)
