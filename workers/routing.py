"""Which writer owns a room, or a user's data: every write of one key goes through one writer.

For rooms that is what makes per-writer tokens enough for visibility: when a reader's token covers
an event of writer W, it covers every earlier event of that room too (W's position only passes
finished IDs), so a membership change can never land "behind" an event a reader already got. For
the user-keyed streams (account data, device lists, to-device) it keeps one user's changes in the
order they were made, while the writers share the users between them.

A room's writer may change while the cluster runs (a persister stops, a room lease moves):
`RoomPlacement` follows the current holder, with the stable choice as the starting guess.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence


def _stable_choice(key: str, writers: Sequence[str], what: str) -> str:
    if not writers:
        raise ValueError(f"the {what} stream has no configured writers")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return writers[int.from_bytes(digest, "big") % len(writers)]


def writer_for_room(room_id: str, writers: Sequence[str]) -> str:
    """A stable choice among `writers` (in configured order) for `room_id`."""
    return _stable_choice(room_id, writers, "events")


def writer_for_user(user_id: str, writers: Sequence[str], stream: str) -> str:
    """A stable choice among `writers` of `stream` (in configured order) for `user_id`'s writes."""
    return _stable_choice(user_id, writers, stream)


class RoomPlacement:
    """Where a room's writes go now (rooms are held as leases, `workers.handlers.room_leases`):
    the holder this worker last learned (from a write's answer or a writer naming the holder),
    unless that writer was found unavailable lately; else the stable choice among the writers not
    found unavailable. A stale answer costs one more hop: the writer asked names the holder."""

    __slots__ = ("_away", "_clock", "_holders", "away_s", "max_rooms", "writers")

    def __init__(
        self,
        writers: Sequence[str],
        clock: Callable[[], float],
        away_s: float = 5.0,
        max_rooms: int = 100_000,
    ) -> None:
        self.writers = list(writers)
        self._clock = clock
        self.away_s = away_s
        self.max_rooms = max_rooms
        self._holders: OrderedDict[str, str] = OrderedDict()
        self._away: dict[str, float] = {}

    def owner(self, room_id: str) -> str:
        now = self._clock()
        holder = self._holders.get(room_id)
        if holder is not None and not self._is_away(holder, now):
            return holder
        present = [w for w in self.writers if not self._is_away(w, now)]
        return writer_for_room(room_id, present or self.writers)

    def learned(self, room_id: str, holder: str) -> None:
        self._holders[room_id] = holder
        self._holders.move_to_end(room_id)
        if len(self._holders) > self.max_rooms:
            self._holders.popitem(last=False)
        self._away.pop(holder, None)

    def unavailable(self, writer: str) -> None:
        """`writer` could not take a write (stopping, restarting): route around it for a while."""
        self._away[writer] = self._clock() + self.away_s

    def _is_away(self, writer: str, now: float) -> bool:
        until = self._away.get(writer)
        if until is None:
            return False
        if until <= now:
            del self._away[writer]
            return False
        return True
