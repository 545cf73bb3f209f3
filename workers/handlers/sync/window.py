"""A sync's window of events: the events of a user's rooms between two tokens that the user may
see, paged by the worker's event limit and the filter's timeline limit.

Pages rather than gaps: when the window holds more than `max_events` events, or a room more
visible ones than the filter's timeline limit, the page ends just before the first event that does
not fit, and the next sync continues from there; so a chain of syncs delivers every event and an
incremental timeline never needs `limited`. Who may see what is decided at the end of the page
(a page cut before a user's join shows none of the history the join would open). Read from the
live events a sync worker applied lately (`RecentEvents`) when they cover the window, else from
the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import asyncpg

from idgen import MultiWriterIdGenerator, MultiWriterStreamToken, SyncToken
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.rooms.history_visibility import Changes, all_permissive, may_see_event
from workers.handlers.sync.filter import SyncFilter
from workers.handlers.sync.recent_events import EventBodies, Placed, RecentEvents
from workers.handlers.sync.room_sections import RoomSections
from workers.model import Event, UserRooms
from workers.storage import Conn
from workers.storage import events as store

#: The most events an initial sync reads of a room to find the ones a timeline filter shows.
MAX_RECENT = 1000


class EventWindow:
    """`between(...)`: a sync's visible events and the token they reach."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        caches: SyncCaches,
        events: MultiWriterIdGenerator,
        recent: RecentEvents,
        bodies: EventBodies,
        max_events: int,
    ) -> None:
        self._pool = pool
        self._caches = caches
        self._events = events
        self._recent = recent
        self._bodies = bodies
        self._max_events = max_events

    async def between(
        self, user_id: str, user_rooms: UserRooms, since: SyncToken, now: SyncToken, sync_filter: SyncFilter
    ) -> tuple[list[Event], SyncToken]:
        """Visible events in (since, now] for the events component, and the token they reach.

        Pages rather than gaps: when the window holds more than `max_events` events, or a room more
        visible ones than the filter's timeline limit, `now` shrinks to a linear position just
        before the first event that does not fit, and the next sync continues from there. Each
        writer's position becomes max(since, min(now, cut)): exactly what was returned. So a chain
        of syncs delivers every event, and `limited` is never needed in an incremental timeline."""
        low, high = since.get("events"), now.get("events")
        if not user_rooms.rooms:
            return [], now
        writers = set(low.instance_map) | set(high.instance_map) | set(self._events.writers)
        windows = {
            w: (low.get_stream_pos_for_instance(w), high.get_stream_pos_for_instance(w))
            for w in writers
            if low.get_stream_pos_for_instance(w) < high.get_stream_pos_for_instance(w)
        }
        windows |= {w: (0, 0) for w in writers if w not in windows}
        default, limit = (low.stream, high.stream), self._max_events + 1
        if self._recent.blind_over():
            self._recent.reopen(await self._events.get_max_allocated_token())
        candidates: Sequence[Placed] | None = self._recent.window(user_rooms.rooms, windows, default, limit)
        from_memory = candidates is not None
        if candidates is None:
            async with self._pool.acquire() as conn:
                candidates = await store.events_for_rooms(conn, user_rooms.rooms, windows, default, limit)
        cut = candidates[self._max_events - 1].stream_ordering if len(candidates) > self._max_events else None
        visibility = {r: await self._caches.room_visibility.get(r) for r in {e.room_id for e in candidates}}
        while True:  # each turn cuts earlier, so it ends
            visible, limit_cut = self._page(candidates, cut, user_id, user_rooms, visibility, sync_filter)
            if limit_cut is None:
                break
            cut = limit_cut
        if cut is not None:
            page = high.bound_stream_token(cut).copy_and_advance(low)
            now = SyncToken({**{s: now.get(s) for s in now.streams()}, "events": page})
        if not from_memory:
            return cast("list[Event]", visible), now
        bodies = await self._bodies.get([e.event_id for e in visible])
        return [bodies[e.event_id] for e in visible if e.event_id in bodies], now

    @staticmethod
    def _page(
        candidates: Sequence[Placed],
        cut: int | None,
        user_id: str,
        user_rooms: UserRooms,
        visibility: Mapping[str, Changes],
        sync_filter: SyncFilter,
    ) -> tuple[list[Placed], int | None]:
        """The events of `candidates` up to `cut` that `user_id` may see, and, when a room holds
        more of them than the filter's timeline limit, the earlier cut that ends the page before
        the first one that does not fit (then the page must be made again up to that cut: who may
        see what depends on where the window ends)."""
        # Where the window ends in each room: its last event here. A room's events are in stream
        # order whichever writer wrote them (a room's next writer starts after its last one's
        # last event) and every window holds an unbroken run of them, so a membership change is
        # in the window exactly when it is at or below that.
        room_end = {
            e.room_id: e.stream_ordering for e in candidates if cut is None or e.stream_ordering <= cut
        }
        visible: list[Placed] = []
        per_room: dict[str, int] = {}
        shows = sync_filter.timeline
        for event in candidates:
            if cut is not None and event.stream_ordering > cut:
                break
            if not sync_filter.includes(event.room_id):
                continue
            history, rules = user_rooms.history.get(event.room_id, ()), visibility[event.room_id]
            if not may_see_event(event, user_id, history, rules, room_end[event.room_id]):
                continue
            if shows.everything or shows.allows(event.type, event.sender):
                count = per_room[event.room_id] = per_room.get(event.room_id, 0) + 1
                if count > max(sync_filter.timeline_limit, 1):
                    return visible, event.stream_ordering - 1
            visible.append(event)
        return visible, None


async def recent_timeline(
    conn: Conn,
    room_id: str,
    *,
    history: tuple[tuple[int, str], ...],
    upto: int | None,
    reached: MultiWriterStreamToken,
    sections: RoomSections,
    visibility: Changes,
) -> list[Event]:
    """A room's last `limit + 1` events up to `upto` that the user may see (its history
    visibility) and the timeline filter shows, as far as the token reaches, oldest first.
    A room whose history was always `shared` or wider is read from its end; otherwise up to
    `MAX_RECENT` events are read to find the visible ones."""
    wanted = sections.limit + 1
    open_history = all_permissive(visibility)
    everything = sections.filter.timeline.everything and open_history
    found = await store.room_events(
        conn, room_id, upto=upto, reached=reached,
        descending=True, limit=wanted if everything else MAX_RECENT,
    )  # fmt: skip
    if not everything:
        user_id = sections.user_id
        found = [
            e for e in found
            if sections.shown(e) and (open_history or may_see_event(e, user_id, history, visibility))
        ][:wanted]  # fmt: skip
    return found[::-1]
