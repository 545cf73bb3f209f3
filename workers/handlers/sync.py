"""Incremental sync: the events of a user's rooms between two vector-clock tokens, long-polled.

Exactly once, in token order: a response carries the events E of the user's rooms with
`since.pos(E.writer) < E.stream_ordering <= now.pos(E.writer)` and `next_batch = now`. Every
writer's position in `now` only passes finished IDs, so nothing at or below it can still appear;
successive windows (since, now] do not overlap, so nothing comes twice. Tokens are global facts
(a position of a writer), so a client may switch between sync workers: a worker that is behind
the client's token waits (bounded) until it has caught up.

Visibility: an event is visible when the user's membership just after it is `join`, or when it
is the user's own membership event (so they see their own leave). Every event of a room is written
by one persister (workers.routing), so when `now` covers an event it covers every earlier
membership change of that room too.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import asyncpg

from idgen import InstanceMap, MultiWriterIdGenerator, MultiWriterStreamToken, SyncToken
from workers.handlers.caches import SyncCaches
from workers.handlers.notifier import Notifier
from workers.model import MEMBER_EVENT, Event, UserRooms
from workers.storage import events as store

#: The streams a sync token has a component for, in text order.
SYNC_STREAMS = ("events", "caches")
CATCH_UP_WAIT_S = 10.0


class SyncHandler:
    def __init__(
        self,
        pool: asyncpg.Pool,
        caches: SyncCaches,
        notifier: Notifier,
        generators: dict[str, MultiWriterIdGenerator],
        instance_map: InstanceMap,
        *,
        catch_up_wait_s: float = CATCH_UP_WAIT_S,
        max_events: int = 1000,
    ) -> None:
        self._pool = pool
        self._caches = caches
        self._notifier = notifier
        self._generators = generators
        self._writers = tuple(generators["events"].writers)
        self._instance_map = instance_map
        self._catch_up_wait_s = catch_up_wait_s
        self._max_events = max_events
        self.syncs = 0
        self.behind_timeouts = 0
        self.closing = False

    def current_token(self) -> SyncToken:
        return SyncToken(
            {s: MultiWriterStreamToken.from_generator(self._generators[s]) for s in SYNC_STREAMS}
        )

    async def encode(self, token: SyncToken) -> str:
        return await self._instance_map.encode_sync_token(token, SYNC_STREAMS)

    async def decode(self, text: str) -> SyncToken:
        """Parse a client's token; InvalidTokenError if malformed or naming unknown instances."""
        return await self._instance_map.decode_sync_token(text, SYNC_STREAMS)

    async def sync(self, user_id: str, since_text: str | None, timeout_s: float) -> dict[str, Any]:
        """Events after `since` (waiting up to `timeout_s` for some), and `next_batch`.

        Without `since` this is an initial sync: no events, just the current token to start from.
        """
        self.syncs += 1
        if since_text is None:
            return {"events": [], "next_batch": await self.encode(self.current_token())}
        since = await self.decode(since_text)
        since = await self._bounded(since)
        if not await self._wait_until_covered(since):
            # We are behind the client and did not catch up in time: an empty answer, same token.
            self.behind_timeouts += 1
            return {"events": [], "next_batch": since_text}
        deadline = time.monotonic() + timeout_s
        while True:
            # The token first, then the caches: whatever a cache returns now reflects every row up to
            # `now` (rows are invalidated before positions advance, and a load started after `now`
            # reads committed rows). The other order could pair a stale room list with a newer token.
            moved = self._notifier.generation
            now = self.current_token().merge(since)
            user_rooms = await self._caches.rooms_for_user.get(user_id)
            with self._notifier.waiter(user_id, user_rooms.rooms) as waiter:
                events, now = await self._events_between(user_id, user_rooms, since, now)
                remaining = deadline - time.monotonic()
                if events or remaining <= 0 or self.closing:
                    return {
                        "events": [e.client_dict() for e in events],
                        "next_batch": await self.encode(now),
                    }
                if self._notifier.generation == moved:
                    # Registered before anything newer than `now` could notify: no lost wake-up.
                    await waiter.wait(remaining)

    async def room_state(self, user_id: str, room_id: str) -> list[tuple[tuple[str, str], str]] | None:
        """The room's current state, or None when the user is not joined."""
        async with self._pool.acquire() as conn:
            if await store.membership(conn, user_id, room_id) != "join":
                return None
        state = await self._caches.current_state.get(room_id)
        return sorted(state.items())

    async def _bounded(self, since: SyncToken) -> SyncToken:
        """Clamp components beyond anything ever allocated (a forged or pre-reset token)."""
        now = self.current_token()
        if since.is_before_or_eq(now):
            return since
        maxima = {s: await self._generators[s].get_max_allocated_token() for s in SYNC_STREAMS}
        return since.bound(maxima)

    async def _wait_until_covered(self, since: SyncToken) -> bool:
        deadline = time.monotonic() + self._catch_up_wait_s
        while not since.is_before_or_eq(self.current_token()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self._notifier.wait_for_position(min(remaining, 0.5))
        return True

    async def _events_between(
        self, user_id: str, user_rooms: UserRooms, since: SyncToken, now: SyncToken
    ) -> tuple[list[Event], SyncToken]:
        """Visible events in (since, now] for the events component; may shrink `now` to a page."""
        low, high = since.get("events"), now.get("events")
        if not user_rooms.rooms:
            return [], now
        writers = set(low.instance_map) | set(high.instance_map) | set(self._writers)
        windows = {
            w: (low.get_stream_pos_for_instance(w), high.get_stream_pos_for_instance(w))
            for w in writers
            if low.get_stream_pos_for_instance(w) < high.get_stream_pos_for_instance(w)
        }
        windows |= {w: (0, 0) for w in writers if w not in windows}
        async with self._pool.acquire() as conn:
            candidates = await store.events_for_rooms(
                conn, user_rooms.rooms, windows, (low.stream, high.stream)
            )
            if not candidates:
                return [], now
            if len(candidates) > self._max_events:
                # Page: stop at a linear position so the next window starts exactly after it.
                # Each writer's position becomes max(since, min(now, cut)): exactly what was returned.
                cut = candidates[self._max_events - 1].stream_ordering
                candidates = [e for e in candidates if e.stream_ordering <= cut]
                page = high.bound_stream_token(cut).copy_and_advance(low)
                now = SyncToken({**{s: now.get(s) for s in now.streams()}, "events": page})
        return [e for e in candidates if _visible(e, user_id, user_rooms.history)], now


def _visible(event: Event, user_id: str, history: dict[str, tuple[tuple[int, str], ...]]) -> bool:
    if event.type == MEMBER_EVENT and event.state_key == user_id:
        return True
    changes = history.get(event.room_id, ())
    index = bisect.bisect_right(changes, (event.stream_ordering, "\uffff")) - 1
    return index >= 0 and changes[index][1] == "join"
