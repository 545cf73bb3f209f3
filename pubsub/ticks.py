"""Periodic work on one clock: every loop that repeats every second or more wakes on whole seconds
of the event loop's clock (CLOCK_MONOTONIC, shared by the processes of a machine).

Each worker runs a handful of such loops (positions and keep-alives, the subscriber's watchdog,
the silent-writer log, the previous-release check, the database probe, the presence keep-alive,
the instance lease). Each sleeping its own interval from its own start, they woke the process
about ten times a second at rest; on a small virtual machine a wake-up costs more than the work
most of them do. Ending every such sleep on the same whole seconds makes them run in the same
loop turns: an idle worker's context switches fell from 9.5-10.3 to 3.2-3.5 a second
(docs/performance.md, "A quiet second").

A period is the longest time between two runs, never exceeded: a run comes at the last whole
second within it, so up to a second early (a renewal or a probe must not come late). A period
under a second keeps its own grid (multiples of it): tests run these loops fast.
"""

from __future__ import annotations

import asyncio
import math

#: The shared clock's tick.
TICK_S = 1.0


def next_run(now: float, period_s: float) -> float:
    """When a loop that ran at `now` (the event loop's `time()`) next runs: the last tick (of
    `TICK_S`, or of `period_s` when that is shorter) at or before `now + period_s`, and after
    `now`."""
    unit = TICK_S if period_s >= TICK_S else period_s
    if unit <= 0:
        return now
    at = math.floor((now + period_s) / unit) * unit
    return at if at > now else now + period_s


def until_next_run(period_s: float) -> float:
    """Seconds from now to `next_run(now, period_s)`: a wait's timeout on the shared clock."""
    now = asyncio.get_running_loop().time()
    return next_run(now, period_s) - now


async def sleep_to_next_run(period_s: float) -> None:
    """Sleep until `next_run(now, period_s)`."""
    await asyncio.sleep(until_next_run(period_s))
