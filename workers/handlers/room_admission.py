"""Which writes of one room may be checked against the room's rules now: a per-room, FIFO-fair
reader/writer admission on the room's writer.

The rules (`workers.handlers.rooms.check`) read the room's state as the room's previous accepted
event left it. An event that changes what they read (any state event, and a redaction, which may
prune a rule) is admitted *exclusively*: it holds the room from its check until its batch has
committed and the views forgot what it changed (or until it failed), so the next event of the room
is checked against the state it left, as Synapse's per-room `member_linearizer` does. Every other
event (a message) is admitted *shared*: messages of a room are checked concurrently and batched
together; they too hold the room until their batch is done, so a state event is checked only once
every message admitted before it is stored or failed, whatever order a persister's retry paths
give them.

Guarantees:
* FIFO-fair: a request never overtakes one of the same room that waits before it (a message that
  arrives after a waiting state event waits behind it), so neither kind starves.
* Bounded: at most `max_waiting` requests wait per room; the next one is refused with
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
from dataclasses import dataclass, field
from typing import Any

from workers.errors import PersisterError

#: Requests that may wait for one room at once, beyond which a write is refused (503).
MAX_WAITING = 2_000


class AdmissionFull(PersisterError):
    """Too many writes wait for this room: retry later (HTTP 503)."""


@dataclass(slots=True)
class _Room:
    shared: int = 0
    exclusive: bool = False
    waiting: collections.deque[tuple[bool, asyncio.Future[None]]] = field(default_factory=collections.deque)

    def may_enter(self, exclusive: bool) -> bool:
        return not self.exclusive and (not exclusive or not self.shared)

    @property
    def idle(self) -> bool:
        return not self.shared and not self.exclusive and not self.waiting


class Ticket:
    """One admitted write of a room. `release` (idempotent) lets the next ones in; after
    `release_after(future)` the ticket belongs to that future and `release` does nothing."""

    __slots__ = ("_admission", "_handed", "_released", "exclusive", "room_id")

    def __init__(self, admission: RoomAdmission, room_id: str, exclusive: bool) -> None:
        self._admission = admission
        self.room_id = room_id
        self.exclusive = exclusive
        self._released = False
        self._handed = False

    def release(self) -> None:
        if self._released or self._handed:
            return
        self._released = True
        self._admission._leave(self.room_id, self.exclusive)

    def release_after(self, future: asyncio.Future[Any]) -> None:
        """Hold the room until `future` is done (its batch committed or failed), then release."""
        self._handed = True

        def done(_: object) -> None:
            self._handed = False
            self.release()

        future.add_done_callback(done)


class RoomAdmission:
    """Per room: how many shared writes are admitted, whether an exclusive one is, and who waits."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._rooms: dict[str, _Room] = {}
        self._max_waiting = max_waiting
        #: Requests that had to wait for their room, and those refused because too many waited.
        self.waits = 0
        self.refused = 0

    async def enter(self, room_id: str, *, exclusive: bool) -> Ticket:
        """Wait (FIFO) until `room_id` admits this write; its ticket. Raises AdmissionFull."""
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = _Room()
        if not room.waiting and room.may_enter(exclusive):
            self._admit(room, exclusive)
            return Ticket(self, room_id, exclusive)
        if len(room.waiting) >= self._max_waiting:
            self.refused += 1
            raise AdmissionFull(f"{len(room.waiting)} writes wait for {room_id}")
        self.waits += 1
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (exclusive, turn)
        room.waiting.append(entry)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # admitted as it was cancelled: hand it on
                self._leave(room_id, exclusive)
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                    room.waiting.remove(entry)
                self._wake(room_id, room)
            raise
        return Ticket(self, room_id, exclusive)

    def holds(self, room_id: str) -> bool:
        """Whether a write of `room_id` is admitted or waiting."""
        return room_id in self._rooms

    def __len__(self) -> int:
        return len(self._rooms)

    @staticmethod
    def _admit(room: _Room, exclusive: bool) -> None:
        if exclusive:
            room.exclusive = True
        else:
            room.shared += 1

    def _leave(self, room_id: str, exclusive: bool) -> None:
        room = self._rooms[room_id]
        if exclusive:
            room.exclusive = False
        else:
            room.shared -= 1
        self._wake(room_id, room)

    def _wake(self, room_id: str, room: _Room) -> None:
        """Admit the waiters at the head of the line that may enter now, in order."""
        waiting = room.waiting
        while waiting and room.may_enter(waiting[0][0]):
            exclusive, turn = waiting.popleft()
            if turn.done():  # cancelled, its request not yet resumed to say so
                continue
            self._admit(room, exclusive)
            turn.set_result(None)
        if room.idle and self._rooms.get(room_id) is room:
            del self._rooms[room_id]
