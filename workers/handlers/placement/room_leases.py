"""Which persister writes a room now: the rooms' kind of key lease (`workers.handlers.placement.leases`,
which says how a lease is taken, checked, fenced and released), in `room_leases`.

A room's last row is its last event. After a take from another persister, the new holder makes
that event's position true for everyone and records the hand-over (`KeyLeases._taken_from`, in
`room_handovers`); its events of the room carry it (`after`, on the live row and on the row
catch-ups read back, `workers.streams.events`), so every reader applies the old writer's rows up
to there before the new writer's first event of the room, whether either came live or from the
database. The new holder forgets what it cached of the room (`on_taken`): the rules are checked on
its state read afresh. The persister checks its batch's rooms with its instance lease in the batch's own
transaction (`check`), or inside the batch's one INSERT (`guard`); a planned stop releases them
once the persister drained and no commit outcome is left unknown (`release_all`).

`release(moves)` after a change of the writers (`workers.assembly.reload`): the rooms whose stable choice
is now another live writer are handed to it the same way, once their admitted writes finished; a
stale-routed write to one is answered `NotRoomOwner` naming that writer, not taken back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping

import asyncpg

from workers.errors import PersisterError
from workers.handlers.notify.notifier import Notifier
from workers.handlers.notify.visibility import WriterPositions
from workers.handlers.placement.leases import (
    KeyLeaseLost,
    KeyLeases,
    KeyMoving,
    LeaseTable,
    NotOwner,
    holder_of,
)
from workers.process.instance_lease import Fence
from workers.storage import Conn
from workers.storage.events import Guard
from workers.storage.handovers import RECORD_ROOM

__all__ = ["NotRoomOwner", "RoomLeaseLost", "RoomLeases", "RoomMoving", "holder_of"]

ROOMS = LeaseTable("room_leases", "room_id", handovers=RECORD_ROOM)
_LAST_EVENT = (
    "SELECT instance_name, stream_ordering AS stream_id FROM events WHERE room_id = $1"
    " AND stream_ordering > 0 ORDER BY stream_ordering DESC LIMIT 1"
)
_RELEASE_ROOMS = ROOMS.release + " AND room_id = ANY($2::text[])"
#: `check`'s test as one condition for the write's own statement (`Guard`, from $10): every room
#: held here under its epoch ($10 rooms, $11 epochs, $12 this writer, $13 how many) and, with
#: `_FENCE_HELD`, the instance lease under its epoch ($14 key, $15 epoch); the rows stay locked
#: FOR KEY SHARE until the statement commits, as `check`'s do until COMMIT.
_ROOMS_HELD = (
    "(SELECT count(*) FROM (SELECT 1 FROM room_leases WHERE (room_id, epoch) IN"
    " (SELECT * FROM unnest($10::text[], $11::bigint[])) AND writer = $12 AND NOT released"
    " FOR KEY SHARE) AS held) = $13"
)
_FENCE_HELD = " AND (SELECT epoch FROM instance_leases WHERE lease_key = $14 FOR KEY SHARE) = $15"


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
        #: Rooms `release` handed to another writer (their stable choice now): room -> writer.
        self.moved: dict[str, str] = {}

    async def hold(self, key: str) -> None:
        """Return once this writer holds the room `key` and has seen its last event; raises
        `NotRoomOwner` or `RoomMoving`."""
        moved_to = self.moved.get(key)
        if moved_to is not None:  # handed on by `release` and not taken there yet: follow it
            if self.hears(moved_to):
                async with self._pool.acquire() as conn:
                    if await conn.fetchval(ROOMS.holder, key) == self.name:
                        raise NotRoomOwner(key, moved_to)
            self.moved.pop(key, None)  # a concurrent write to the room may have dropped it first
        await super().hold(key)

    async def release(self, moves: Mapping[str, str], busy: Callable[[str], bool], wait_s: float) -> int:
        """Hand held rooms to the writers `moves` names (room -> writer, each room's stable choice
        after a change of the writers): from now on a write to one is answered `NotRoomOwner`
        naming its writer, the writes already admitted finish (`busy(room)` until then, for at
        most `wait_s`; one still running after that fails its lease check), then the rooms are
        marked released (epoch unchanged) for the new writer's first write to take. Returns how
        many were released."""
        rooms = [room for room in moves if room in self.held]
        self.moved.update((room, moves[room]) for room in rooms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while any(busy(room) for room in rooms) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        async with self._pool.acquire() as conn:
            await conn.execute(_RELEASE_ROOMS, self.name, rooms)
        for room in rooms:
            self.held.pop(room, None)
        return len(rooms)

    def guard(self, rooms: Collection[str], fence: Fence | None = None) -> Guard | None:
        """`check` as a condition of the write's own statement (`event_rows_statement`), or None
        when a room is not held here (the write cannot commit: `check` says why)."""
        held = self.held
        if any(room not in held for room in rooms):
            return None
        names = list(rooms)
        args: tuple[object, ...] = (names, [held[room] for room in names], self.name, len(names))
        if fence is None:
            return Guard(_ROOMS_HELD, args)
        return Guard(_ROOMS_HELD + _FENCE_HELD, (*args, fence.key, fence.epoch))

    async def why_not_held(
        self, conn: Conn, rooms: Collection[str], fence: Fence | None = None
    ) -> PersisterError:
        """After a guarded write wrote nothing: the error `check` raises now (it forgets the lost
        rooms), or `RoomLeaseLost` when the leases changed back meanwhile."""
        try:
            async with conn.transaction():
                await self.check(conn, rooms, fence)
        except PersisterError as e:
            return e
        return RoomLeaseLost(f"room lease of {', '.join(sorted(rooms))} changed while writing")
