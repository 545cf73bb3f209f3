"""`GET /rooms/{roomId}/messages`: a room's events page by page, backwards or forwards.

Positions in a room are stream orderings: every event of a room takes its stream id from the same
sequence, so they order the room's events completely (backfilled ones are negative, older than
any live one). A pagination token is `t<ordering>`, "just after that event"; a sync token (a
`next_batch`) also works as `from`, standing for its position of the room's writer.

Who sees what follows sync: events from the user's joins on, up to their leave; backfilled history
(negative orderings) is shown to current members.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from idgen import SyncToken
from workers.handlers.caches import SyncCaches
from workers.handlers.room_versions import RoomVersions, render
from workers.handlers.sync_rooms import pagination_token
from workers.model import MEMBER_EVENT, Event
from workers.routing import writer_for_room
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
        event_writers: Sequence[str],
        decode: Callable[[str], Awaitable[SyncToken]],
        current: Callable[[], SyncToken],
        room_versions: RoomVersions,
    ) -> None:
        self._pool = pool
        self._versions = room_versions
        self._caches = caches
        self._writers = list(event_writers)
        self._decode = decode
        self._current = current

    async def position(self, room_id: str, token: str) -> int:
        """The room position a token stands for; InvalidTokenError (or ValueError) if malformed."""
        match = _ROOM_TOKEN.match(token)
        if match:
            return int(match.group(1))
        return self._sync_position(room_id, await self._decode(token))

    def _sync_position(self, room_id: str, token: SyncToken) -> int:
        return token.get("events").get_stream_pos_for_instance(writer_for_room(room_id, self._writers))

    async def event(self, user_id: str, room_id: str, event_id: str) -> Event | None:
        """The event, if it is in `room_id` and `user_id` may see it."""
        async with self._pool.acquire() as conn:
            event = (await store.events_by_ids(conn, [event_id])).get(event_id)
        if event is None or event.room_id != room_id:
            return None
        user_rooms = await self._caches.rooms_for_user.get(user_id)
        return event if _visible_now(event, user_id, user_rooms.history.get(room_id)) else None

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
        history = user_rooms.history.get(room_id)
        if not history:
            raise NotAMember(f"{user_id} is not in {room_id}")
        joined_now = history[-1][1] == "join"
        if from_token is not None:
            start = await self.position(room_id, from_token)
        else:
            start = self._sync_position(room_id, self._current()) if backwards else -(2**63)
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
                chunk += [e for e in rows if _visible(e, user_id, history, joined_now)]
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


def _visible_now(event: Event, user_id: str, history: Sequence[tuple[int, str]] | None) -> bool:
    """`_visible` for a user with this membership history in the room (none: never a member)."""
    if not history:
        return False
    return _visible(event, user_id, history, history[-1][1] == "join")


def _visible(event: Event, user_id: str, history: Sequence[tuple[int, str]], joined_now: bool) -> bool:
    if event.stream_ordering < 0:
        return joined_now
    if event.type == MEMBER_EVENT and event.state_key == user_id:
        return True
    index = bisect.bisect_right(history, (event.stream_ordering, "\uffff")) - 1
    return index >= 0 and history[index][1] == "join"
