"""Bounded in-process LRU caches and the set a sync worker keeps.

Invalidation contract: after `invalidate(key)` returns, no later `get(key)` returns a value loaded
before the invalidation. A load that overlaps an invalidation is returned to its caller but not
stored (a generation counter detects the overlap), so a slow database read can never re-insert
stale data after the replication handler cleared it.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from idgen import MultiWriterIdGenerator
from workers.model import (
    ACCESS_TOKEN_CACHE,
    CURRENT_STATE_CACHE,
    MEMBER_EVENT,
    ROOM_EMPTIED_CACHE,
    ROOM_PURGED_CACHE,
    VISIBILITY_EVENT,
    CacheInvalidation,
    UserRooms,
)
from workers.storage import Conn
from workers.storage.events import insert_invalidations
from workers.storage.users import Requester

K = TypeVar("K")
V = TypeVar("V")
_MISSING: Any = object()


class LruCache(Generic[K, V]):
    """At most `max_size` entries; the least recently used is evicted first."""

    __slots__ = (
        "_entries",
        "_generation",
        "_loader",
        "evictions",
        "hits",
        "invalidations",
        "max_size",
        "misses",
        "name",
    )

    def __init__(self, name: str, max_size: int, loader: Callable[[K], Awaitable[V]]) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._loader = loader
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._generation = 0
        self.hits = self.misses = self.invalidations = self.evictions = 0

    async def get(self, key: K) -> V:
        try:
            value = self._entries[key]
        except KeyError:
            pass
        else:
            self._entries.move_to_end(key)
            self.hits += 1
            return value
        self.misses += 1
        generation = self._generation
        value = await self._loader(key)
        if generation == self._generation:
            self._entries[key] = value
            if len(self._entries) > self.max_size:
                self._entries.popitem(last=False)
                self.evictions += 1
        return value

    def put(self, key: K, value: V) -> None:
        """Store a value learned elsewhere (one that cannot change: nothing invalidates it)."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_size:
            self._entries.popitem(last=False)
            self.evictions += 1

    def update(self, key: K, change: Callable[[V], V]) -> None:
        """Replace the entry of `key`, if there is one, by `change` of it (a change learned from a
        row, applied without a load). A load in flight is not stored, as after `invalidate`: it
        may have read the database before the row's commit."""
        self._generation += 1
        value = self._entries.get(key, _MISSING)
        if value is not _MISSING:
            self._entries[key] = change(value)

    def invalidate(self, key: K) -> None:
        self._generation += 1
        self.invalidations += 1
        self._entries.pop(key, None)

    def invalidate_many(self, keys: Iterable[K]) -> None:
        for key in keys:
            self.invalidate(key)

    def invalidate_matching(self, matches: Callable[[K], bool]) -> None:
        """Drop every entry whose key `matches` (a scan: for rare events such as a room's end)."""
        self._generation += 1
        self.invalidations += 1
        for key in [k for k in self._entries if matches(k)]:
            del self._entries[key]

    def invalidate_all(self) -> None:
        self._generation += 1
        self.invalidations += 1
        self._entries.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"<LruCache {self.name} size={len(self._entries)}/{self.max_size} hits={self.hits}"
            f" misses={self.misses} invalidations={self.invalidations}>"
        )


class CacheCounts:
    """The counters of a cache that is not an `LruCache` (a dict or an index with its own rules),
    in the shape the scrape reads (`workers.http.health.CacheStats`): the cache's code counts its
    look-ups with `hits += 1` / `misses += 1`, nothing more on its path."""

    __slots__ = ("_size", "evictions", "hits", "invalidations", "misses", "name")

    def __init__(self, name: str, size: Callable[[], int]) -> None:
        self.name = name
        self._size = size
        self.hits = self.misses = self.evictions = self.invalidations = 0

    def __len__(self) -> int:
        return self._size()


class FunctoolsCacheCounts:
    """A `functools.lru_cache`'d function's own counts (`cache_info()`), read at scrape time."""

    __slots__ = ("_function", "name")

    evictions = invalidations = 0

    def __init__(self, name: str, function: Any) -> None:
        self.name = name
        self._function = function

    @property
    def hits(self) -> int:
        return int(self._function.cache_info().hits)

    @property
    def misses(self) -> int:
        return int(self._function.cache_info().misses)

    def __len__(self) -> int:
        return int(self._function.cache_info().currsize)


class EventLike(Protocol):
    """What invalidation needs of an event: a persisted Event or a replicated row."""

    @property
    def room_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def state_key(self) -> str | None: ...


class StateLike(EventLike, Protocol):
    """An event or an events-stream row with the membership it sets (None: not a member event)."""

    @property
    def membership(self) -> str | None: ...


class SyncCaches:
    """The caches a sync worker reads: a user's rooms (with the user's membership history), a room's
    joined members, a room's state, a room's history visibility changes."""

    def __init__(
        self,
        rooms_for_user: Callable[[str], Awaitable[UserRooms]],
        joined_members: Callable[[str], Awaitable[frozenset[str]]],
        current_state: Callable[[str], Awaitable[dict[tuple[str, str], str]]],
        room_visibility: Callable[[str], Awaitable[tuple[tuple[int, str], ...]]],
        max_size: int = 10_000,
        access_token: Callable[[str], Awaitable[Requester]] | None = None,
        access_token_entries: int = 100_000,
        *,
        applies_events: bool = False,
    ) -> None:
        #: Whether this worker applies every writer's events (`on_events`, live or caught up):
        #: they keep the room caches exact, so the caches stream's current-state rows (written
        #: for the workers that do not) are not applied to them here.
        self.applies_events = applies_events
        self.rooms_for_user: LruCache[str, UserRooms] = LruCache("rooms_for_user", max_size, rooms_for_user)
        self.joined_members: LruCache[str, frozenset[str]] = LruCache(
            "joined_members", max_size, joined_members
        )
        self.current_state: LruCache[str, dict[tuple[str, str], str]] = LruCache(
            "current_state", max_size, current_state
        )
        self.room_visibility: LruCache[str, tuple[tuple[int, str], ...]] = LruCache(
            "room_visibility", max_size, room_visibility
        )
        #: Access token (hex SHA-256) -> its owner (every worker applies the caches stream); the
        #: writer that ends a token sends its key there (`CacheRows`).
        self.access_tokens: LruCache[str, Requester] | None = None
        if access_token is not None:
            self.access_tokens = LruCache(ACCESS_TOKEN_CACHE, access_token_entries, access_token)
        #: Called with a room id when the room ended (purged, or its last local member left), for
        #: what the worker keeps of a room outside these caches (room rules, event bodies, version).
        self.room_ended: list[Callable[[str], None]] = []
        self._registered: list[LruCache[str, object]] = []

    def register(self, cache: LruCache[str, V]) -> None:
        """Another cache the caches stream's rows of its name invalidate (kept by its owner)."""
        self._registered.append(cache)  # type: ignore[arg-type]

    def all(self) -> list[LruCache[str, object]]:
        caches = [
            self.rooms_for_user, self.joined_members, self.current_state, self.room_visibility,
            self.access_tokens, *self._registered,
        ]  # fmt: skip
        return [c for c in caches if c is not None]  # type: ignore[misc]

    async def sharing_a_room(self, user_id: str, among: Iterable[str] | None = None) -> set[str]:
        """The users joined to a room `user_id` is joined to, themself included; with `among`, only
        those of `among`. Each of `among` costs one look-up of its own rooms instead of every
        member list of the user's rooms: for the few who changed since a sync's token, when the
        user's rooms hold thousands."""
        joined = (await self.rooms_for_user.get(user_id)).joined()
        if among is not None:
            found = set()
            for other in among:
                if other == user_id or not joined.isdisjoint((await self.rooms_for_user.get(other)).joined()):
                    found.add(other)
            return found
        users = {user_id}
        for room_id in joined:
            users |= await self.joined_members.get(room_id)
        return users

    def on_events(self, placed: Iterable[tuple[int, StateLike]]) -> None:
        """Apply committed events at their stream positions: a state event drops its room's state;
        a live member event updates its room's members and its member's rooms in place (a
        reload of every member's rooms per membership change is what made churn costly); a
        backfilled one, or a history visibility change, drops what it changes."""
        for position, event in placed:
            if event.state_key is None:
                continue
            room_id, key = event.room_id, event.state_key
            self.current_state.invalidate(room_id)
            if event.type == VISIBILITY_EVENT:
                self.room_visibility.invalidate(room_id)
            if event.type != MEMBER_EVENT:
                continue
            membership = event.membership
            if position <= 0 or membership is None:
                self.joined_members.invalidate(room_id)
                self.rooms_for_user.invalidate(key)
                continue
            self._member_changed(position, room_id, key, membership)

    def _member_changed(self, position: int, room_id: str, user_id: str, membership: str) -> None:
        if membership == "join":
            self.joined_members.update(room_id, lambda members: members | {user_id})
        else:
            self.joined_members.update(room_id, lambda members: members - {user_id})
        self.rooms_for_user.update(user_id, lambda rooms: rooms.with_change(room_id, position, membership))

    def forget_events(self, events: Iterable[EventLike]) -> None:
        """Drop what events whose commit is unknown may have changed (the next read loads it)."""
        for event in events:
            if event.state_key is None:
                continue
            self.current_state.invalidate(event.room_id)
            if event.type == VISIBILITY_EVENT:
                self.room_visibility.invalidate(event.room_id)
            if event.type == MEMBER_EVENT:
                self.joined_members.invalidate(event.room_id)
                self.rooms_for_user.invalidate(event.state_key)

    def on_invalidations(self, rows: Iterable[CacheInvalidation]) -> None:
        """Apply caches-stream rows. Unknown cache names are ignored (another version may send them)."""
        by_name = {cache.name: cache for cache in self.all()}
        for row in rows:
            if row.cache_func == CURRENT_STATE_CACHE:
                if self.applies_events:
                    continue
                for key in row.keys or ():
                    if key.startswith("!"):  # a room id; the user ids after it start with "@"
                        self.current_state.invalidate(key)
                        self.joined_members.invalidate(key)
                        self.room_visibility.invalidate(key)
                    else:
                        self.rooms_for_user.invalidate(key)
            elif row.cache_func in (ROOM_EMPTIED_CACHE, ROOM_PURGED_CACHE) and row.keys:
                room_id, *users = row.keys
                self.current_state.invalidate(room_id)
                self.joined_members.invalidate(room_id)
                self.room_visibility.invalidate(room_id)
                self.rooms_for_user.invalidate_many(users)
                for ended in self.room_ended:
                    ended(room_id)
            elif (cache := by_name.get(row.cache_func)) is not None:
                if row.keys is None:
                    cache.invalidate_all()
                else:
                    cache.invalidate_many(row.keys)


class PendingRow:
    """One caches-stream row being written in another write's transaction (see `CacheRows`)."""

    __slots__ = ("_instance", "row", "stream_id")

    def __init__(self, stream_id: int, instance: str) -> None:
        self.stream_id = stream_id
        self._instance = instance
        self.row: CacheInvalidation | None = None

    async def write(self, conn: Conn, cache_func: str, keys: Sequence[str] | None) -> CacheInvalidation:
        """Insert the row on `conn`, inside the caller's transaction (once per reservation)."""
        if self.row is not None:
            raise RuntimeError("a reserved caches row is written once")
        row = CacheInvalidation(cache_func, None if keys is None else tuple(keys), int(time.time() * 1000))
        await insert_invalidations(conn, [(self.stream_id, row)], self._instance)
        self.row = row
        return row


class CacheRows:
    """Writes a caches-stream row in the same transaction as the change it reports, on a writer of
    the caches stream, so a reader that misses its RDATA finds it by catch-up from the database.

        async with cache_rows.reserve() as pending:      # one caches stream id, in flight
            ...transaction: the change, then `await pending.write(conn, func, keys)`...

    Leaving the block normally means the transaction committed: the row is applied here and staged
    for RDATA (`committed`) before the id finishes. Leaving it by an exception after `write` means
    the commit may have happened: `uncertain` applies it here (an invalidation is always safe) and
    makes readers fetch the id from the database. Then the id finishes (published) and `finished`
    runs. An id whose block wrote nothing is a harmless gap."""

    def __init__(
        self,
        instance: str,
        generator: MultiWriterIdGenerator,
        committed: Callable[[Sequence[tuple[int, CacheInvalidation]]], None],
        uncertain: Callable[[int, CacheInvalidation], None],
        finished: Callable[[Sequence[tuple[int, CacheInvalidation]]], None],
    ) -> None:
        self.instance = instance
        self._generator = generator
        self._committed = committed
        self._uncertain = uncertain
        self._finished = finished

    @contextlib.asynccontextmanager
    async def reserve(self) -> AsyncIterator[PendingRow]:
        async with self._generator.get_next() as stream_id:
            pending = PendingRow(stream_id, self.instance)
            try:
                yield pending
            except BaseException:
                if pending.row is not None:
                    self._uncertain(stream_id, pending.row)
                raise
            if pending.row is not None:
                self._committed([(stream_id, pending.row)])
        if pending.row is not None:
            self._finished([(stream_id, pending.row)])
