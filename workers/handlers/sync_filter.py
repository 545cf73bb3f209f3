"""The part of a Matrix sync filter the cluster applies: which rooms, and how many timeline events.

A filter arrives inline (`filter={...}` JSON) or as the id of one uploaded with
`POST /user/{userId}/filter`. Fields the cluster does not apply are accepted and ignored, as the
spec allows a server to do.

An uploaded filter never changes (its id is taken once, the row is never updated), and an inline
one is its text: `FilterCache` parses each once per worker, so a client that names the same filter
on every /sync costs neither a database read nor a parse after its first.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from workers.handlers.caches import LruCache

#: Timeline events per room when no filter says otherwise.
DEFAULT_TIMELINE_LIMIT = 20
MAX_TIMELINE_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class SyncFilter:
    timeline_limit: int = DEFAULT_TIMELINE_LIMIT
    rooms: frozenset[str] | None = None
    not_rooms: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, body: Any) -> SyncFilter:
        """Raises ValueError naming the field that is wrong."""
        if not isinstance(body, dict):
            raise ValueError("a filter is a JSON object")
        room = _object(body, "room")
        timeline = _object(room, "timeline", "room.")
        limit = timeline.get("limit", DEFAULT_TIMELINE_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError("room.timeline.limit must be a whole number >= 0")
        rooms = room.get("rooms")
        not_rooms = room.get("not_rooms", [])
        for name, value in (("rooms", rooms), ("not_rooms", not_rooms)):
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(r, str) for r in value)
            ):
                raise ValueError(f"room.{name} must be a list of room ids")
        return cls(
            min(limit, MAX_TIMELINE_LIMIT),
            None if rooms is None else frozenset(rooms),
            frozenset(not_rooms),
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
