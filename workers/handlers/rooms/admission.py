"""Which writes of one room may be checked against the room's rules now: a per-room, FIFO-fair
admission on the room's writer, by what each write reads and changes of the rules' state.

The rules (`workers.handlers.rooms.rules.check`) read the room's state as the room's previous accepted
event left it. Each write states a `Claim`: the parts of that state its check reads (the room's
rules: create, join rules, power levels; and members' memberships, by user) and the parts it may
change. A write that changes a part is admitted only when no admitted write reads or changes it,
and it holds the part from its check until its batch has committed and the views forgot what it
changed (or until it failed); a write that reads a part waits for an admitted change of it. So
every event is checked against the state the room's previous conflicting event left, as Synapse's
per-room `member_linearizer` serializes membership, while writes that cannot affect each other's
check run together:
* messages and other state (a topic) only read: they are checked together and batched together;
* a membership change holds only its target's membership, so one stuck in the database (its batch
  waiting on a lock) holds up that user's writes, not the room's other senders;
* a change of the room's rules (power levels, join rules, a redaction, which may prune one) holds
  the whole room's rules, so it waits for and holds up every write of the room;
* a room's first events (createRoom) and a remote invite hold the whole room.
A message holds what it read until its batch is done too, so a change is checked only once every
write admitted before it that reads what it changes is stored or failed, whatever order a
persister's retry paths give them.

Guarantees:
* FIFO-fair: a write never overtakes an earlier waiting write of the same room that conflicts with
  it (a message that arrives after a waiting change of its sender's membership waits behind it),
  so nothing starves; one that does not conflict with any earlier one does not wait for them.
* Bounded: at most `max_waiting` writes wait per room; the next one is refused with
  `AdmissionFull` (a 503: the client retries).
* No leak: a `Ticket` is released exactly once, when its request fails, when its persist future
  completes (`release_after`, whatever happens to the request that awaited it), or when the
  request is cancelled while it waits. A room with nothing admitted or waiting is forgotten.

Pure bookkeeping with asyncio futures: no I/O, no timers; `RoomWrites` is its only caller.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workers.errors import PersisterError

#: Writes that may wait for one room at once, beyond which a write is refused (503).
MAX_WAITING = 2_000
#: The part of a room's state that holds its rules: create, join rules, power levels.
RULES = "rules"
#: A claim on this part conflicts with every other claim of the room.
WHOLE_ROOM = "*"


def member(user_id: str) -> str:
    """The part of a room's state that holds `user_id`'s membership."""
    return f"member:{user_id}"


class AdmissionFull(PersisterError):
    """Too many writes wait for this room: retry later (HTTP 503)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What one write's check reads of a room's state, and what the write may change."""

    reads: frozenset[str]
    changes: frozenset[str] = frozenset()

    @classmethod
    def whole_room(cls) -> Claim:
        return cls(frozenset(), frozenset({WHOLE_ROOM}))

    def conflicts(self, other: Claim) -> bool:
        if WHOLE_ROOM in self.changes or WHOLE_ROOM in other.changes:
            return True
        return bool(self.changes & (other.reads | other.changes) or other.changes & self.reads)


@dataclass(slots=True)
class _Parts:
    """How many admitted (or waiting) claims read and change each part."""

    reading: Counter[str] = field(default_factory=Counter)
    changing: Counter[str] = field(default_factory=Counter)
    whole: int = 0

    def add(self, claim: Claim, by: int = 1) -> None:
        for part in claim.reads:
            _count(self.reading, part, by)
        for part in claim.changes:
            if part == WHOLE_ROOM:
                self.whole += by
            else:
                _count(self.changing, part, by)

    def blocks(self, claim: Claim) -> bool:
        """Whether a claim counted here conflicts with `claim`."""
        if self.whole:
            return True
        if WHOLE_ROOM in claim.changes:
            return bool(self.reading or self.changing)
        changing, reading = self.changing, self.reading
        return any(p in changing for p in claim.reads) or any(
            p in reading or p in changing for p in claim.changes
        )

    @property
    def empty(self) -> bool:
        return not self.whole and not self.reading and not self.changing


@dataclass(slots=True)
class _Room:
    admitted: _Parts = field(default_factory=_Parts)
    waiting: collections.deque[tuple[Claim, asyncio.Future[None]]] = field(default_factory=collections.deque)

    @property
    def idle(self) -> bool:
        return not self.waiting and self.admitted.empty


class Ticket:
    """One admitted write of a room. `release` (idempotent) lets the next ones in; after
    `release_after(future)` the ticket belongs to that future and `release` does nothing."""

    __slots__ = ("_admission", "_handed", "_released", "claim", "room_id")

    def __init__(self, admission: RoomAdmission, room_id: str, claim: Claim) -> None:
        self._admission = admission
        self.room_id = room_id
        self.claim = claim
        self._released = False
        self._handed = False

    def release(self) -> None:
        if self._released or self._handed:
            return
        self._released = True
        self._admission._leave(self.room_id, self.claim)

    def release_after(self, future: asyncio.Future[Any]) -> asyncio.Future[None]:
        """Hold the claim until `future` is done (its batch committed or failed), then release.
        Returns a waiter done just after that: the request awaits it, not `future`, so that a
        cancelled request cancels only its waiter (what `asyncio.shield` does, without its two
        extra callbacks on every send)."""
        self._handed = True
        waiter: asyncio.Future[None] = future.get_loop().create_future()

        def done(_: object) -> None:
            self._handed = False
            self.release()
            if not waiter.done():
                waiter.set_result(None)
            elif not future.cancelled():
                future.exception()  # the request went away: its outcome counts as retrieved

        future.add_done_callback(done)
        return waiter


class RoomAdmission:
    """Per room: the claims admitted and the writes waiting, in arrival order."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._rooms: dict[str, _Room] = {}
        self._max_waiting = max_waiting
        #: Writes that had to wait for their room, and those refused because too many waited.
        self.waits = 0
        self.refused = 0

    async def enter(self, room_id: str, claim: Claim) -> Ticket:
        """Wait (FIFO among conflicting writes) until `room_id` admits `claim`; its ticket.
        Raises AdmissionFull."""
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = _Room()
        if not room.admitted.blocks(claim) and not _waits_before(room.waiting, claim):
            room.admitted.add(claim)
            return Ticket(self, room_id, claim)
        if len(room.waiting) >= self._max_waiting:
            self.refused += 1
            raise AdmissionFull(f"{len(room.waiting)} writes wait for {room_id}")
        self.waits += 1
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (claim, turn)
        room.waiting.append(entry)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # admitted as it was cancelled: hand it on
                self._leave(room_id, claim)
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                    room.waiting.remove(entry)
                self._wake(room_id, room)
            raise
        return Ticket(self, room_id, claim)

    def holds(self, room_id: str) -> bool:
        """Whether a write of `room_id` is admitted or waiting."""
        return room_id in self._rooms

    def __len__(self) -> int:
        return len(self._rooms)

    def _leave(self, room_id: str, claim: Claim) -> None:
        room = self._rooms[room_id]
        room.admitted.add(claim, -1)
        self._wake(room_id, room)

    def _wake(self, room_id: str, room: _Room) -> None:
        """Admit, in order, every waiter that conflicts neither with an admitted claim nor with
        a waiter before it that stays waiting."""
        still = _Parts()
        kept: collections.deque[tuple[Claim, asyncio.Future[None]]] = collections.deque()
        for claim, turn in room.waiting:
            if turn.done():  # cancelled, its request not yet resumed to say so
                continue
            if room.admitted.blocks(claim) or still.blocks(claim):
                still.add(claim)
                kept.append((claim, turn))
                continue
            room.admitted.add(claim)
            turn.set_result(None)
        room.waiting = kept
        if room.idle and self._rooms.get(room_id) is room:
            del self._rooms[room_id]


def _count(counts: Counter[str], part: str, by: int) -> None:
    """Add `by` to `part`'s count; a part counted by nobody is no key (so `in` tells)."""
    left = counts[part] + by
    if left:
        counts[part] = left
    else:
        del counts[part]


def _waits_before(waiting: collections.deque[tuple[Claim, asyncio.Future[None]]], claim: Claim) -> bool:
    return any(not turn.done() and other.conflicts(claim) for other, turn in waiting)
