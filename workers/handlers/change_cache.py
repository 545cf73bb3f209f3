"""`StreamChangeCache`: which entities (users) a stream changed lately, to skip queries at sync.

It remembers, per entity, the highest stream id at which the stream changed it, for every change
above `floor`. So "did X change after position p?" is answered here without a query when
p >= floor: not if X is unknown or its last change is at or below p. Below the floor it does not
know, and the caller queries the database.

Fed with every row of the stream, local and replicated, before the stream's position advances
(the ordering rule), so a token that covers a change never meets a cache that misses it. The
floor starts at the highest position this process knew of at start-up (rows at or below it were
written before and never reach this cache) and rises when old entries are dropped to bound size.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

#: How long after the last line of a writer this process does not follow the cache stays blind.
BLIND_S = 30.0


class StreamChangeCache:
    __slots__ = ("_blind_until", "_heap", "_last", "_position", "floor", "max_entries", "name")

    def __init__(
        self, name: str, floor: int, max_entries: int = 100_000, position: Callable[[], int] | None = None
    ) -> None:
        self.name = name
        self.floor = floor
        self.max_entries = max_entries
        self._last: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []
        #: The highest position this process knows of the stream (for the floor after `blind`).
        self._position = position or (lambda: self.floor)
        self._blind_until = 0.0

    def blind(self) -> None:
        """A writer this process does not follow wrote to the stream (its lines are refused while
        the workers disagree on `stream_writers`): its rows never reach this cache, so answer
        "maybe" to everything until `BLIND_S` after the last such line, then start again with the
        floor at the highest position known then."""
        self._blind_until = time.monotonic() + BLIND_S

    def _blind(self) -> bool:
        if not self._blind_until:
            return False
        if time.monotonic() < self._blind_until:
            return True
        self._blind_until = 0.0
        self.floor = max(self.floor, self._position())
        return False

    def changed(self, entity: str, stream_id: int) -> None:
        """`entity` changed at `stream_id`."""
        if stream_id <= self._last.get(entity, self.floor):
            return
        self._last[entity] = stream_id
        heapq.heappush(self._heap, (stream_id, entity))
        while len(self._last) > self.max_entries:
            oldest, name = heapq.heappop(self._heap)
            if self._last.get(name) == oldest:
                del self._last[name]
                self.floor = max(self.floor, oldest)
        if len(self._heap) > 4 * self.max_entries + 64:
            self._heap = [(s, n) for n, s in self._last.items()]
            heapq.heapify(self._heap)

    def may_have_changed(self, entity: str, since: int) -> bool:
        """False only when `entity` certainly did not change at a position above `since`."""
        if since < self.floor or self._blind():
            return True
        return self._last.get(entity, self.floor) > since

    def any_may_have_changed(self, entities: list[str], since: int) -> list[str]:
        """The `entities` that may have changed above `since` (all of them below the floor)."""
        if since < self.floor or self._blind():
            return list(entities)
        last, floor = self._last, self.floor
        return [e for e in entities if last.get(e, floor) > since]

    def last(self, entity: str) -> int | None:
        """The highest position at which `entity` changed, when above the floor."""
        return self._last.get(entity)

    def __len__(self) -> int:
        return len(self._last)
