"""The live events a sync worker applied lately, so a woken /sync reads no window from the database.

When one event lands in a room of a thousand members, a thousand long-polls wake at once. Each used
to ask PostgreSQL for its window (which events, then their bodies): a thousand queries for one
event. `RecentEvents` answers "which events" from memory and `EventBodies` reads each body once
for all of them.

`RecentEvents` is fed every events-stream row before the stream's position advances (replicated
rows, and this worker's own batches after commit): the ordering rule that also keeps the caches
right. So for every writer, every event at a position above `floor` and at or below the writer's
current position is here, and a window that starts at or above the floor is answered exactly.
Anything else goes to the database, which stays the truth: a window starting below the floor (an
old `since`; the floor starts at the highest ID allocated at start-up, so no event written before
is expected here, and rises as old entries are dropped), a window longer than `MAX_SCAN` events
(the database's index by room does better), and any window while the index may miss something
(`forget`, `blind`).

An event's body changes once at most: when a redaction of it commits, reads return it pruned. So
`EventBodies` forgets a body when the redaction's events-stream row is applied (`forget`), before
the position advances and readers wake.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import NamedTuple, Protocol

import asyncpg

from workers.handlers.caches.change_cache import BLIND_S
from workers.handlers.caches.lru import EventLike
from workers.handlers.stored.one_time_keys import CountTurn, Device
from workers.model import Event
from workers.storage import events as store
from workers.storage.one_time_keys import KeyCountsOf

#: Events kept (about 200 bytes each): at 1,000 events/s, the last 20 s.
MAX_EVENTS = 20_000
#: The longest run of events a window is looked for in (a few hundred microseconds).
MAX_SCAN = 4_000
#: Bodies kept by `EventBodies`.
MAX_BODIES = 5_000


class Identified(EventLike, Protocol):
    """An event or an events-stream row: its id, room, type and state key."""

    @property
    def event_id(self) -> str: ...


class Sent(Identified, Protocol):
    """An event or an events-stream row with its sender (sync filters select by sender)."""

    @property
    def sender(self) -> str: ...


class Placed(Sent, Protocol):
    """What a sync needs of an event to decide whether it is in a window, visible and wanted."""

    @property
    def stream_ordering(self) -> int: ...
    @property
    def instance_name(self) -> str: ...


class EventRef(NamedTuple):
    """An event's place in the stream, without its body."""

    stream_ordering: int
    instance_name: str
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str


class RecentEvents:
    """A window answered here is a hit; one sent to the database (None) a miss. `evictions`
    counts events dropped to bound its size, `invalidations` the `forget`s."""

    __slots__ = (
        "_blind_until", "_orderings", "_refs", "evictions", "floor", "hits", "invalidations",
        "max_events", "misses", "top",
    )  # fmt: skip
    name = "recent_events"

    def __init__(self, floor: int, max_events: int = MAX_EVENTS) -> None:
        self.floor = floor
        #: The highest position added (where `forget` moves the floor).
        self.top = floor
        self.max_events = max_events
        self._orderings: list[int] = []
        self._refs: list[EventRef] = []
        self._blind_until = 0.0
        self.hits = self.misses = self.evictions = self.invalidations = 0

    def add(self, refs: Iterable[EventRef]) -> None:
        """Events applied (rows of several writers may come a little out of order)."""
        orderings, kept = self._orderings, self._refs
        for ref in refs:
            ordering = ref[0]
            if ordering > self.top:
                orderings.append(ordering)
                kept.append(ref)
                self.top = ordering
            elif ordering > self.floor:
                i = bisect.bisect_left(orderings, ordering)
                if i < len(orderings) and orderings[i] == ordering:
                    continue  # already here (a row applied twice)
                orderings.insert(i, ordering)
                kept.insert(i, ref)
        if len(kept) > self.max_events:
            self._drop_oldest(len(kept) - self.max_events + self.max_events // 8)

    def _drop_oldest(self, count: int) -> None:
        self.evictions += count
        self.floor = max(self.floor, self._orderings[count - 1])
        del self._orderings[:count], self._refs[:count]

    def forget(self, upto: int = 0) -> None:
        """Events at or below `upto` or the newest position added may be missing (a batch of our
        own whose commit outcome is unknown): windows starting below that go to the database."""
        self.floor = self.top = max(self.floor, self.top, upto)
        self.invalidations += 1
        self._orderings.clear()
        self._refs.clear()

    def blind(self) -> None:
        """A writer this process does not follow wrote to the stream (its lines are refused while
        workers disagree on `stream_writers`): answer nothing until `BLIND_S` after its last line
        and a `reopen` after that."""
        self._blind_until = time.monotonic() + BLIND_S

    def blind_over(self) -> bool:
        """The blind period is over: `reopen` with the highest ID allocated, read now."""
        return bool(self._blind_until) and time.monotonic() >= self._blind_until

    def reopen(self, max_allocated: int) -> None:
        """Answer again, for windows starting at or above `max_allocated` (read from the sequence
        after the blind period: whatever the foreign writer wrote is at or below it)."""
        if self.blind_over():
            self._blind_until = 0.0
            self.forget(max_allocated)

    def window(
        self,
        rooms: Collection[str],
        windows: Mapping[str, tuple[int, int]],
        default: tuple[int, int],
        limit: int,
    ) -> list[EventRef] | None:
        """What `workers.storage.events.events_for_rooms` would return for these arguments, or
        None when this index cannot know, or when the window is long enough that the database's
        index by room does better (more than `MAX_SCAN` events to look at)."""
        if self._blind_until:
            self.misses += 1
            return None
        lows = [low for low, high in (*windows.values(), default) if low < high]
        if not lows:
            self.hits += 1
            return []
        low = min(lows)
        if low < self.floor:
            self.misses += 1
            return None
        start = bisect.bisect_right(self._orderings, low)
        if len(self._refs) - start > MAX_SCAN:
            self.misses += 1
            return None
        self.hits += 1
        found: list[EventRef] = []
        for ref in self._refs[start:]:
            if ref.room_id not in rooms:
                continue
            lo, hi = windows.get(ref.instance_name, default)
            if lo < ref.stream_ordering <= hi:
                found.append(ref)
                if len(found) == limit:
                    break
        return found

    def __len__(self) -> int:
        return len(self._refs)


class StoredWitness:
    """The events stream's witness (`pubsub.streams.Stream.witness`) on a worker that serves
    reads: when a long-poll waits on a room of a line's rows, the rows' bodies are read as the line
    arrives, before the rows apply and the polls wake (they find them here, not in a read of their
    own), and the last row found at its token, from its writer, proves the token within the
    sequence. A line no poll waits for declines (the sequence read is cheaper than bodies nobody
    asked for: a busy writer's lines cover a budget of reads each).

    `ahead`, when given, is called in the same turn with the rooms watched: the answers the line
    will wake want more than the bodies (the devices' key counts). The reads it returns go in the
    bodies' statement (`EventBodies.get`), so that the woken answers find them done with the
    bodies, after one reply."""

    __slots__ = ("_ahead", "_bodies", "_watching")

    def __init__(
        self,
        bodies: EventBodies,
        watching: Callable[[str], bool],
        ahead: Callable[[set[str]], CountTurn | None] | None = None,
    ) -> None:
        self._bodies = bodies
        self._watching = watching
        self._ahead = ahead

    def __call__(self, writer: str, rows: Sequence[tuple[int, Sent]]) -> Awaitable[bool] | None:
        watching = self._watching
        rooms = {row.room_id for _, row in rows if watching(row.room_id)}
        if not rooms:
            return None
        return self._stored(writer, rows, rooms)

    async def _stored(self, writer: str, rows: Sequence[tuple[int, Sent]], rooms: set[str]) -> bool:
        # Asked for here, not in `__call__`: a witness never awaited (its line cancelled first)
        # takes no count reads that would then never be made.
        counts = None if self._ahead is None else self._ahead(rooms)
        found = await self._bodies.get([row.event_id for _, row in rows], counts)
        token, last = rows[-1]
        event = found.get(last.event_id)
        return event is not None and event.stream_ordering == token and event.instance_name == writer


def ref_of(event: Event) -> EventRef:
    e = event
    return _new(
        EventRef, (e.stream_ordering, e.instance_name, e.event_id, e.room_id, e.type, e.state_key, e.sender)
    )


def ref_of_row(token: int, instance: str, row: Sent) -> EventRef:
    """The place of an events-stream row's event: at `token` of `instance`."""
    return _new(EventRef, (token, instance, row.event_id, row.room_id, row.type, row.state_key, row.sender))


#: Builds a NamedTuple without its Python-level __new__ (a third of the cost; fields in order).
_new = tuple.__new__


class EventBodies:
    """Persisted events by id, shared by every sync of the worker: concurrent requests for the same
    id wait for one read. A read in flight when its id is forgotten keeps nothing and serves only
    the requests that came before: later ones read again. Counted per id: a hit found here, a
    miss read from the database (or waiting for a read in flight)."""

    __slots__ = (
        "_cache", "_loading", "_pool", "evictions", "hits", "invalidations", "max_size", "misses", "reads",
    )  # fmt: skip
    name = "event_bodies"

    def __init__(self, pool: asyncpg.Pool, max_size: int = MAX_BODIES) -> None:
        self._pool = pool
        self.max_size = max_size
        self._cache: OrderedDict[str, Event] = OrderedDict()
        #: id -> the read in flight that will bring it (its result: what it found; None: failed).
        self._loading: dict[str, asyncio.Future[dict[str, Event] | None]] = {}
        self.reads = self.hits = self.misses = self.evictions = self.invalidations = 0

    def __len__(self) -> int:
        return len(self._cache)

    def _store(self, event: Event) -> None:
        self._cache[event.event_id] = event
        if len(self._cache) > self.max_size:
            self._cache.popitem(last=False)
            self.evictions += 1

    def forget(self, event_ids: Iterable[str]) -> None:
        """These events changed (redacted): the next request reads them from the database."""
        for event_id in event_ids:
            self.invalidations += 1
            self._cache.pop(event_id, None)
            self._loading.pop(event_id, None)

    def forget_room(self, room_id: str) -> None:
        """The room was purged: its events are gone from the database, so from here too."""
        self.forget([event_id for event_id, event in self._cache.items() if event.room_id == room_id])

    async def get(self, event_ids: Sequence[str], counts: CountTurn | None = None) -> dict[str, Event]:
        """The persisted events among `event_ids`, by id (an id that is not stored is left out).
        `counts`: key-count reads to make in the same statement as the bodies (sent alone when
        every body is here or in flight already)."""
        found: dict[str, Event] = {}
        waiting: dict[str, asyncio.Future[dict[str, Event] | None]] = {}
        missing: list[str] = []
        for event_id in event_ids:
            event = self._cache.get(event_id)
            if event is not None:
                self._cache.move_to_end(event_id)
                found[event_id] = event
            elif event_id in self._loading:
                waiting[event_id] = self._loading[event_id]
            else:
                missing.append(event_id)
        self.hits += len(found)
        self.misses += len(event_ids) - len(found)
        if missing:
            found |= await self._read(missing, counts)
        elif counts is not None:
            counts.send()
        unread = []
        for event_id, future in waiting.items():
            loaded = await future
            if loaded is None:
                unread.append(event_id)  # that read failed or was cancelled: read it here
            elif event_id in loaded:
                found[event_id] = loaded[event_id]
        if unread:
            found |= await self._read(unread)
        return found

    async def _read(self, event_ids: list[str], counts: CountTurn | None = None) -> dict[str, Event]:
        future: asyncio.Future[dict[str, Event] | None] = asyncio.get_running_loop().create_future()
        self._loading |= dict.fromkeys(event_ids, future)
        loaded: dict[str, Event] | None = None
        try:
            self.reads += 1
            if counts is None:
                async with self._pool.acquire() as conn:
                    loaded = await store.events_by_ids(conn, event_ids)
            else:
                loaded = await counts.riding(partial(self._read_with_counts, event_ids))
            for event in loaded.values():
                if self._loading.get(event.event_id) is future:  # not forgotten meanwhile
                    self._store(event)
            return loaded
        finally:
            for event_id in event_ids:
                if self._loading.get(event_id) is future:
                    del self._loading[event_id]
            future.set_result(loaded)  # None when the read failed or was cancelled

    async def _read_with_counts(
        self, event_ids: list[str], devices: list[Device]
    ) -> tuple[dict[str, Event], KeyCountsOf]:
        async with self._pool.acquire() as conn:
            return await store.events_with_key_counts(conn, event_ids, devices)
