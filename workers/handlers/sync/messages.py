"""`GET /rooms/{roomId}/messages`: a room's events page by page, backwards or forwards.

Positions in a room are stream orderings: every event of a room takes its stream id from the same
sequence, so they order the room's events completely (backfilled ones are negative, older than
any live one). A pagination token is `t<ordering>`, "just after that event"; a sync token (a
`next_batch`) also works as `from`, standing for the room's last event it covers. (A room's writer
may change, `workers.handlers.placement.room_leases`; each takes over only after the previous one's events,
so what a token covers of a room is always a prefix of its events.)

Who sees what follows the room's history visibility (`workers.handlers.rooms.history_visibility`), as
sync does: a `shared` room's events before a join to whoever joined after them, an `invited`
room's from the invite on, a `joined` room's while joined, a `world_readable` room's to anyone
(a non-member too); backfilled history (negative orderings) is shown to current members, and in
a `world_readable` room to anyone.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from idgen import SyncToken
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.rooms.history_visibility import WORLD_READABLE, current, may_see_event
from workers.handlers.rooms.versions import RoomVersions, render
from workers.handlers.sync.room_sections import pagination_token
from workers.model import Event
from workers.storage import events as store

_ROOM_TOKEN = re.compile(r"^t(-?[0-9]{1,19})$")
MAX_LIMIT = 1000
#: Database pages read for one answer at most when visibility hides events.
MAX_SCANS = 8


class NotAMember(Exception):
    """The user was never in the room (403)."""


class Messages:
    def __init__(
        self,
        pool: asyncpg.Pool,
        caches: SyncCaches,
        decode: Callable[[str], Awaitable[SyncToken]],
        current: Callable[[], SyncToken],
        room_versions: RoomVersions,
    ) -> None:
        self._pool = pool
        self._versions = room_versions
        self._caches = caches
        self._decode = decode
        self._current = current

    async def position(self, room_id: str, token: str) -> int:
        """The room position a token stands for; InvalidTokenError (or ValueError) if malformed."""
        match = _ROOM_TOKEN.match(token)
        if match:
            return int(match.group(1))
        return await self._sync_position(room_id, await self._decode(token))

    async def _sync_position(self, room_id: str, token: SyncToken) -> int:
        async with self._pool.acquire() as conn:
            last = await store.room_events(
                conn, room_id, after=0, reached=token.get("events"), descending=True, limit=1
            )
        return last[0].stream_ordering if last else 0

    async def event(self, user_id: str, room_id: str, event_id: str) -> Event | None:
        """The event, if it is in `room_id` and `user_id` may see it."""
        async with self._pool.acquire() as conn:
            event = (await store.events_by_ids(conn, [event_id])).get(event_id)
        if event is None or event.room_id != room_id:
            return None
        user_rooms = await self._caches.rooms_for_user.get(user_id)
        visibility = await self._caches.room_visibility.get(room_id)
        history = user_rooms.history.get(room_id, ())
        return event if may_see_event(event, user_id, history, visibility) else None

    async def page(
        self,
        user_id: str,
        room_id: str,
        from_token: str | None,
        to_token: str | None,
        backwards: bool,
        limit: int,
    ) -> dict[str, Any]:
        """The spec's body: `start`, `chunk` (client events with room_id), `end` when there may be
        more, `state` (empty: clients have it from sync). Raises NotAMember."""
        user_rooms = await self._caches.rooms_for_user.get(user_id)
        history = user_rooms.history.get(room_id, ())
        visibility = await self._caches.room_visibility.get(room_id)
        if not history and current(visibility) != WORLD_READABLE:
            raise NotAMember(f"{user_id} is not in {room_id}")
        if from_token is not None:
            start = await self.position(room_id, from_token)
        else:
            start = await self._sync_position(room_id, self._current()) if backwards else -(2**63)
        bound = None if to_token is None else await self.position(room_id, to_token)
        limit = max(1, min(limit, MAX_LIMIT))
        chunk: list[Event] = []
        cursor, exhausted = start, False
        async with self._pool.acquire() as conn:
            for _ in range(MAX_SCANS):
                if backwards:
                    rows = await store.room_events(
                        conn, room_id, after=bound, upto=cursor, descending=True, limit=limit
                    )
                else:
                    rows = await store.room_events(conn, room_id, after=cursor, upto=bound, limit=limit)
                if rows:
                    cursor = rows[-1].stream_ordering - 1 if backwards else rows[-1].stream_ordering
                chunk += [e for e in rows if may_see_event(e, user_id, history, visibility)]
                if len(rows) < limit:
                    exhausted = True
                    break
                if len(chunk) >= limit:
                    break
        version = await self._versions.get(room_id)
        body: dict[str, Any] = {
            "start": from_token if from_token is not None else pagination_token(start),
            "chunk": [render(e, version) for e in chunk[:limit]],
            "state": [],
        }
        if len(chunk) > limit:
            last = chunk[limit - 1].stream_ordering
            cursor = last - 1 if backwards else last
            exhausted = False
        if not exhausted:
            body["end"] = pagination_token(cursor)
        return body
