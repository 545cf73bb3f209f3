"""Sorting a sync window's events into the rooms of a Matrix `/sync` answer.

Pure bookkeeping, tested on its own: `RoomSections` takes the visible events of (since, now] in
stream order (or, for an initial sync, each joined room's recent events) and places each room by
the user's own membership events in the window (`place_room`), as the spec and Synapse do:
* the last one is a join, or there is none -> `rooms.join` with every visible event of the window;
  a room the user joined inside the window (or every joined room with `full_state`) also gets
  the current state, minus what the timeline holds;
* the last one is a leave or ban -> `rooms.leave`, the timeline up to and including it; a room
  the user joined and left inside the window gets the state as of the leave;
* the last one is an invite or a knock (a membership that waits outside the room) ->
  `rooms.invite` / `rooms.knock` with the stripped state as of that event and the event itself as
  its last entry. When the window also holds a leave or ban of the user, the room is under
  `rooms.leave` too, its timeline up to the last of them: the events the user saw while joined
  are delivered, and the invite is delivered once, in the window it falls in. An invite or knock
  followed by another one in the same window with no leave, ban or join between is superseded:
  only the last is delivered (Synapse does the same).
A timeline longer than the filter's limit (an initial sync's room; an incremental window is paged
by the sync handler instead) keeps its last events, says `limited`, and carries the state events it
skipped (the last of each (type, state_key)) in `state`, so a client's view of the room stays right.
`prev_batch` is a room pagination token for /messages (`workers.handlers.sync.messages`). The stored
streams' sections (`workers.handlers.sync.stored_sections`) go in as they come, a joined room's account data
listing that room.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.handlers.rooms.versions import RoomVersion, render
from workers.handlers.sync.filter import SyncFilter
from workers.handlers.sync.stored_sections import StoredUpdates
from workers.model import MEMBER_EVENT, Event

#: (room, the members whose member events are wanted (None: every member)) -> the room's
#: current state events.
StateLoader = Callable[[str, "set[str] | None"], Awaitable[list[Event]]]
#: (room, the last event the state must reflect) -> the room's state events as of that event.
StateAtLoader = Callable[[str, Event], Awaitable[list[Event]]]
#: (room, the user's invite or knock event) -> the stripped state events shown with it, as of that
#: event, without the user's own member event (the section adds the event itself).
PendingStateLoader = Callable[[str, Event], Awaitable[list[dict[str, Any]]]]

#: Memberships that wait outside the room: the room is listed in the section of that name.
PENDING = ("invite", "knock")
#: Memberships that end the user's time in the room.
ENDED = ("leave", "ban")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one room of a window goes (see the module docstring): a `join` timeline, a `leave`
    timeline, the pending invite or knock, and whether the user joined inside the window."""

    join: Sequence[Event] | None = None
    leave: Sequence[Event] | None = None
    pending: Event | None = None
    joined_in_window: bool = False


def place_room(user_id: str, events: Sequence[Event]) -> Placement:
    """Place a room by `user_id`'s own membership events among its visible `events` of one window
    (in stream order)."""
    own = [
        (i, e.membership)
        for i, e in enumerate(events)
        if e.type == MEMBER_EVENT and e.state_key == user_id and e.membership is not None
    ]
    joined = any(m == "join" for _, m in own)
    if not own or own[-1][1] == "join":
        return Placement(join=events, joined_in_window=joined)
    last_index, last = own[-1]
    if last in ENDED:
        return Placement(leave=events, joined_in_window=joined)
    ended = [i for i, m in own if m in ENDED]
    leave = events[: ended[-1] + 1] if ended else None
    return Placement(leave=leave, pending=events[last_index], joined_in_window=joined)


def pagination_token(stream_ordering: int) -> str:
    """A room position for /messages: just after the event with this stream ordering."""
    return f"t{stream_ordering}"


def empty_response(next_batch: str) -> dict[str, Any]:
    return {
        "next_batch": next_batch,
        "rooms": {"join": {}, "invite": {}, "leave": {}, "knock": {}},
        "presence": {"events": []},
        "account_data": {"events": []},
        "to_device": {"events": []},
        "device_lists": {"changed": [], "left": []},
        "device_one_time_keys_count": {},
    }


@dataclass(slots=True)
class _Room:
    timeline: list[Event] = field(default_factory=list)
    limited: bool = False
    skipped_state: dict[tuple[str, str], Event] = field(default_factory=dict)
    full_state: bool = False
    #: The user joined inside the window (a room whose earlier history it may now see).
    joined_in_window: bool = False
    #: A left room the user joined inside the window: its state as of the leave.
    state_at_end: bool = False
    state: list[Event] = field(default_factory=list)
    ephemeral: list[dict[str, Any]] = field(default_factory=list)
    account_data: list[dict[str, Any]] = field(default_factory=list)


class RoomSections:
    """One answer's rooms, as `sync_filter` shapes them (its timeline filter chooses what each
    timeline shows; the rooms' sections come from the user's own membership events regardless)."""

    def __init__(self, user_id: str, sync_filter: SyncFilter) -> None:
        self.user_id = user_id
        self.filter = sync_filter
        self.limit = sync_filter.timeline_limit
        self.join: dict[str, _Room] = {}
        self.leave: dict[str, _Room] = {}
        #: room -> the user's invite or knock event; its section is the event's membership.
        self.pending: dict[str, Event] = {}
        self.pending_state: dict[str, list[dict[str, Any]]] = {}
        self.presence: list[dict[str, Any]] = []
        self.stored = StoredUpdates()

    def shown(self, event: Event) -> bool:
        """Whether the timeline filter shows `event`."""
        return self.filter.timeline.allows(event.type, event.sender)

    def add_window(self, events: Sequence[Event]) -> None:
        """The visible events of an incremental sync's window, in stream order."""
        by_room: dict[str, list[Event]] = {}
        for event in events:
            by_room.setdefault(event.room_id, []).append(event)
        for room_id, room_events in by_room.items():
            placed = place_room(self.user_id, room_events)
            if placed.join is not None:
                room = self._window_room(placed.join)
                if room.timeline or room.skipped_state or placed.joined_in_window:
                    self.join[room_id] = room
                    room.full_state = room.joined_in_window = placed.joined_in_window
            if placed.leave is not None:
                room = self.leave[room_id] = self._window_room(placed.leave)
                room.state_at_end = placed.joined_in_window
            if placed.pending is not None:
                self.pending[room_id] = placed.pending

    def _window_room(self, events: Sequence[Event]) -> _Room:
        """A room of an incremental window: the events the filter shows in its timeline, and the
        state events it hides in its state (the client still learns what changed)."""
        if self.filter.timeline.everything:
            return self._room(events, more_before=False)
        room = self._room([e for e in events if self.shown(e)], more_before=False)
        for event in events:
            if event.state_key is not None and not self.shown(event):
                room.skipped_state[(event.type, event.state_key)] = event
        return room

    def add_joined_room(self, room_id: str, recent: Sequence[Event]) -> None:
        """An initial sync's joined room: its last `limit + 1` events the filter shows (more than
        `limit`: limited)."""
        room = self.join[room_id] = self._room(recent, more_before=len(recent) > self.limit)
        room.full_state = True

    def add_left_room(self, room_id: str, recent: Sequence[Event]) -> None:
        """An initial sync's left room: its last `limit + 1` shown events up to the user's leave or
        ban, with the state as of that event."""
        room = self.leave[room_id] = self._room(recent, more_before=len(recent) > self.limit)
        room.state_at_end = True

    def add_pending(self, event: Event) -> None:
        """An initial sync's invite or knock: the user's own member event that set it."""
        self.pending[event.room_id] = event

    def add_ephemeral(self, typing: dict[str, dict[str, Any]], presence: list[dict[str, Any]]) -> None:
        """`m.typing` events of joined rooms (a room with nothing else new is listed for them) and
        `m.presence` events, as the filter's `room.ephemeral` and `presence` let through; typing
        for rooms the user has just left or not joined is dropped."""
        for room_id, event in typing.items():
            if (
                room_id not in self.leave
                and room_id not in self.pending
                and self.filter.ephemeral.select([event])
            ):
                self.join.setdefault(room_id, _Room()).ephemeral.append(event)
        self.presence = self.filter.presence.select(presence)

    def add_stored(self, updates: StoredUpdates) -> None:
        """Account data, receipts, to-device messages, device lists and key counts; a joined room
        whose account data or receipts changed is listed for them (rooms the filter leaves out
        are not)."""
        self.stored = updates
        self.stored.account_data = self.filter.account_data.select(updates.account_data)
        for room_id, events in updates.room_account_data.items():
            wanted = self.filter.room_account_data.select(events)
            if wanted and self._joined_here(room_id):
                self.join.setdefault(room_id, _Room()).account_data.extend(wanted)
        for room_id, receipt in updates.receipts.items():
            if self._joined_here(room_id) and self.filter.ephemeral.select([receipt]):
                self.join.setdefault(room_id, _Room()).ephemeral.append(receipt)

    def _joined_here(self, room_id: str) -> bool:
        """Whether a room the window does not place may be listed under `join` for its ephemeral
        events or account data: the filter includes it, and it is not left or pending."""
        return self.filter.includes(room_id) and room_id not in self.leave and room_id not in self.pending

    def forget(self, room_ids: Iterable[str]) -> None:
        """Leave out of `leave` the rooms the user forgot (`POST /rooms/{roomId}/forget`)."""
        for room_id in room_ids:
            self.leave.pop(room_id, None)

    def history_hidden_before(self, room_id: str) -> None:
        """The user joined `room_id` inside the window and may now see history before the window
        (a `shared`, `invited` or `world_readable` room): the timeline says `limited`, so the
        client pages back from `prev_batch` with /messages."""
        self.join[room_id].limited = True

    def newly_joined(self) -> list[str]:
        """The rooms the user joined inside the window."""
        return [room_id for room_id, room in self.join.items() if room.joined_in_window]

    def want_full_state(self, room_ids: Iterable[str]) -> None:
        for room_id in room_ids:
            self.join.setdefault(room_id, _Room()).full_state = True

    def _room(self, events: Sequence[Event], *, more_before: bool) -> _Room:
        room = _Room(list(events))
        if len(events) > self.limit:
            skipped = room.timeline[: len(events) - self.limit]
            room.timeline = room.timeline[len(events) - self.limit :]
            for event in skipped:
                if event.state_key is not None:
                    room.skipped_state[(event.type, event.state_key)] = event
            room.limited = True
        room.limited = room.limited or more_before
        return room

    async def load_state(
        self, state: StateLoader, state_at: StateAtLoader, pending_state: PendingStateLoader
    ) -> None:
        """Fill in the state of rooms that need it: full state, limited or filtered timelines,
        rooms joined and left inside the window, invites and knocks; then the filter's
        `room.state` and lazy-loaded members."""
        for room_id, room in self.join.items():
            members = self._members(room)
            if room.full_state:
                in_timeline = {e.event_id for e in room.timeline}
                room.state = [e for e in await state(room_id, members) if e.event_id not in in_timeline]
            else:
                room.state = list(room.skipped_state.values())
                if members is not None:
                    room.state += await self._missing_members(room, await state(room_id, members))
            room.state = self._filtered_state(room.state, members)
        for room_id, room in self.leave.items():
            if room.state_at_end and room.timeline:
                in_timeline = {e.event_id for e in room.timeline}
                at_end = await state_at(room_id, room.timeline[-1])
                room.state = [e for e in at_end if e.event_id not in in_timeline]
            else:
                room.state = list(room.skipped_state.values())
            room.state = self._filtered_state(room.state, self._members(room))
        for room_id, event in self.pending.items():
            self.pending_state[room_id] = await pending_state(room_id, event)

    def _members(self, room: _Room) -> set[str] | None:
        """With lazy-loaded members: the members whose member events the state carries (the
        timeline's senders and the user); None: every member."""
        if not self.filter.lazy_load_members:
            return None
        return {e.sender for e in room.timeline} | {self.user_id}

    async def _missing_members(self, room: _Room, current: list[Event]) -> list[Event]:
        """The member events of the timeline's senders that neither the timeline nor the state
        carries (an incremental room with lazy-loaded members: the client may not know them)."""
        have = {(e.type, e.state_key) for e in (*room.timeline, *room.state)}
        senders = {e.sender for e in room.timeline}
        return [
            e for e in current
            if e.type == MEMBER_EVENT and e.state_key in senders and (e.type, e.state_key) not in have
        ]  # fmt: skip

    def _filtered_state(self, events: list[Event], members: set[str] | None) -> list[Event]:
        wanted = self.filter.state
        return [
            e for e in events
            if (wanted.everything or wanted.allows(e.type, e.sender))
            and (members is None or e.type != MEMBER_EVENT or e.state_key in members)
        ]  # fmt: skip

    def rooms(self) -> set[str]:
        """The rooms whose events the response renders."""
        return set(self.join) | set(self.leave) | set(self.pending)

    def response(self, next_batch: str, versions: Mapping[str, RoomVersion]) -> dict[str, Any]:
        """The body, each room's events rendered under its version (`versions` covers `rooms()`)."""
        body = empty_response(next_batch)
        rooms = body["rooms"]
        for room_id, room in self.join.items():
            rooms["join"][room_id] = {
                **self._room_body(room, versions[room_id]),
                "ephemeral": {"events": room.ephemeral},
                "account_data": {"events": room.account_data},
                "unread_notifications": {"highlight_count": 0, "notification_count": 0},
                "summary": {},
            }
        for room_id, room in self.leave.items():
            rooms["leave"][room_id] = {
                **self._room_body(room, versions[room_id]),
                "account_data": {"events": []},
            }
        for room_id, event in self.pending.items():
            kind = str(event.membership)
            stripped = [*self.pending_state.get(room_id, []), render(event, versions[room_id], room_id=False)]
            rooms[kind][room_id] = {f"{kind}_state": {"events": stripped}}
        body["presence"]["events"] = self.presence
        body["account_data"]["events"] = self.stored.account_data
        body["to_device"]["events"] = self.stored.to_device
        body["device_lists"] = {"changed": self.stored.changed, "left": self.stored.left}
        body["device_one_time_keys_count"] = self.stored.one_time_key_counts
        if self.stored.unused_fallback_key_types is not None:
            body["device_unused_fallback_key_types"] = self.stored.unused_fallback_key_types
        return body

    @staticmethod
    def _room_body(room: _Room, version: RoomVersion) -> dict[str, Any]:
        timeline: dict[str, Any] = {
            "events": [render(e, version, room_id=False) for e in room.timeline],
            "limited": room.limited,
        }
        if room.timeline:
            timeline["prev_batch"] = pagination_token(room.timeline[0].stream_ordering - 1)
        return {
            "timeline": timeline,
            "state": {"events": [render(e, version, room_id=False) for e in room.state]},
        }
