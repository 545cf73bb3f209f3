"""Laggards: clients that sync rarely (a phone in a pocket, woken now and then) with a small
timeline limit in their filter (`room.timeline.limit`), so that a window holds more of a room's
events than an answer may carry: the server either says `limited: true` (the client fills the gap
with /messages: `workers.harness.gap_fill`) or pages the window (a chain of answers). Either way
the history check reads every event exactly once, in order per room.

A laggard pauses between syncs for a share of the run's expected length (`LagClock`: the run
estimated from the load's progress so far), so it lags several times in a short demo and for 20-30
s in a long run, as the clients of the black-box check that found issue 42's races did. The
pause ends at once when the load stops: the catch-up after it is not paced.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

from workers.harness.cluster_client import ClusterClient
from workers.harness.sync_reader import SyncReader

#: The laggards' filter: a room's timeline holds at most this many events per answer.
TIMELINE_LIMIT = 3
#: The run's length assumed before the load's progress tells (seconds), the lags per run aimed
#: at, and the bounds of one pause (a long run's laggard syncs every 20-30 s at most).
DEFAULT_RUN_S = 60.0
LAGS_PER_RUN = 6
SHORTEST_S, LONGEST_S = 1.0, 30.0


class LagClock:
    """The pause before a laggard's next sync: the expected run length (from `estimate`, None
    while unknown) divided by LAGS_PER_RUN + 1, jittered by ±20%, within [SHORTEST_S, LONGEST_S]."""

    def __init__(self, estimate: Callable[[], float | None], rng: random.Random) -> None:
        self.estimate = estimate
        self.rng = rng

    def next_pause(self) -> float:
        run_s = self.estimate() or DEFAULT_RUN_S
        pause = run_s / (LAGS_PER_RUN + 1) * self.rng.uniform(0.8, 1.2)
        return min(LONGEST_S, max(SHORTEST_S, pause))


class LaggardReader(SyncReader):
    """A `SyncReader` whose client asks for TIMELINE_LIMIT events per room and that waits
    `clock.next_pause()` before each sync of the load; `lags` counts the syncs that followed a
    pause."""

    def __init__(
        self,
        client: ClusterClient,
        workers: Sequence[str],
        switch_every: int,
        clock: LagClock,
        start_over: bool = False,
    ) -> None:
        client.timeline_limit = TIMELINE_LIMIT
        super().__init__(client, workers, switch_every, 0.0, start_over)
        self.clock = clock
        self.lags = 0
        #: Answers with a room timeline of exactly TIMELINE_LIMIT events, not `limited`: a page of
        #: a longer window (the next answer continues it) rather than a gap.
        self.full_pages = 0

    def _answered(self, body: dict[str, Any]) -> None:
        rooms = [r for s in ("join", "leave") for r in body.get("rooms", {}).get(s, {}).values()]
        self.full_pages += any(
            len(r.get("timeline", {}).get("events", [])) == TIMELINE_LIMIT
            and not r.get("timeline", {}).get("limited")
            for r in rooms
        )

    async def _pause(self, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), self.clock.next_pause())
        self.lags += not stop.is_set()
