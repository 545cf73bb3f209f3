"""Which persister writes a room now: the rooms' kind of key lease (`workers.handlers.leases`,
which says how a lease is taken, checked, fenced and released), in `room_leases`.

A room's last row is its last event: after a take from another persister, the new holder waits
until its own view of that persister covers the room's last event, so a room's events stay in
stream order for every reader and the rooms' rules are checked on caches that already applied
them. The persister checks its batch's rooms (`RoomLeases.check`) with its instance lease in the
batch's own transaction; a planned stop releases them once the persister drained and no commit
outcome is left unknown (`release_all`).
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from workers.handlers.leases import KeyLeaseLost, KeyLeases, KeyMoving, LeaseTable, NotOwner, holder_of
from workers.handlers.notifier import Notifier
from workers.handlers.visibility import WriterPositions

__all__ = ["NotRoomOwner", "RoomLeaseLost", "RoomLeases", "RoomMoving", "holder_of"]

ROOMS = LeaseTable("room_leases", "room_id")
_LAST_EVENT = (
    "SELECT instance_name, stream_ordering AS stream_id FROM events WHERE room_id = $1"
    " AND stream_ordering > 0 ORDER BY stream_ordering DESC LIMIT 1"
)


class NotRoomOwner(NotOwner):
    """Another live writer holds the room: send the write to `holder`."""

    @property
    def room_id(self) -> str:
        return self.key


class RoomMoving(KeyMoving):
    """The room was just taken from another writer whose last write this one has not seen yet;
    nothing was done (try again shortly)."""


class RoomLeaseLost(KeyLeaseLost):
    """A room of the batch was taken by another writer: the batch did not commit."""


class RoomLeases(KeyLeases):
    """The rooms this persister holds (`held`: room -> epoch), and how it takes, checks and
    releases them. `prefix` is the instance leases' key prefix (`<channel_prefix>/`)."""

    not_owner = NotRoomOwner
    moving = RoomMoving
    lost = RoomLeaseLost

    def __init__(
        self,
        pool: asyncpg.Pool,
        instance_name: str,
        prefix: str,
        positions: WriterPositions,
        notifier: Notifier,
        hears: Callable[[str], bool],
        wait_s: float,
    ) -> None:
        super().__init__(
            pool, instance_name, prefix, positions, notifier, hears, wait_s,
            table=ROOMS, last_write=_LAST_EVENT, what="room",
        )  # fmt: skip
