"""Incremental sync: the events of a user's rooms between two vector-clock tokens, long-polled.

Exactly once, in token order: a response carries the events E of the user's rooms with
`since.pos(E.writer) < E.stream_ordering <= now.pos(E.writer)` and `next_batch = now`. Every
writer's position in `now` only passes finished IDs, so nothing at or below it can still appear;
successive windows (since, now] do not overlap, so nothing comes twice. Tokens are global facts
(a position of a writer), so a client may switch between sync workers: a worker that is behind
the client's token waits, at most the request's timeout, until it has caught up. When no stream
moved past `since` (the current token merged with it is `since`), every window is empty for every
user: the poll parks without building one and, at its timeout, answers the empty sections.

Visibility (`workers.handlers.rooms.history_visibility`): the user's own membership events, the events
sent while it was joined, and, within one window, the earlier events its room's history
visibility lets it see when it joins later in that window. Every event of a room is written by
one persister (workers.routing), so when `now` covers an event it covers every earlier
membership change of that room too.

The answer is the Matrix `/sync` body (`workers.handlers.sync.room_sections` places each room under
`rooms.join`, `invite`, `knock` or `leave` by the user's own membership events in the window). An
initial sync (no `since`) answers at once with every joined room's recent timeline and state, the
invites and knocks, and the left rooms Synapse lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from idgen import InstanceMap, MultiWriterIdGenerator, MultiWriterStreamToken, SyncToken
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.notify.notifier import Notifier, poll_deadline
from workers.handlers.rooms.history_visibility import JOINED, current
from workers.handlers.rooms.versions import RoomVersions
from workers.handlers.sync.catch_up import CatchUp, covered
from workers.handlers.sync.filter import SyncFilter
from workers.handlers.sync.recent_events import EventBodies, RecentEvents
from workers.handlers.sync.room_sections import PENDING, RoomSections, empty_response
from workers.handlers.sync.shared_answers import SharedAnswers, answer_key
from workers.handlers.sync.stored_sections import STORED_STREAMS, StoredSections, StoredUpdates
from workers.handlers.sync.token_texts import MAX_REMEMBERED_TOKENS, TokenTexts
from workers.handlers.sync.window import EventWindow, recent_timeline
from workers.model import MEMBER_EVENT, Event, UserRooms
from workers.storage import events as store
from workers.storage import forgotten_rooms
from workers.storage import rooms as room_store

log = logging.getLogger(__name__)

#: The streams a sync token has a component for, in text order (a token from before a stream was
#: added has no component for it, which reads as the stream's start).
SYNC_STREAMS = ("events", "caches", "typing", "presence", *STORED_STREAMS)
#: The components that order tokens (waits, bounds): the in-memory streams' tokens restart with
#: their writer, so, as in Synapse, they say nothing about which token came first.
ORDERED_STREAMS = ("events", "caches", *STORED_STREAMS)


class EphemeralSource(Protocol):
    """Typing and presence for /sync (`workers.assembly.ephemeral.Ephemeral` is one)."""

    def ephemeral_tokens(self) -> tuple[int, int]:
        """(typing, presence) current tokens."""
        ...

    def typing_events(self, room_ids: Iterable[str], since: int | None) -> dict[str, dict[str, Any]]: ...

    async def presence_events(self, user_id: str, since: int | None, upto: int) -> list[dict[str, Any]]: ...


CATCH_UP_WAIT_S = 10.0
#: The state events an invitee is shown (with the member events, filtered to theirs).
STRIPPED_STATE = frozenset(
    {"m.room.create", "m.room.join_rules", "m.room.name", "m.room.avatar", "m.room.canonical_alias",
     "m.room.topic", "m.room.encryption"}
)  # fmt: skip


def _ignore(_seconds: float) -> None:
    pass


def _nothing() -> None:
    pass


def _ignore_kind(_kind: str, _seconds: float) -> None:
    pass


def _kind(news: bool, woken_at: float | None, timeout_s: float) -> str:
    """An incremental answer's kind (see `SyncObservers`)."""
    if news:
        return "incremental" if woken_at is None else "woken"
    return "timeout" if timeout_s > 0 else "incremental"


@dataclass(frozen=True)
class SyncObservers:
    """Where the sync handler reports what operators watch: latencies in seconds (from the notify
    that woke a long-poll to its answer; from an event's persist to the woken answer carrying it),
    a `since` clamped because it lies beyond every sequence (a restored database or a forgery),
    a `since` this worker did not catch up with in time, and each answer's time by its kind
    (`initial`; `incremental`: answered without waiting; `woken`: answered after a wake-up;
    `timeout`: waited the whole timeout; a `since` not caught up with is `behind` alone)."""

    wake: Callable[[float], None] = _ignore
    visible: Callable[[float], None] = _ignore
    clamped: Callable[[], None] = _nothing
    behind: Callable[[], None] = _nothing
    answered: Callable[[str, float], None] = _ignore_kind


class SyncHandler:
    """/sync for one worker: `sync(...)` answers an initial sync, or the window since a token
    (long-polled until something the user may see arrives or the timeout ends); it also encodes
    and decodes tokens and serves a room's state. The window's events come from `EventWindow`, the
    stored streams' sections from `StoredSections`, typing and presence from `EphemeralSource`."""

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
        observers: SyncObservers | None = None,
        room_versions: RoomVersions | None = None,
        recent: RecentEvents,
    ) -> None:
        self.observers = observers or SyncObservers()
        self.room_versions = room_versions or RoomVersions(pool, 10_000)
        self._pool = pool
        self._caches = caches
        self._notifier = notifier
        self._generators = generators
        self._instance_map = instance_map
        self._catch_up_wait_s = catch_up_wait_s
        self._max_events = max_events
        #: Fed by the worker with every live event it applies (see `workers.handlers.sync.recent_events`).
        self.recent = recent
        self.bodies = EventBodies(pool)
        self.window = EventWindow(pool, caches, generators["events"], recent, self.bodies, max_events)
        self.syncs = 0
        self.behind_timeouts = 0
        self._texts = TokenTexts(instance_map, SYNC_STREAMS)
        self.token_cache = self._texts.counts
        self.encode, self.decode = self._texts.encode, self._texts.decode
        #: Typing and presence, set once the worker has built them (None: empty sections).
        self.ephemeral: EphemeralSource | None = None
        #: Account data, to-device and device lists, set once the worker has built them.
        self.stored: StoredSections | None = None
        self.closing = False
        #: Answers that readers woken alike share (the /sync route encodes through it).
        self.answers = SharedAnswers()
        self._ordered_streams = [s for s in ORDERED_STREAMS if s in generators]
        self._catch_up = CatchUp(
            self.current_token, generators, ORDERED_STREAMS, notifier, self.observers.clamped
        )
        #: (the generators' position versions and the ephemeral tokens, the token they make).
        self._current: tuple[tuple[int, ...], SyncToken] = ((), SyncToken({}))
        #: id(since) -> (since, the current token merged with it, whether that is `since`), for
        #: the current token `_merged_into`.
        self._merged: dict[int, tuple[SyncToken, SyncToken, bool]] = {}
        self._merged_into: SyncToken | None = None

    def current_token(self) -> SyncToken:
        """This worker's token now. Built again only when a position moved (every long-poll asks
        for it twice: as it arrives and as it answers)."""
        key = tuple(self._generators[s].positions_version for s in self._ordered_streams)
        if self.ephemeral is not None:
            key += self.ephemeral.ephemeral_tokens()
        if key != self._current[0]:
            self._current = (key, self._build_current_token())
        return self._current[1]

    def _now(self, since: SyncToken) -> tuple[SyncToken, bool]:
        """The current token merged with `since`, and whether that is `since` (no stream moved
        past it). Remembered per `since` object until a position moves: the polls a wake answers
        come back with one `next_batch`, parsed once."""
        current = self.current_token()
        if current is not self._merged_into:
            self._merged.clear()
            self._merged_into = current
        found = self._merged.get(id(since))
        if found is not None and found[0] is since:  # the entry holds `since`: its id is not reused
            return found[1], found[2]
        now = current.merge(since)
        quiet = now == since
        if len(self._merged) < MAX_REMEMBERED_TOKENS:
            self._merged[id(since)] = (since, now, quiet)
        return now, quiet

    def _build_current_token(self) -> SyncToken:
        tokens = {
            s: MultiWriterStreamToken.from_generator(self._generators[s])
            for s in ORDERED_STREAMS
            if s in self._generators
        }
        if self.ephemeral is not None:
            typing, presence = self.ephemeral.ephemeral_tokens()
            tokens |= {"typing": MultiWriterStreamToken(typing), "presence": MultiWriterStreamToken(presence)}
        return SyncToken(tokens)

    def _answered(self, kind: str, started: float, body: dict[str, Any]) -> dict[str, Any]:
        self.observers.answered(kind, time.monotonic() - started)
        return body

    async def sync(
        self,
        user_id: str,
        since_text: str | None,
        timeout_s: float,
        *,
        full_state: bool = False,
        sync_filter: SyncFilter | None = None,
        device_id: str | None = None,
    ) -> dict[str, Any]:
        """The Matrix /sync body of `user_id`'s `device_id`: what changed after `since` (waiting up
        to `timeout_s` for something), or, without `since`, the initial sync. InvalidTokenError for
        a malformed token."""
        self.syncs += 1
        started_ns = time.monotonic_ns()
        started = started_ns / 1e9  # the same clock as time.monotonic()
        sync_filter = sync_filter or SyncFilter()
        if since_text is None:
            return await self._initial(user_id, device_id, sync_filter)
        given = await self.decode(since_text)
        since = given
        if not covered(since, self.current_token(), ORDERED_STREAMS):
            reached = await self._catch_up.reach(since, min(timeout_s, self._catch_up_wait_s))
            if reached is None:
                # We are behind the client and did not catch up in time: nothing new, same token.
                self.behind_timeouts += 1
                self.observers.behind()
                return empty_response(since_text)
            since = reached
        clock = asyncio.get_running_loop().time
        deadline = poll_deadline(clock(), timeout_s)
        timed_out = False
        woken_at: float | None = None
        while True:
            # The token first, then the caches: whatever a cache returns now reflects every row up to
            # `now` (rows are invalidated before positions advance, and a load started after `now`
            # reads committed rows). The other order could pair a stale room list with a newer token.
            moved = self._notifier.generation
            now, quiet = self._now(since)
            user_rooms = await self._caches.rooms_for_user.get(user_id)
            with self._notifier.waiter(user_id, user_rooms.rooms, device_id) as waiter:
                if quiet and not full_state and not self._owes_clean_up(user_id, device_id, since):
                    # No stream moved past `since`: every window is empty, for every user.
                    if timed_out or clock() >= deadline or self.closing:
                        next_batch = since_text if since is given else await self.encode(since)
                        body = await self._nothing_new(next_batch, user_id, device_id)
                        return self._answered(_kind(False, None, timeout_s), started, body)
                    if self._notifier.generation == moved:
                        timed_out = not await waiter.wait(deadline)
                        woken_at = waiter.woken_at or woken_at
                    continue
                events, now = await self.window.between(user_id, user_rooms, since, now, sync_filter)
                typing, presence = await self._ephemeral(user_id, user_rooms, sync_filter, since, now)
                stored, now = await self._stored(user_id, device_id, user_rooms, since, now, events)
                due = timed_out or clock() >= deadline
                if events or typing or presence or stored or full_state or due or self.closing:
                    await self._add_key_counts(stored, user_id, device_id, started_ns)
                    body = await self._window_answer(
                        user_id, user_rooms, sync_filter, full_state, events, typing, presence, stored, now
                    )
                    if woken_at is not None and events:
                        self._observe(woken_at, events)
                    news = bool(events or typing or presence or stored or full_state or self.closing)
                    return self._answered(_kind(news, woken_at, timeout_s), started, body)
                if self._notifier.generation == moved:
                    # Registered before anything newer than `now` could notify: no lost wake-up.
                    timed_out = not await waiter.wait(deadline)
                    woken_at = waiter.woken_at or woken_at

    async def _window_answer(
        self,
        user_id: str,
        user_rooms: UserRooms,
        sync_filter: SyncFilter,
        full_state: bool,
        events: list[Event],
        typing: dict[str, dict[str, Any]],
        presence: list[dict[str, Any]],
        stored: StoredUpdates,
        now: SyncToken,
    ) -> dict[str, Any]:
        """An incremental answer's body: the window's rooms, placed and with their state, and the
        ephemeral and stored sections (the key counts already in `stored`); the body another
        reader got, when its answer is the same (`workers.handlers.sync.shared_answers`)."""
        next_batch = await self.encode(now)
        own_news = bool(typing or presence or full_state)
        key = answer_key(user_id, next_batch, sync_filter, events, own_news, stored)
        kept = self.answers.get(key)
        if kept is not None:
            return kept
        sections = RoomSections(user_id, sync_filter)
        sections.add_window(events)
        for room_id in sections.newly_joined():
            if current(await self._caches.room_visibility.get(room_id)) != JOINED:
                sections.history_hidden_before(room_id)
        if full_state:
            sections.want_full_state(r for r in user_rooms.joined() if sync_filter.includes(r))
        sections.add_ephemeral(typing, presence)
        sections.add_stored(stored)
        await sections.load_state(self._state_events, self._state_at, self._pending_state)
        versions = await self.room_versions.of_rooms(sections.rooms())
        body = sections.response(next_batch, versions)
        self.answers.keep(key, body)
        return body

    def _owes_clean_up(self, user_id: str, device_id: str | None, since: SyncToken) -> bool:
        return self.stored is not None and self.stored.owes_clean_up(user_id, device_id, since)

    async def _nothing_new(self, next_batch: str, user_id: str, device_id: str | None) -> dict[str, Any]:
        """The answer of a window in which no stream moved: the empty sections and the device's
        key counts (what the full path answers for it, without building it)."""
        body = empty_response(next_batch)
        if self.stored is not None and device_id is not None:
            stored = StoredUpdates()
            await self.stored.add_key_counts(stored, user_id, device_id)
            body["device_one_time_keys_count"] = stored.one_time_key_counts
            body["device_unused_fallback_key_types"] = stored.unused_fallback_key_types
        return body

    def _observe(self, woken_at: float, events: list[Event]) -> None:
        self.observers.wake(time.monotonic() - woken_at)
        now_ms = time.time() * 1000
        for event in events:
            self.observers.visible(max(0.0, now_ms - event.received_ts) / 1000)

    async def _initial(self, user_id: str, device_id: str | None, sync_filter: SyncFilter) -> dict[str, Any]:
        """Every joined room with its recent timeline (as far back as its history visibility lets
        the user see) and state, every pending invite and knock, and the rooms the user left: as
        Synapse does, the ones it was kicked or banned from always, the ones it left itself with
        the filter's `include_leave`; all as of the current token.

        The rooms' history visibility is read before the connection is taken: a cache miss loads
        on a connection of its own, and a request holding one while it waits for another would
        deadlock once as many initial syncs as the pool has connections run at once."""
        started = time.monotonic()
        now = self.current_token()
        user_rooms = await self._caches.rooms_for_user.get(user_id)
        events = now.get("events")
        sections = RoomSections(user_id, sync_filter)
        last: dict[int, tuple[str, tuple[tuple[int, str], ...]]] = {}
        visibility = {
            room_id: await self._caches.room_visibility.get(room_id)
            for room_id, history in user_rooms.history.items()
            if history and sync_filter.includes(room_id)
        }
        async with self._pool.acquire() as conn:
            for room_id, history in sorted(user_rooms.history.items()):
                if not sync_filter.includes(room_id) or not history:
                    continue
                position, membership = history[-1]
                if membership == "join":
                    recent = await recent_timeline(
                        conn, room_id, history=history, upto=None, reached=events,
                        sections=sections, visibility=visibility[room_id],
                    )  # fmt: skip
                    sections.add_joined_room(room_id, recent)
                else:
                    last[position] = (room_id, history)
            for position, event in (await store.events_at(conn, list(last))).items():
                room_id, history = last[position]
                if event.membership in PENDING:
                    sections.add_pending(event)
                elif event.membership == "ban" or event.sender != user_id or sync_filter.include_leave:
                    recent = await recent_timeline(
                        conn, room_id, history=history, upto=position, reached=events,
                        sections=sections, visibility=visibility[room_id],
                    )  # fmt: skip
                    sections.add_left_room(room_id, recent)
        sections.add_ephemeral(*await self._ephemeral(user_id, user_rooms, sync_filter, None, now))
        stored, now = await self._stored(user_id, device_id, user_rooms, None, now, [])
        await self._add_key_counts(stored, user_id, device_id, 0)
        sections.add_stored(stored)
        await self._drop_forgotten(user_id, user_rooms, sections)
        await sections.load_state(self._state_events, self._state_at, self._pending_state)
        return self._answered("initial", started, await self._response(sections, now))

    async def _drop_forgotten(self, user_id: str, user_rooms: UserRooms, sections: RoomSections) -> None:
        """Leave out of an initial sync the left rooms the user forgot (one indexed read, only when a
        left room is listed). An incremental window still carries a leave the user forgot later:
        the leave event is delivered once, like every other."""
        if not sections.leave:
            return
        async with self._pool.acquire() as conn:
            positions = await forgotten_rooms.forgotten_positions(conn, user_id)
        sections.forget(forgotten_rooms.forgotten(user_rooms, positions))

    async def _response(self, sections: RoomSections, now: SyncToken) -> dict[str, Any]:
        versions = await self.room_versions.of_rooms(sections.rooms())
        return sections.response(await self.encode(now), versions)

    async def _stored(
        self,
        user_id: str,
        device_id: str | None,
        user_rooms: UserRooms,
        since: SyncToken | None,
        now: SyncToken,
        events: list[Event],
    ) -> tuple[StoredUpdates, SyncToken]:
        if self.stored is None:
            return StoredUpdates(), now
        return await self.stored.collect(user_id, device_id, user_rooms, since, now, events)

    async def _add_key_counts(self, into: StoredUpdates, user: str, device: str | None, began: int) -> None:
        if self.stored is not None and device is not None:
            await self.stored.add_key_counts(into, user, device, began)

    async def _ephemeral(
        self,
        user_id: str,
        user_rooms: UserRooms,
        sync_filter: SyncFilter,
        since: SyncToken | None,
        now: SyncToken,
    ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """Typing per joined room and presence events that changed after `since` (all current
        ones when None), up to `now`."""
        if self.ephemeral is None:
            return {}, []
        rooms = [r for r in user_rooms.joined() if sync_filter.includes(r)]
        typing = self.ephemeral.typing_events(rooms, None if since is None else since.get("typing").stream)
        presence = await self.ephemeral.presence_events(
            user_id, None if since is None else since.get("presence").stream, now.get("presence").stream
        )
        return typing, presence

    async def _state_events(self, room_id: str, members: set[str] | None = None) -> list[Event]:
        """The room's current state as events; with `members`, only those members' member events
        (lazy-loaded members: a large room's other member events are never read)."""
        state = await self._caches.current_state.get(room_id)
        ids = [
            event_id for (kind, key), event_id in sorted(state.items())
            if members is None or kind != MEMBER_EVENT or key in members
        ]  # fmt: skip
        found = await self.bodies.get(ids)
        return [found[i] for i in ids if i in found]

    async def _state_at(self, room_id: str, last: Event) -> list[Event]:
        """The room's state as of `last` (every event of a room has one writer, so the room's
        orderings are its order)."""
        async with self._pool.acquire() as conn:
            return await store.state_at(conn, room_id, last.stream_ordering)

    async def _pending_state(self, room_id: str, event: Event) -> list[dict[str, Any]]:
        """The stripped state shown with the user's invite or knock `event`, as of that event: the
        room's name, topic, ... (for a room on another server, what its invite carried). The
        section adds `event` itself, so the user's own member event is left out here."""
        async with self._pool.acquire() as conn:
            here = await store.state_at(conn, room_id, event.stream_ordering, types=sorted(STRIPPED_STATE))
            remote = await room_store.remote_invite_state(conn, str(event.state_key), room_id) or []
        stripped = [e.stripped() for e in here if e.type != MEMBER_EVENT]
        seen = {(e["type"], e["state_key"]) for e in stripped} | {(MEMBER_EVENT, event.state_key)}
        return [e for e in remote if (e.get("type"), e.get("state_key")) not in seen] + stripped

    async def room_state(self, user_id: str, room_id: str) -> list[Event] | None:
        """The room's current state, or None when the user is not joined."""
        async with self._pool.acquire() as conn:
            if await store.membership(conn, user_id, room_id) != "join":
                return None
        return await self._state_events(room_id)
