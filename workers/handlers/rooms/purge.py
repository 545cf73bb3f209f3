"""A room's end on its writer: the purge an admin asks for, and the clean-up after the last local
member left.

Both run on the room's writer (`workers.routing`), the one process that persists the room's events,
so they take the room's write path instead of a database lock: `RoomGate` refuses new writes to a
room being purged and waits for the writes already admitted, so no send, join or create lands
half in the purged room. Every other worker learns of the end by a caches-stream row written in
the same transaction (`CacheRows`): it drops what it keeps of the room (`SyncCaches.on_invalidations`)
at once, or by catch-up from the database if the row's RDATA was lost.

The purge, in order: each local user still joined, invited or knocking leaves (their own leave
event, persisted like any other, so every worker and client sees it); then one transaction deletes
the room (`workers.storage.purge.purge_room`) and writes the caches rows. A failure before that
transaction leaves the room whole (the leaves stay: a repeated purge skips those users).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg

from idgen.multi_writer import DATABASE_ERRORS
from workers.handlers.caches.lru import CacheRows
from workers.handlers.placement.forwarding import OwnerUnavailable
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.rules import BadEvent, Forbidden, new_event_id
from workers.model import (
    MEMBER_EVENT,
    MEMBERS_PER_INVALIDATION,
    ROOM_EMPTIED_CACHE,
    ROOM_PURGED_CACHE,
    NewEvent,
)
from workers.storage import purge as store
from workers.storage import room_deletions as deletions

log = logging.getLogger(__name__)


class RoomGate:
    """Per room: writes admitted now, and whether a purge holds the room. A purge waits for the
    admitted writes to finish and admits none until it is done."""

    def __init__(self) -> None:
        self._writing: dict[str, int] = {}
        self._purging: dict[str, asyncio.Event] = {}

    @contextlib.contextmanager
    def write(self, room_id: str) -> Iterator[None]:
        """Admit one write to `room_id`; Forbidden while the room is being purged."""
        if room_id in self._purging:
            raise Forbidden(f"{room_id} is being purged")
        self._writing[room_id] = self._writing.get(room_id, 0) + 1
        try:
            yield
        finally:
            left = self._writing[room_id] - 1
            if left:
                self._writing[room_id] = left
            else:
                del self._writing[room_id]
                idle = self._purging.get(room_id)
                if idle is not None:
                    idle.set()

    def writing(self, room_id: str) -> bool:
        """Whether writes to `room_id` are admitted and not finished."""
        return room_id in self._writing

    @contextlib.asynccontextmanager
    async def exclusive(self, room_id: str) -> AsyncIterator[None]:
        """Hold `room_id` for a purge: no new writes; wait for those admitted. One purge at a time."""
        if room_id in self._purging:
            raise Forbidden(f"{room_id} is being purged already")
        idle = self._purging[room_id] = asyncio.Event()
        try:
            if room_id in self._writing:
                await idle.wait()
            yield
        finally:
            del self._purging[room_id]


@dataclass(frozen=True, slots=True)
class PurgeOptions:
    """What the admin asked for (Synapse's delete-room body, the parts that apply here)."""

    block: bool
    purge: bool
    requested_by: str
    #: The version 2 task this purge runs for (its status is kept in `room_deletions`).
    delete_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"block": self.block, "purge": self.purge, "requested_by": self.requested_by}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PurgeOptions:
        """ValueError unless `body` is what `to_json` makes."""
        block, purge, by = body.get("block"), body.get("purge"), body.get("requested_by")
        if not isinstance(block, bool) or not isinstance(purge, bool) or not isinstance(by, str):
            raise ValueError("a purge needs block, purge (booleans) and requested_by (a user id)")
        return cls(block, purge, by)


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """Synapse's delete-room answer: the users who left, those whose leave failed (always empty:
    the leaves are one batch, and a failed batch fails the purge), the aliases removed, and the
    room they were moved to (none: this server does not create a replacement room)."""

    kicked_users: list[str]
    failed_to_kick_users: list[str]
    local_aliases: list[str]
    new_room_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kicked_users": self.kicked_users,
            "failed_to_kick_users": self.failed_to_kick_users,
            "local_aliases": self.local_aliases,
            "new_room_id": self.new_room_id,
        }

    @classmethod
    def from_json(cls, owner: str, body: dict[str, Any]) -> PurgeResult:
        """The owner's answer; OwnerUnavailable when it is not one."""
        lists = [body.get(k) for k in ("kicked_users", "failed_to_kick_users", "local_aliases")]
        checked = [v for v in lists if isinstance(v, list) and all(isinstance(x, str) for x in v)]
        if len(checked) != len(lists):
            raise OwnerUnavailable(owner, "answered a purge without its three lists of names")
        kicked, failed, aliases = checked
        return cls(kicked, failed, aliases)


class RoomEnd:
    """The purge and the last-member clean-up of the rooms this worker writes."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        server_name: str,
        persister: EventPersister,
        cache_rows: CacheRows,
        gate: RoomGate,
    ) -> None:
        self._pool = pool
        self._server = server_name
        self._persister = persister
        self._cache_rows = cache_rows
        self.gate = gate
        self.purges = 0
        self.cleanups = 0
        self.cleanup_failures = 0

    async def purge(self, room_id: str, options: PurgeOptions) -> PurgeResult:
        """Remove the room's local members; with `block`, refuse joins, invites and knocks from
        now on; with `purge`, then delete the room (see the module docstring). An unknown room
        can only be blocked: without `block`, BadEvent."""
        block, purge, requested_by = options.block, options.purge, options.requested_by
        async with self.gate.exclusive(room_id):
            async with self._pool.acquire() as conn:
                known = await store.room_known(conn, room_id)
                members = await store.present_members(conn, room_id, self._server)
            if not known and not block:
                raise BadEvent(f"{room_id} is not known here; only block=true applies to an unknown room")
            leaves = [
                NewEvent(new_event_id(), room_id, MEMBER_EVENT, user, {"membership": "leave"}, user)
                for user in members
            ]
            if leaves:
                await self._persister.persist_many(leaves)
            if options.delete_id is not None:
                async with self._pool.acquire() as conn:
                    await deletions.update(
                        conn, options.delete_id, "purging", result=PurgeResult(members, [], []).to_json()
                    )
            async with self._pool.acquire() as conn:
                former = await store.all_members(conn, room_id)
            step = MEMBERS_PER_INVALIDATION
            chunks = [former[i : i + step] for i in range(0, len(former), step)] or [[]]
            aliases: list[str] = []
            deleted = 0
            async with contextlib.AsyncExitStack() as stack:
                rows = [await stack.enter_async_context(self._cache_rows.reserve()) for _ in chunks]
                async with self._pool.acquire() as conn, conn.transaction():
                    if block:
                        await store.block_room(conn, room_id, requested_by)
                    if purge:
                        purged = await store.purge_room(conn, room_id)
                        aliases, deleted = purged.local_aliases, purged.events_deleted
                    for row, chunk in zip(rows, chunks, strict=True):
                        await row.write(conn, ROOM_PURGED_CACHE, [room_id, *chunk])
                    result = PurgeResult(members, [], aliases)
                    if options.delete_id is not None:
                        await deletions.update(conn, options.delete_id, "complete", result=result.to_json())
        self.purges += 1
        log.info(
            "room deleted room=%s block=%s purge=%s left=%d events_deleted=%d aliases=%d by=%s",
            room_id, block, purge, len(members), deleted, len(aliases), requested_by,
        )  # fmt: skip
        return result

    async def after_leave(self, room_id: str) -> bool:
        """A member left or was removed: when no local user is joined, invited or knocking any
        more (the current-membership table says so), every worker drops what it keeps of the room.
        True when it did. A join racing this clean-up only costs its room a cache reload. Never
        raises for the database: the leave is done, a clean-up that fails is logged and counted
        (the caches stay bounded, and correct: only the clean-up's memory saving is lost)."""
        try:
            return await self._clean_up(room_id)
        except DATABASE_ERRORS as e:
            self.cleanup_failures += 1
            log.warning("room clean-up failed room=%s: %s: %s", room_id, type(e).__name__, e)
            return False

    async def _clean_up(self, room_id: str) -> bool:
        async with self._pool.acquire() as conn:
            if await store.any_local_member(conn, room_id, self._server):
                return False
        async with self._cache_rows.reserve() as pending, self._pool.acquire() as conn, conn.transaction():
            if await store.any_local_member(conn, room_id, self._server):
                return False
            await pending.write(conn, ROOM_EMPTIED_CACHE, [room_id])
        self.cleanups += 1
        log.info("room emptied of local members room=%s: its caches dropped on every worker", room_id)
        return True
