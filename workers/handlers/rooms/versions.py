"""Room versions: the rules a room's events follow, known on every worker.

A room's version is fixed when it is created (the `m.room.create` content, and the `rooms` row
the persister writes in the same transaction) or, for a room that lives on another server, by the
invite that named it. Each events-stream row carries its room's version, so a reader learns it
with the row (`learn`); a reader that restarted, or never saw the row, reads it from `rooms`.
Events are rendered for clients with their room's rules (`render`); a redacted event comes from
the storage layer already pruned by them, with the redaction that pruned it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

from workers.handlers.caches.lru import LruCache
from workers.model import IMPLICIT_ROOM_VERSION, Event
from workers.model import REDACTION_EVENT as REDACTION_EVENT  # where the handlers import it from
from workers.storage import rooms as store


@dataclass(frozen=True, slots=True)
class RoomVersion:
    identifier: str

    @property
    def redacts_in_content(self) -> bool:
        """Version 11 moved an m.room.redaction's `redacts` from the event into its content."""
        return self.identifier.isdigit() and int(self.identifier) >= 11


def render(event: Event, version: RoomVersion, *, room_id: bool = True) -> dict[str, Any]:
    """The event in the client-server API's format under its room's version.

    Redactions are stored with `redacts` in their content. Before version 11 the spec puts it at
    the top of the event instead; from 11 on it stays in the content, and (as servers do for
    clients written before 11) is repeated at the top.

    A redacted event (its content already pruned) carries the redaction, rendered the same way,
    in `unsigned.redacted_because`, as the spec has it."""
    body = event.matrix(room_id=room_id)
    if event.type == REDACTION_EVENT:
        redacts = event.content.get("redacts")
        if not version.redacts_in_content:
            body["content"] = {k: v for k, v in event.content.items() if k != "redacts"}
        if isinstance(redacts, str):
            body["redacts"] = redacts
    if event.redacted_because is not None:
        body["unsigned"]["redacted_because"] = render(event.redacted_because, version, room_id=room_id)
    return body


class RoomVersions:
    """room id -> `RoomVersion`, cached (a room's version never changes)."""

    def __init__(self, pool: asyncpg.Pool, max_entries: int) -> None:
        self._pool = pool
        self.cache: LruCache[str, str] = LruCache("room_versions", max_entries, self._load)

    def learn(self, room_id: str, version: str | None) -> None:
        """A version carried by a replicated row or a new room's create event."""
        if version is not None and room_id not in self.cache:
            self.cache.put(room_id, version)

    async def get(self, room_id: str) -> RoomVersion:
        return RoomVersion(await self.cache.get(room_id))

    async def of_rooms(self, room_ids: Iterable[str]) -> dict[str, RoomVersion]:
        return {room_id: await self.get(room_id) for room_id in set(room_ids)}

    async def _load(self, room_id: str) -> str:
        async with self._pool.acquire() as conn:
            version = await store.room_version(conn, room_id)
        # A room with no row has no create event here (none of ours); the spec's default stands.
        return version or IMPLICIT_ROOM_VERSION
