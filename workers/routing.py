"""Which writer owns a room, or a user's data: every write of one key goes through one writer.

For rooms that is what makes per-writer tokens enough for visibility: when a reader's token covers
an event of writer W, it covers every earlier event of that room too (W's position only passes
finished IDs), so a membership change can never land "behind" an event a reader already got. For
the user-keyed streams (account data, device lists, to-device) it keeps one user's changes in the
order they were made, while the writers share the users between them.

A key's writer may change while the cluster runs (a writer stops, a room's or a user's lease
moves, `workers.handlers.placement.leases`): `RoomPlacement` follows the current holder, with the stable
choice as the starting guess.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass


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
    """Where a room's writes go now (rooms are held as leases, `workers.handlers.placement.room_leases`), or
    a stored stream's key's (`choose` its stable choice, `workers.handlers.placement.stream_writes`):
    the holder this worker last learned (from a write's answer or a writer naming the holder),
    unless that writer was found unavailable lately; else the stable choice among the writers not
    found unavailable. A stale answer costs one more hop: the writer asked names the holder.
    While `by_hash()` (workers of the previous release run), only the stable choice among all
    the writers, as they route."""

    __slots__ = ("_away", "_choose", "_clock", "_holders", "away_s", "by_hash", "max_rooms", "writers")

    def __init__(
        self,
        writers: Sequence[str],
        clock: Callable[[], float],
        away_s: float = 5.0,
        max_rooms: int = 100_000,
        choose: Callable[[str, Sequence[str]], str] = writer_for_room,
    ) -> None:
        self.writers = list(writers)
        self._choose = choose
        self._clock = clock
        self.away_s = away_s
        self.max_rooms = max_rooms
        self._holders: OrderedDict[str, str] = OrderedDict()
        self._away: dict[str, float] = {}
        self.by_hash: Callable[[], bool] = lambda: False

    def owner(self, room_id: str) -> str:
        if self.by_hash():
            return self._choose(room_id, self.writers)
        now = self._clock()
        holder = self._holders.get(room_id)
        if holder is not None and not self._is_away(holder, now):
            return holder
        present = [w for w in self.writers if not self._is_away(w, now)]
        return self._choose(room_id, present or self.writers)

    def learned(self, room_id: str, holder: str) -> None:
        self._holders[room_id] = holder
        self._holders.move_to_end(room_id)
        if len(self._holders) > self.max_rooms:
            self._holders.popitem(last=False)
        self._away.pop(holder, None)

    def set_writers(self, writers: Sequence[str]) -> None:
        """The events writers changed (a config reload): the stable choice is over `writers` now,
        and a holder learned that is no longer one of them is forgotten."""
        self.writers = list(writers)
        kept = set(writers)
        for room_id in [r for r, holder in self._holders.items() if holder not in kept]:
            del self._holders[room_id]

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


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """What changing the events writers from `old` to `new` moves (`fanout writers plan`)."""

    old: tuple[str, ...]
    new: tuple[str, ...]
    #: (room, holder, new writer): held rooms whose stable choice over `new` is another writer;
    #: the reload hands each to it (a writer that leaves releases all of its rooms).
    rooms_moving: tuple[tuple[str, str, str], ...]
    #: (room, old writer, new writer): rooms not yet written since leases exist, whose first
    #: writer changes.
    unleased_moving: tuple[tuple[str, str, str], ...]
    #: (stream, key, holder): users (rooms, for receipts) whose stored-stream writes are held by a
    #: writer that leaves, when those streams follow the events writers; they move when it stops.
    keys_moving: tuple[tuple[str, str, str], ...]
    #: (user, old writer, new writer): users without a stored-stream lease whose first writer
    #: changes, when those streams follow the events writers (no `stream_writers.<stream>`).
    users_moving: tuple[tuple[str, str, str], ...]

    @property
    def added(self) -> list[str]:
        return [w for w in self.new if w not in self.old]

    @property
    def removed(self) -> list[str]:
        return [w for w in self.old if w not in self.new]


def plan_writers(
    old: Sequence[str],
    new: Sequence[str],
    holders: Mapping[str, str],
    unleased_rooms: Iterable[str],
    users: Iterable[str],
    key_holders: Mapping[tuple[str, str], str] | None = None,
) -> WriterPlan:
    """What moves when the events writers change from `old` to `new`: `holders` are the rooms'
    current lease holders (released rooms left out), `unleased_rooms` the rooms without a lease,
    `users` the users without a stored-stream lease, `key_holders` the stored streams' held keys
    ((stream, key) -> holder)."""
    if not old or not new:
        raise ValueError("a writer list must name at least one writer")
    leaving = set(old) - set(new)
    return WriterPlan(
        tuple(old),
        tuple(new),
        tuple(
            (room, holder, to)
            for room, holder in sorted(holders.items())
            if (to := writer_for_room(room, new)) != holder
        ),
        tuple(
            (room, a, b)
            for room in sorted(unleased_rooms)
            if (a := writer_for_room(room, old)) != (b := writer_for_room(room, new))
        ),
        tuple(sorted((*key, holder) for key, holder in (key_holders or {}).items() if holder in leaving)),
        tuple(
            (user, a, b)
            for user in sorted(users)
            if (a := writer_for_user(user, old, "stored")) != (b := writer_for_user(user, new, "stored"))
        ),
    )
