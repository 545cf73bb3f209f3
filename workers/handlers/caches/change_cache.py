"""`StreamChangeCache`: which entities (users) a stream changed lately, to skip queries at sync.

It remembers, per entity, the highest stream id at which the stream changed it, for every change
above `floor`. So "did X change after position p?" is answered here without a query when
p >= floor: not if X is unknown or its last change is at or below p. Below the floor it does not
know, and the caller queries the database.

Fed with every row of the stream, local and replicated, before the stream's position advances
(the ordering rule), so a token that covers a change never meets a cache that misses it. The
floor starts at the highest position this process knew of at start-up (rows at or below it were
written before and never reach this cache) and rises when old entries are dropped to bound size,
and when the cache `reopen`s after being `blind`.

It also answers "who changed after p?" (`changed_after`), so a sync that would otherwise test
every user it shares a room with (a thousand, in a big room) tests only the few that changed.
Made `by_writer`, it keeps each entity's last few changes with the writer of each, and answers
"did X change inside this window of per-writer positions?" without a query unless what it kept
cannot tell (`changed_within`).

Each question counts as a hit when answered here and as a miss when the caller must ask the
database (below the floor, or blind); `evictions` counts entities dropped to bound its size.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable

from idgen import MultiWriterStreamToken

#: How long after the last line of a writer this process does not follow the cache stays blind.
BLIND_S = 30.0
#: Up to this many changed entities, a sync tests each of them for a shared room instead of
#: collecting everyone it shares a room with.
FEW_CHANGED = 100
#: The changes kept per entity, with their writers, by a cache made `by_writer`.
RECENT_CHANGES = 4


class StreamChangeCache:
    __slots__ = (
        "_blind_until", "_last", "_order", "_partial", "_recent", "evictions", "floor", "hits", "max_entries",
        "misses", "name",
    )  # fmt: skip
    invalidations = 0

    def __init__(self, name: str, floor: int, max_entries: int = 100_000, *, by_writer: bool = False) -> None:
        self.name = name
        self.floor = floor
        self.max_entries = max_entries
        self._last: dict[str, int] = {}
        #: With `by_writer`: entity -> its last `RECENT_CHANGES` changes above the floor, (stream
        #: id, writer or "" when not known for certain), in stream order (see `changed_within`).
        self._recent: dict[str, list[tuple[int, str]]] | None = {} if by_writer else None
        #: The entities some of whose changes above the floor were dropped from `_recent`.
        self._partial: set[str] = set()
        #: (stream id, entity) sorted; an entry whose entity changed again later is stale and
        #: skipped (its id differs from `_last`), and dropped when the list is rebuilt.
        self._order: list[tuple[int, str]] = []
        self._blind_until = 0.0
        self.hits = self.misses = self.evictions = 0

    def blind(self) -> None:
        """A writer this process does not follow wrote to the stream (its lines are refused while
        the workers disagree on `stream_writers`): its rows never reach this cache, so answer
        "maybe" to everything until `BLIND_S` after the last such line and a `reopen` after that
        (as `RecentEvents` does)."""
        self._blind_until = time.monotonic() + BLIND_S

    def blind_over(self) -> bool:
        """The blind period is over: `reopen` with the highest ID allocated, read now."""
        return bool(self._blind_until) and time.monotonic() >= self._blind_until

    def reopen(self, max_allocated: int) -> None:
        """Answer again, above `max_allocated` (read from the sequence after the blind period: the
        foreign writer's rows are at or below it, a removed writer's included)."""
        if self.blind_over():
            self._blind_until = 0.0
            self.floor = max(self.floor, max_allocated)

    def _blind(self) -> bool:
        return bool(self._blind_until)

    def changed(self, entity: str, stream_id: int, writer: str | None = None) -> None:
        """`entity` changed at `stream_id`, written by `writer` (None: not known for certain, as
        for a write whose commit is unknown)."""
        if self._recent is not None and stream_id > self.floor:
            self._remember(entity, stream_id, writer or "")
        if stream_id <= self._last.get(entity, self.floor):
            return
        self._last[entity] = stream_id
        order = self._order
        if not order or order[-1] < (stream_id, entity):
            order.append((stream_id, entity))
        else:
            bisect.insort(order, (stream_id, entity))  # another writer's row, a little behind
        if len(self._last) > self.max_entries:
            self._drop_oldest(len(self._last) - self.max_entries + self.max_entries // 8)
        if len(order) > 4 * self.max_entries + 64:
            self._order = sorted((s, n) for n, s in self._last.items())

    def _remember(self, entity: str, stream_id: int, writer: str) -> None:
        """Keep the change in the entity's recent ones (a row of another writer may come a little
        behind a later one: it is placed in order, not dropped)."""
        assert self._recent is not None
        changes = self._recent.setdefault(entity, [])
        if (stream_id, writer) in changes:
            return
        bisect.insort(changes, (stream_id, writer))
        if len(changes) > RECENT_CHANGES:
            del changes[0]
            self._partial.add(entity)

    def _drop_oldest(self, count: int) -> None:
        """Forget the `count` oldest entities (an eighth at a time: one list shift, not one each)."""
        last, order, cut = self._last, self._order, 0
        while count > 0 and cut < len(order):
            oldest, name = order[cut]
            cut += 1
            if last.get(name) == oldest:
                del last[name]
                if self._recent is not None:
                    self._recent.pop(name, None)
                    self._partial.discard(name)
                self.floor = max(self.floor, oldest)
                count -= 1
                self.evictions += 1
        del order[:cut]

    def may_have_changed(self, entity: str, since: int) -> bool:
        """False only when `entity` certainly did not change at a position above `since`."""
        if since < self.floor or self._blind():
            self.misses += 1
            return True
        self.hits += 1
        return self._last.get(entity, self.floor) > since

    def any_may_have_changed(self, entities: list[str], since: int) -> list[str]:
        """The `entities` that may have changed above `since` (all of them below the floor)."""
        if since < self.floor or self._blind():
            self.misses += 1
            return list(entities)
        self.hits += 1
        last, floor = self._last, self.floor
        return [e for e in entities if last.get(e, floor) > since]

    def changed_after(self, since: int) -> list[str] | None:
        """The entities that changed above `since`, or None when this cache cannot know (below
        the floor, or blind)."""
        if since < self.floor or self._blind():
            self.misses += 1
            return None
        self.hits += 1
        order, last = self._order, self._last
        start = bisect.bisect_right(order, (since, "\U0010ffff"))
        return [name for stream_id, name in order[start:] if last.get(name) == stream_id]

    def changed_within(
        self, entities: Iterable[str], low: MultiWriterStreamToken, high: MultiWriterStreamToken
    ) -> tuple[set[str], list[str]]:
        """Of `entities`, (those that certainly changed inside the window (low, high] of per-writer
        positions, those only the database can tell about). An entity whose last change is at or
        below `low.stream` did not change. Otherwise (a cache made `by_writer`) its kept changes
        say: one inside its writer's part of the window, it did; every change above `low.stream`
        kept, with its writer, and each outside its writer's part, it did not. Anything else (a
        change of unknown writer or dropped, below the floor, blind) is left to the database."""
        if low.stream < self.floor or self._blind():
            self.misses += 1
            return set(), list(entities)
        self.hits += 1
        last, floor, recent, partial = self._last, self.floor, self._recent, self._partial
        changed: set[str] = set()
        unsure: list[str] = []
        for entity in entities:
            if last.get(entity, floor) <= low.stream:
                continue
            changes = None if recent is None else recent.get(entity)
            if changes is None:
                unsure.append(entity)
                continue
            known = entity not in partial or changes[0][0] <= low.stream
            for at, writer in changes:
                if at <= low.stream:
                    continue
                if not writer:
                    known = False
                elif low.get_stream_pos_for_instance(writer) < at <= high.get_stream_pos_for_instance(writer):
                    changed.add(entity)
                    break
            else:
                if not known:
                    unsure.append(entity)
        return changed, unsure

    def last(self, entity: str) -> int | None:
        """The highest position at which `entity` changed, when above the floor."""
        return self._last.get(entity)

    def __len__(self) -> int:
        return len(self._last)
