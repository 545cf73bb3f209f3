"""Which persister writes a room now: a lease row per room with an epoch, held while the holder's
instance lease lives (`workers.instance_lease`), the same fencing as the instance name.

`room_leases` holds (room_id, writer, epoch, released). A persister writes a room only while it
holds the room's lease under the epoch it took:
* `hold(room)` before a write: take the lease when the room has none, was released, is held under
  this name already (a new process of the same name fences the old one), or its holder's instance
  lease ended (crashed, frozen, cut off). A take raises the epoch, a key column (unique index on
  (room_id, epoch)), so it waits for the old holder's writes in flight and fences later ones.
  Held by another live writer: `NotRoomOwner` naming it (the caller goes there).
  While workers of the previous release run (`workers.previous_release`), only the writer a room
  hashes to takes it (`hashed_writer`); another answers `RoomMoving`, as they route by the hash.
* After a take from another writer, the new holder waits (bounded) until its own view of that
  writer covers the room's last event. Readers then get the old holder's last events before the
  new holder's first (Redis delivers to each subscriber in publish order), so a room's events
  stay in stream order for every reader; the rooms' rules are checked on caches that already
  applied them. Not covered within the bound (the old holder crashed before it announced its last
  write): `RoomMoving`, and the room stays unwritable until it is.
* `check(conn, rooms)`, inside the write's own transaction, reads the batch's rooms `FOR KEY SHARE`
  and fails (`RoomLeaseLost`) unless every one is still held under its epoch; a take waits for it.
* `release_all()` on a planned stop, once the persister drained and no commit outcome is left
  unknown: every held room is marked released (epoch unchanged: nothing of ours is in flight), and
  the next write to it, on another writer, takes it.
* `release(moves)` after a change of the writers (`workers.reload`): the rooms whose stable choice
  is now another live writer are handed to it the same way, once their admitted writes finished;
  a stale-routed write to one is answered `NotRoomOwner` naming that writer, not taken back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import asyncpg

from workers.errors import PersisterError, WorkerError
from workers.handlers.notifier import Notifier
from workers.handlers.visibility import WriterPositions, wait_visible
from workers.instance_lease import Fence
from workers.storage import Conn
from workers.storage.events import Guard

log = logging.getLogger(__name__)
#: The longest one write waits here to see the room's last event (its caller may try again).
SEEN_WAIT_S = 2.0

_TAKE = """
INSERT INTO room_leases AS r (room_id, writer, epoch, released) VALUES ($1, $2, 1, false)
ON CONFLICT (room_id) DO UPDATE SET writer = $2, epoch = r.epoch + 1, released = false
WHERE r.released OR r.writer = $2 OR NOT EXISTS (
    SELECT 1 FROM instance_leases i WHERE i.lease_key = $3 || r.writer AND i.expires_at > now()
)
RETURNING r.epoch
"""
_HOLDER = "SELECT writer FROM room_leases WHERE room_id = $1"
_LAST_EVENT = (
    "SELECT instance_name, stream_ordering FROM events WHERE room_id = $1 AND stream_ordering > 0"
    " ORDER BY stream_ordering DESC LIMIT 1"
)
_CHECK = (
    "SELECT room_id, epoch FROM room_leases WHERE room_id = ANY($1::text[]) AND writer = $2"
    " AND NOT released FOR KEY SHARE"
)
#: `_CHECK` ($3, $4) and the instance lease's check (`Fence.CHECK`: $1, $2) in one round trip: the
#: instance epoch on every row, and one row with no room when none is held.
_CHECK_FENCED = f"""
WITH me AS ({Fence.CHECK}), held AS ({_CHECK.replace("$1", "$3").replace("$2", "$4")})
SELECT (SELECT epoch FROM me) AS instance_epoch, held.room_id, held.epoch
FROM (SELECT 1) AS one LEFT JOIN held ON true
"""
_RELEASE = "UPDATE room_leases SET released = true WHERE writer = $1 AND NOT released"
_RELEASE_ROOMS = _RELEASE + " AND room_id = ANY($2::text[])"
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


class NotRoomOwner(WorkerError):
    """Another live writer holds the room: send the write to `holder`."""

    def __init__(self, room_id: str, holder: str) -> None:
        super().__init__(f"{room_id} is written by {holder}")
        self.room_id = room_id
        self.holder = holder


class RoomMoving(PersisterError):
    """The room was just taken from another writer whose last write this one has not seen yet;
    nothing was done (try again shortly)."""


class RoomLeaseLost(PersisterError):
    """A room of the batch was taken by another writer: the batch did not commit."""


class RoomLeases:
    """The rooms this persister holds (`held`: room -> epoch), and how it takes, checks and
    releases them. `prefix` is the instance leases' key prefix (`<channel_prefix>/`)."""

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
        self._pool = pool
        self.name = instance_name
        self._prefix = prefix
        self._positions = positions
        self._notifier = notifier
        self.hears = hears
        self._wait_s = wait_s
        self.held: dict[str, int] = {}
        #: Set by `release_all`: this persister stops, it takes no more rooms.
        self.closed = False
        self._taking: dict[str, asyncio.Lock] = {}
        self.taken_from_others = 0
        #: The room's writer by the stable hash when only it may take the room (workers of the
        #: previous release run and route by it), else None (`workers.previous_release`).
        self.hashed_writer: Callable[[str], str | None] = lambda _room: None
        #: Rooms `release` handed to another writer (their stable choice now): room -> writer.
        self.moved: dict[str, str] = {}

    async def hold(self, room_id: str) -> None:
        """Return once this writer holds `room_id` and has seen its last event; raises
        `NotRoomOwner` or `RoomMoving`."""
        moved_to = self.moved.get(room_id)
        if moved_to is not None:  # handed on by `release` and not taken there yet: follow it
            if self.hears(moved_to):
                async with self._pool.acquire() as conn:
                    if await conn.fetchval(_HOLDER, room_id) == self.name:
                        raise NotRoomOwner(room_id, moved_to)
            del self.moved[room_id]
        if room_id in self.held:
            return
        if self.closed:
            raise RoomMoving(f"{self.name} stops: {room_id} is written elsewhere now")
        hashed = self.hashed_writer(room_id)
        if hashed not in (None, self.name):
            raise RoomMoving(f"{room_id} is written by {hashed} while workers of the previous release run")
        lock = self._taking.setdefault(room_id, asyncio.Lock())
        try:
            async with lock:
                if room_id not in self.held:
                    await self._take(room_id)
        finally:
            if not lock.locked():
                self._taking.pop(room_id, None)

    async def _take(self, room_id: str) -> None:
        async with self._pool.acquire() as conn:
            epoch = await conn.fetchval(_TAKE, room_id, self.name, self._prefix)
            if epoch is None:
                holder = await conn.fetchval(_HOLDER, room_id)
                raise NotRoomOwner(room_id, str(holder))
            last = await conn.fetchrow(_LAST_EVENT, room_id)
        if last is not None and last["instance_name"] != self.name:
            writer, ordering = last["instance_name"], last["stream_ordering"]
            if not await wait_visible(
                self._positions, writer, ordering, self._notifier, self.hears, min(self._wait_s, SEEN_WAIT_S)
            ):
                raise RoomMoving(f"{room_id} moves here from {writer}, whose last write is not seen yet")
            self.taken_from_others += 1
            log.info("room lease taken room=%s from=%s epoch=%d", room_id, writer, epoch)
        self.held[room_id] = int(epoch)

    async def check(self, conn: Conn, rooms: Collection[str], fence: Fence | None = None) -> None:
        """Inside the write's transaction: raise `RoomLeaseLost` unless every room is still held
        under its epoch (until the transaction ends, a take of any of them waits); with `fence`,
        in the same statement, `LeaseLost` unless this process still holds its instance name."""
        if fence is None:
            rows = await conn.fetch(_CHECK, list(rooms), self.name)
        else:
            rows = await conn.fetch(_CHECK_FENCED, fence.key, fence.idle_ms, list(rooms), self.name)
            fence.compare(rows[0]["instance_epoch"])
        found = {r["room_id"]: r["epoch"] for r in rows}
        lost = [room for room in rooms if room not in self.held or found.get(room) != self.held[room]]
        if lost:
            for room in lost:
                self.held.pop(room, None)
            raise RoomLeaseLost(f"room lease of {', '.join(sorted(lost))} is no longer held here")

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
        """`check` as a condition of the write's own statement (`insert_event_rows_if`), or None
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

    async def release_all(self) -> None:
        """Mark every room held under this name released: the next write takes it elsewhere."""
        self.closed = True
        async with self._pool.acquire() as conn:
            status = await conn.execute(_RELEASE, self.name)
        self.held.clear()
        log.info("room leases released instance=%s rooms=%s", self.name, status.rpartition(" ")[2])


def holder_of(body: dict[str, Any]) -> str | None:
    """The holder a `NotRoomOwner` answer names (`workers.http.errors`), if any."""
    holder = body.get("holder")
    return holder if isinstance(holder, str) else None
