"""A Matrix sync filter: which rooms, which events of each section, and lazy-loaded members.

A filter arrives inline (`filter={...}` JSON) or as the id of one uploaded with
`POST /user/{userId}/filter`. Applied, as the spec defines them: `room.rooms` / `room.not_rooms`,
`room.include_leave`; `room.timeline`, `room.state`, `room.ephemeral`, `room.account_data`,
`account_data` and `presence` with `types` / `not_types` (`*` matches any run of characters),
`senders` / `not_senders` and `limit` (the timeline's); `room.state.lazy_load_members` (and
`room.timeline.lazy_load_members`, which clients send too) with `include_redundant_members`.
A `not_*` entry wins over its positive list. Other fields (`event_fields`, `event_format`,
`contains_url`, `unread_thread_notifications`) are accepted and ignored, as the spec allows.

The timeline filter selects what a timeline shows, never where a room goes: a room's section
comes from the user's own membership events whatever the filter leaves out of its timeline.

An uploaded filter never changes (its id is taken once, the row is never updated), and an inline
one is its text: `FilterCache` parses each once per worker, so a client that names the same filter
on every /sync costs neither a database read nor a parse after its first.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from workers.handlers.caches.lru import FunctoolsCacheCounts, LruCache

#: Timeline events per room when no filter says otherwise.
DEFAULT_TIMELINE_LIMIT = 20
MAX_TIMELINE_LIMIT = 1000
MAX_LIST = 1000


@functools.lru_cache(maxsize=1024)
def _pattern(types: tuple[str, ...]) -> re.Pattern[str]:
    """One regular expression for a list of type patterns (`*`: any run of characters)."""
    return re.compile("|".join(".*".join(re.escape(part) for part in t.split("*")) for t in types))


#: The compiled type patterns' cache, as the scrape reads it.
PATTERN_CACHE = FunctoolsCacheCounts("filter_type_patterns", _pattern)


@dataclass(frozen=True, slots=True)
class EventFilter:
    """The spec's EventFilter / RoomEventFilter minus the fields that select rooms."""

    limit: int | None = None
    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    senders: frozenset[str] | None = None
    not_senders: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        """Whether the filter lets every event through (the common case: no work per event)."""
        return self.types is None and not self.not_types and self.senders is None and not self.not_senders

    def allows(self, event_type: str, sender: str) -> bool:
        if sender in self.not_senders or (self.senders is not None and sender not in self.senders):
            return False
        if self.not_types and _pattern(self.not_types).fullmatch(event_type):
            return False
        return self.types is None or _pattern(self.types).fullmatch(event_type) is not None

    def select(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The client-format events (with `type` and `sender`) the filter lets through."""
        if self.everything:
            return list(events)
        return [e for e in events if self.allows(str(e.get("type", "")), str(e.get("sender", "")))]

    @classmethod
    def parse(cls, body: dict[str, Any], where: str, default_limit: int | None = None) -> EventFilter:
        limit = body.get("limit", default_limit)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError(f"{where}limit must be a whole number >= 0")
        types, senders = _strings(body, "types", where), _strings(body, "senders", where)
        return cls(
            None if limit is None else min(limit, MAX_TIMELINE_LIMIT),
            None if types is None else tuple(types),
            tuple(_strings(body, "not_types", where) or ()),
            None if senders is None else frozenset(senders),
            frozenset(_strings(body, "not_senders", where) or ()),
        )


@dataclass(frozen=True, slots=True)
class SyncFilter:
    timeline: EventFilter = field(default_factory=lambda: EventFilter(DEFAULT_TIMELINE_LIMIT))
    rooms: frozenset[str] | None = None
    not_rooms: frozenset[str] = frozenset()
    include_leave: bool = False
    state: EventFilter = field(default_factory=EventFilter)
    #: State carries only the members who sent something in the timeline, and the user's own.
    lazy_load_members: bool = False
    include_redundant_members: bool = False
    ephemeral: EventFilter = field(default_factory=EventFilter)
    room_account_data: EventFilter = field(default_factory=EventFilter)
    account_data: EventFilter = field(default_factory=EventFilter)
    presence: EventFilter = field(default_factory=EventFilter)

    @property
    def timeline_limit(self) -> int:
        return DEFAULT_TIMELINE_LIMIT if self.timeline.limit is None else self.timeline.limit

    @classmethod
    def parse(cls, body: Any) -> SyncFilter:
        """Raises ValueError naming the field that is wrong."""
        if not isinstance(body, dict):
            raise ValueError("a filter is a JSON object")
        room = _object(body, "room")
        timeline = _object(room, "timeline", "room.")
        state = _object(room, "state", "room.")
        rooms = _strings(room, "rooms", "room.")
        include_leave = room.get("include_leave", False)
        if not isinstance(include_leave, bool):
            raise ValueError("room.include_leave must be true or false")
        flags = {}
        for name in ("lazy_load_members", "include_redundant_members"):
            values = [part.get(name, False) for part in (state, timeline)]
            if not all(isinstance(v, bool) for v in values):
                raise ValueError(f"room.state.{name} must be true or false")
            flags[name] = any(values)
        return cls(
            timeline=EventFilter.parse(timeline, "room.timeline.", DEFAULT_TIMELINE_LIMIT),
            rooms=None if rooms is None else frozenset(rooms),
            not_rooms=frozenset(_strings(room, "not_rooms", "room.") or ()),
            include_leave=include_leave,
            state=EventFilter.parse(state, "room.state."),
            lazy_load_members=flags["lazy_load_members"],
            include_redundant_members=flags["include_redundant_members"],
            ephemeral=EventFilter.parse(_object(room, "ephemeral", "room."), "room.ephemeral."),
            room_account_data=EventFilter.parse(_object(room, "account_data", "room."), "room.account_data."),
            account_data=EventFilter.parse(_object(body, "account_data"), "account_data."),
            presence=EventFilter.parse(_object(body, "presence"), "presence."),
        )

    @classmethod
    def parse_text(cls, text: str) -> SyncFilter:
        """A filter from its JSON text; ValueError for bad JSON or a wrong field."""
        return cls.parse(json.loads(text))  # JSONDecodeError is a ValueError

    def includes(self, room_id: str) -> bool:
        return room_id not in self.not_rooms and (self.rooms is None or room_id in self.rooms)


#: Inline filters longer than this are parsed on every request rather than kept as cache keys.
MAX_CACHED_INLINE_BYTES = 4096


class FilterCache:
    """Parsed filters: uploaded ones by (user, filter id), inline ones by their text; bounded LRU.

    `stored(user_id, filter_id)` reads the filter's JSON text (None: no such filter). Nothing is
    invalidated: neither key can come to mean another filter. A missing filter or a bad one raises
    (ValueError, or what `stored` raises) and is not kept."""

    def __init__(self, stored: Callable[[str, int], Awaitable[str | None]], max_size: int = 10_000) -> None:
        self._stored = stored
        self.uploaded: LruCache[tuple[str, int], SyncFilter] = LruCache("sync_filters", max_size, self._load)
        self.inline: LruCache[str, SyncFilter] = LruCache("inline_sync_filters", max_size, self._parse)

    async def _load(self, key: tuple[str, int]) -> SyncFilter:
        text = await self._stored(*key)
        if text is None:
            raise LookupError(f"no filter {key[1]}")
        return SyncFilter.parse_text(text)

    @staticmethod
    async def _parse(text: str) -> SyncFilter:
        return SyncFilter.parse_text(text)

    async def by_id(self, user_id: str, filter_id: int) -> SyncFilter:
        """LookupError when the user has no such filter."""
        return await self.uploaded.get((user_id, filter_id))

    async def by_text(self, text: str) -> SyncFilter:
        if len(text) > MAX_CACHED_INLINE_BYTES:
            return SyncFilter.parse_text(text)
        return await self.inline.get(text)


def _object(body: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}{key} must be an object")
    return value


def _strings(body: dict[str, Any], key: str, where: str) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > MAX_LIST:
        raise ValueError(f"{where}{key} must be a list of at most {MAX_LIST} strings")
    return value
