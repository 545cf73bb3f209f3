"""Typing notifications: the writer's state with timeouts, and every worker's view for /sync.

Pure logic, no I/O: time is passed in (milliseconds), and the caller publishes what changed.

* `TypingRooms` (the typing writer only): who types where, until when. Every change of a room's
  typing set returns that room's full new list of users; that list is the stream row.
* `TypingView` (every worker, the writer too): the last list per room and the token it came with,
  as replication delivered them; `section()` builds the rooms' `ephemeral` events for /sync.

Typing's sync-token component is the stream's position (`workers.streams.memory`). It is excluded
from "is this token before that one" comparisons, as in Synapse: typing is soft state, and a
restarted writer's snapshot replaces the whole view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAX_TIMEOUT_MS = 30_000
TYPING_EVENT = "m.typing"
TypingChange = tuple[str, tuple[str, ...]]


class TypingRooms:
    """Who is typing in which room, each until an expiry time.

    Contract: `set_typing` and `expire` return the rooms whose set of typing users changed, each
    with its new full list (sorted); an unchanged set returns nothing, so a client re-sending
    "typing" every few seconds costs no replication traffic (only its expiry moves). A timeout is
    capped at `max_timeout_ms`.
    """

    __slots__ = ("_rooms", "max_timeout_ms")

    def __init__(self, max_timeout_ms: int = MAX_TIMEOUT_MS) -> None:
        self.max_timeout_ms = max_timeout_ms
        self._rooms: dict[str, dict[str, float]] = {}

    def set_typing(
        self, room_id: str, user_id: str, typing: bool, timeout_ms: int, now_ms: float
    ) -> list[TypingChange]:
        users = self._rooms.get(room_id)
        if typing:
            expiry = now_ms + max(0, min(timeout_ms, self.max_timeout_ms))
            if users is None:
                users = self._rooms[room_id] = {}
            known = user_id in users
            users[user_id] = expiry
            return [] if known else [(room_id, self.users(room_id))]
        if users is None or users.pop(user_id, None) is None:
            return []
        if not users:
            del self._rooms[room_id]
        return [(room_id, self.users(room_id))]

    def expire(self, now_ms: float) -> list[TypingChange]:
        """Drop every entry whose expiry is at or before `now_ms`."""
        changed: list[TypingChange] = []
        for room_id in list(self._rooms):
            users = self._rooms[room_id]
            gone = [user for user, expiry in users.items() if expiry <= now_ms]
            if not gone:
                continue
            for user in gone:
                del users[user]
            if not users:
                del self._rooms[room_id]
            changed.append((room_id, self.users(room_id)))
        return changed

    def next_expiry_ms(self) -> float | None:
        return min((e for users in self._rooms.values() for e in users.values()), default=None)

    def users(self, room_id: str) -> tuple[str, ...]:
        return tuple(sorted(self._rooms.get(room_id, ())))

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        """Every room with someone typing, and who."""
        return {room_id: self.users(room_id) for room_id in sorted(self._rooms)}


class TypingView:
    """Typing as replication delivered it: per room the latest list and its token."""

    __slots__ = ("_rooms",)

    def __init__(self) -> None:
        self._rooms: dict[str, tuple[int, tuple[str, ...]]] = {}

    def apply(self, token: int, room_id: str, user_ids: Iterable[str]) -> None:
        # Rooms whose typing stopped stay (with no users) so an incremental sync can say so.
        self._rooms[room_id] = (token, tuple(user_ids))

    def reset_rows(self, snapshot: Mapping[str, Iterable[str]]) -> list[TypingChange]:
        """The rows that turn this view into `snapshot`: every snapshot room, and an empty list
        for each room we hold that the snapshot lacks (its typers stopped while we were away)."""
        rows = [(room_id, tuple(users)) for room_id, users in sorted(snapshot.items())]
        rows += [
            (room_id, ())
            for room_id, (_token, users) in sorted(self._rooms.items())
            if users and room_id not in snapshot
        ]
        return rows

    def users(self, room_id: str) -> tuple[str, ...]:
        entry = self._rooms.get(room_id)
        return entry[1] if entry is not None else ()

    def section(self, room_ids: Iterable[str], since: int | None = None) -> dict[str, dict[str, Any]]:
        """For /sync: `{room_id: m.typing event}`; put each value in the room's `ephemeral.events`.

        Without `since` (initial sync): the rooms of `room_ids` where someone types. With `since`
        (the typing component of the client's token): the rooms whose typing changed after it,
        including those where it stopped (`user_ids: []`)."""
        out: dict[str, dict[str, Any]] = {}
        for room_id in room_ids:
            entry = self._rooms.get(room_id)
            if entry is None:
                continue
            token, users = entry
            if (users and since is None) or (since is not None and token > since):
                out[room_id] = {"type": TYPING_EVENT, "content": {"user_ids": list(users)}}
        return out
